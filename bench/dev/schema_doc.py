"""Generate ``docs/records.md`` from the record's dataclasses (``bench.records.results``), so it cannot drift from the code.

    .venv/bin/python -m bench.dev.schema_doc            # rewrites docs/records.md
    .venv/bin/python -m bench.dev.schema_doc --check    # exit 1 when docs/records.md is out of date (a test runs this)
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing

from bench.core.files import REPO_DIR
from bench.records import results

DOC_PATH = REPO_DIR / "docs" / "records.md"

INTRO = """# Records (`results.jsonl`, schema 2)

*Generated from `bench/records/results.py` by `python -m bench.dev.schema_doc`; do not edit by hand.*

A sweep appends one JSON object per trial to `results.jsonl` and never rewrites it. A record holds what its trial
measured, section by section ([methodology](methodology.md)); a section that did not run is `null`. Units are in the
field names or fixed: seconds, bytes, FLOPs, joules, samples.

## Reading records

`bench.records.reader` checks each record against the tables below and stops at the first bad line with
`file:line: what is wrong`.

```python
from bench.records.reader import load

sweep = load(["reports/example-cpu-bf16"])        # one or more sweep directories
for r in sweep.records:                           # TrialRecord objects
    print(r.trial_id, r.status, r.speed.samples_per_s if r.speed else None)
```

`load` also reads `env.json` and `sweep.toml`, and counts a trial id written twice once (`sweep.notes` says so).
For a pandas frame: `bench.load` ([Python API](api.md)).

Schema-1 records load with their quality dropped: their run's length depended on the set's speed. Fields added
within schema 2 have defaults, so older records load with them empty or `null`.
"""


def _part(hint: typing.Any) -> type | None:
    """The record section a field holds (its dataclass, null or not), or None for a plain value."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate
    return None


def _section(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    doc = (cls.__doc__ or "").strip().replace("\n    ", " ")
    lines = [f"## {cls.__name__}", "", doc, "", "| field | meaning |", "|---|---|"]
    for f in dataclasses.fields(cls):
        text = f.metadata.get("doc", "").replace("|", "\\|")
        part = _part(hints[f.name])
        if part is not None:
            text = f"[{part.__name__}](#{part.__name__.lower()}): {text}"
        lines.append(f"| `{f.name}` | {text} |")
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
              + f"; both are calibrated per reference to {results.PARITY_K_TOL:g} times the drift of a "
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
