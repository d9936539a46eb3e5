"""Combined techniques: does a combination's speedup multiply its parts'? The observed speedup beside the product,
and the paired interaction contrast with its verdict."""

from __future__ import annotations

from bench.report.cells import combination_cell, fmt_ratio, interval, known
from bench.report.document import Cell, FigureRef, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 50


def build(ctx: Context) -> Section | None:
    table = _interactions_table(ctx)
    if table is None:
        return None
    return Section("Combined techniques", "combined", "Combined", [
        Paragraph("Do the gains multiply? Each combination's observed speedup beside the product of its parts' "
                  "speedups, each measured alone on the same workload."), table, FigureRef("interaction")])


def _interactions_table(ctx: Context) -> Table | None:
    analysis = ctx.analysis
    inter = analysis.interactions
    if inter.empty:
        return None
    rows = []
    for it in inter.itertuples():
        parts = ", ".join(f"{p} {fmt_ratio(s)}" for p, s in zip(it.components, it.parts, strict=True))
        observed = fmt_ratio(it.observed)
        ratio = "-"
        if known(it.ratio):
            ratio = f"{it.ratio:.2f}{interval(it.ratio_lo, it.ratio_hi)}"
        rows.append([Cell(ctx.where(it.workload, it.machine)), Cell(it.technique), Cell(parts),
                     Cell(fmt_ratio(it.product)), Cell(observed), Cell(ratio), combination_cell(it.verdict, it.why)])
    return Table(["workload", "combination", "parts alone (speedup)", "product of parts", "observed",
                  "observed / product, paired by seed [95% CI]", "verdict"], rows, wrap=(6,))
