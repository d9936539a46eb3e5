"""Reports people read: ``report.md`` and ``report.html`` (plus ``figures/``) from one or more sweep directories.

    from bench.report import write_report
    paths = write_report(["runs/quick-20260101-120000"])             # writes next to results.jsonl
    paths = write_report([dir_a, dir_b], out_dir="runs/merged")      # two machines, kept apart

The numbers come from ``bench.analyze.analysis`` (computed once); each module of ``sections`` turns them into one
section of text (its cells worded by ``cells``), ``figures`` into PNGs, and ``markdown`` / ``html`` draw the same
sections. A report can always be re-rendered from ``results.jsonl``
(+ ``env.json``) alone: ``python -m bench report DIR``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from bench.analyze import analysis as analysis_mod
from bench.analyze import cost
from bench.analyze.analysis import BASELINE, Analysis, Thresholds
from bench.core.files import write_atomic
from bench.records import reader
from bench.records.reader import InputError
from bench.report import document, figures, html, markdown, sections
from bench.report.document import Report

log = logging.getLogger(__name__)

FORMATS = ("md", "html")


def parse_formats(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"md,html"`` -> ("md", "html"); an unknown format raises ``InputError`` naming the valid ones."""
    items = [f.strip().lower() for f in (text.split(",") if isinstance(text, str) else text) if f.strip()]
    bad = [f for f in items if f not in FORMATS]
    if bad or not items:
        raise InputError(f"unknown report format '{','.join(bad) or text}' (valid formats: {', '.join(FORMATS)})")
    return tuple(dict.fromkeys(items))


def build(dirs: Sequence[Path | str], baseline: str = BASELINE, with_figures: bool = True,
          thresholds: Thresholds | None = None, price: cost.Price | None = None) -> tuple[Analysis, Report]:
    """Analyse the sweeps in ``dirs`` and build the report (figures rendered when asked). ``price`` (per
    machine-hour) overrides the one each sweep recorded in its sweep.toml, for the Cost section."""
    # Bad input stops in the reader (one line naming the file and the line); past it, an exception is a bug of the
    # analysis or the report, and its traceback is what finds it.
    sweep = reader.load(dirs)
    result = analysis_mod.analyze(sweep, baseline=baseline, thresholds=thresholds)
    figs = figures.make_figures(result) if with_figures else {}
    return result, assemble(result, figs, sweep.notes, price)


def assemble(result: Analysis, figs: dict[str, document.Figure] | None = None, input_notes: Sequence[str] = (),
             price: cost.Price | None = None) -> Report:
    """The report of an analysis: its title, the notes on its input, and every section that has something to show
    (``bench.report.sections``)."""
    ctx = sections.Context(result, dict(figs or {}), price)
    sweep = result.sweep
    merge_note = None
    if len(sweep.sources) > 1:
        dirs = ", ".join(s.name for s in sweep.sources)
        if ctx.several:
            merge_note = (f"This report merges {len(sweep.sources)} sweeps ({dirs}) that ran on {len(ctx.names)} "
                          "different machines or software stacks. Their numbers are kept apart: every speedup, "
                          "ratio and difference compares trials on the same machine, and each table says which.")
        else:
            merge_note = (f"This report merges {len(sweep.sources)} sweeps ({dirs}) from the same machine and "
                          "software; their trials are pooled as repeats.")
    frame = result.frame
    return Report(
        title=f"trainbench report: {', '.join(dict.fromkeys(str(s) for s in frame['sweep_id']))}",
        subtitle=(f"{len(frame)} trials, {frame['workload'].nunique()} workloads, "
                  f"{frame['technique'].nunique()} technique sets, reference '{result.baseline}'"),
        merge_note=merge_note, input_notes=list(input_notes), sections=sections.build(ctx), figures=ctx.figures)


def write_report(dirs: Sequence[Path | str], out_dir: Path | str | None = None, baseline: str = BASELINE,
                 formats: Sequence[str] = FORMATS, thresholds: Thresholds | None = None,
                 price: cost.Price | None = None) -> dict[str, Path]:
    """Write ``report.md`` / ``report.html`` and ``figures/*.png`` into ``out_dir`` (default: the only directory).

    Returns the written paths by format. Raises ``InputError`` for unusable input (no results.jsonl, an unknown
    reference set, several directories without ``out_dir``).
    """
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise InputError("no sweep directory given")
    if out_dir is None:
        if len(dirs) > 1:
            raise InputError("several sweep directories need an output directory (--out DIR)")
        out_dir = dirs[0]
    out = Path(out_dir)
    formats = parse_formats(formats)
    blocker = reader.blocking_file(out)
    if blocker is not None:
        raise InputError(f"cannot write the report into {out}: {blocker} is a file, not a directory (--out DIR)")
    _, report = build(dirs, baseline, thresholds=thresholds, price=price)
    try:
        written = _write(report, out, formats)
    except OSError as exc:  # unwritable, a path under a file, a full disk
        raise InputError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    log.info("report written: %s", ", ".join(str(p) for p in written.values()))
    return written


def _write(report: Report, out: Path, formats: Sequence[str]) -> dict[str, Path]:
    """Each file whole or not at all: a reader (a browser reloading, a CI artifact upload) never sees half."""
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if "md" in formats:
        (out / "figures").mkdir(exist_ok=True)
        for fig in report.figures.values():
            write_atomic(out / fig.path, fig.png)
        written["md"] = out / "report.md"
        write_atomic(written["md"], markdown.render(report))
    if "html" in formats:
        written["html"] = out / "report.html"
        write_atomic(written["html"], html.render(report))
    return written


__all__ = ["FORMATS", "InputError", "build", "parse_formats", "write_report"]
