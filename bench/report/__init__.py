"""Reports people read: ``report.md`` and ``report.html`` (plus ``figures/``) from one or more sweep directories.

    from bench.report import write_report
    paths = write_report(["reports/quick-20260101-120000"])          # writes next to results.jsonl
    paths = write_report([dir_a, dir_b], out_dir="reports/merged")   # two machines, kept apart

The numbers come from ``bench.analysis`` (computed once); ``content`` turns them into text cells, ``figures`` into
PNGs, and ``markdown`` / ``html`` draw the same content. A report can always be re-rendered from ``results.jsonl``
(+ ``env.json``) alone: ``python -m bench report DIR``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from bench import analysis as analysis_mod
from bench.analysis import BASELINE, Analysis, InputError, Thresholds
from bench.report import content, figures, html, markdown

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
          thresholds: Thresholds | None = None) -> tuple[Analysis, content.Report]:
    """Analyse the sweeps in ``dirs`` and build the report's content (figures rendered when asked)."""
    result = analysis_mod.analyze(analysis_mod.load(dirs), baseline=baseline, thresholds=thresholds)
    figs = figures.make_figures(result) if with_figures else {}
    return result, content.build(result, figs)


def write_report(dirs: Sequence[Path | str], out_dir: Path | str | None = None, baseline: str = BASELINE,
                 formats: Sequence[str] = FORMATS, thresholds: Thresholds | None = None) -> dict[str, Path]:
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
    _, report = build(dirs, baseline, thresholds=thresholds)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    if "md" in formats:
        fig_dir = out / "figures"
        fig_dir.mkdir(exist_ok=True)
        for fig in report.figures.values():
            (out / fig.path).write_bytes(fig.png)
        written["md"] = out / "report.md"
        written["md"].write_text(markdown.render(report), encoding="utf-8")
    if "html" in formats:
        written["html"] = out / "report.html"
        written["html"].write_text(html.render(report), encoding="utf-8")
    log.info("report written: %s", ", ".join(str(p) for p in written.values()))
    return written


__all__ = ["FORMATS", "InputError", "build", "parse_formats", "write_report"]
