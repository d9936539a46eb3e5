"""Generate ``docs/records.md`` from the record's dataclasses (``bench.records.results``), so it cannot drift from the code.

    .venv/bin/python -m bench.dev.schema_doc            # rewrites docs/records.md
    .venv/bin/python -m bench.dev.schema_doc --check    # exit 1 when docs/records.md is out of date (a test runs this)
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing

from bench.core.files import REPO_DIR
from bench.records import results

DOC_PATH = REPO_DIR / "docs" / "records.md"

INTRO = """# Records (`results.jsonl`, schema 2)

*Generated from `bench/records/results.py` by `python -m bench.dev.schema_doc`; do not edit by hand.*

A sweep appends one JSON object per trial to `results.jsonl`, fsync'd as each trial finishes and never rewritten.
A record is made of the trial's stage results (see [methodology](methodology.md)): what was built, the speed
window, the quality run, parity against the eager fp32 reference, memory and energy. A stage that did not run is
`null` (the record's `mode` or `status` says why). Units are in the field names or fixed: seconds, bytes, FLOPs,
joules, samples.

`bench report` and `bench compare` also read schema-1 records (trainbench before the measurement protocol v2):
their speed and memory sections are kept, their quality is dropped with a note, since their final metric came from
a training run whose length depended on the set's speed.

`bench.records.frame.records_frame` flattens records into a pandas DataFrame, one row per trial.
"""


def _type_name(hint: typing.Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        inner = " or ".join(_type_name(a) for a in args if a is not type(None))
        return f"{inner} or null" if type(None) in args else inner
    if dataclasses.is_dataclass(hint):
        return f"[{hint.__name__}](#{hint.__name__.lower()})"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(hint, "__name__", str(hint)).replace("NoneType", "null")


def _section(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    doc = (cls.__doc__ or "").strip().replace("\n    ", " ")
    lines = [f"## {cls.__name__}", "", doc, "", "| field | type | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        text = f.metadata.get("doc", "").replace("|", "\\|")
        lines.append(f"| `{f.name}` | {_type_name(hints[f.name]).replace('|', chr(92) + '|')} | {text} |")
    return lines + [""]


def _sections(cls: type, seen: list[type]) -> None:
    if cls in seen:
        return
    seen.append(cls)
    for hint in typing.get_type_hints(cls).values():
        for candidate in (hint, *typing.get_args(hint)):
            if dataclasses.is_dataclass(candidate):
                _sections(candidate, seen)


def render() -> str:
    classes: list[type] = []
    _sections(results.TrialRecord, classes)
    lines = [INTRO]
    for cls in classes:
        lines += _section(cls)
    lines += ["## Constants", "",
              f"- statuses: {', '.join(f'`{s}`' for s in results.STATUSES)}",
              f"- modes: {', '.join(f'`{m}`' for m in results.MODES)}",
              "- parity tolerances (loss, parameter distance) by kind: " + "; ".join(
                  f"{kind} {loss:g}, {dist:g}" for kind, (loss, dist) in results.PARITY_TOLERANCES.items())
              + f"; both are calibrated per reference to {results.PARITY_K_TOL:g} x the drift of a "
              "harmless jitter of the initial weights (" + "; ".join(
                  f"{kind}: {name}, scale 2^{math.log2(scale):.0f}" for kind, (name, scale) in results.PARITY_HARMLESS.items())
              + "), never below the values above",
              f"- parity's known bug: the learning rate x {results.PARITY_BUG_LR_FACTOR:g}; answers: "
              + ", ".join(f"`{a}`" for a in results.PARITY_ANSWERS), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv == ["--check"]:
        current = DOC_PATH.read_text() if DOC_PATH.exists() else ""
        if current != text:
            print(f"{DOC_PATH} is out of date: run python -m bench.dev.schema_doc", file=sys.stderr)
            return 1
        return 0
    DOC_PATH.parent.mkdir(exist_ok=True)
    DOC_PATH.write_text(text)
    print(f"wrote {DOC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
