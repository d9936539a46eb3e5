"""Combined techniques: does a combination's speedup multiply its parts'? The observed speedup beside the product,
and the paired interaction contrast with its verdict."""

from __future__ import annotations

from bench.analyze import stats
from bench.analyze.analysis import MULTIPLY
from bench.report.cells import fmt_ratio, known
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
        verdict_tone = {MULTIPLY: "", "gains partly cancel": "warn",
                        "more than multiplicative": "good"}.get(it.verdict, "muted")
        observed = fmt_ratio(it.observed)
        ratio = "-"
        if known(it.ratio):
            ci = f" [{it.ratio_lo:.2f}, {it.ratio_hi:.2f}]" if known(it.ratio_lo) and known(it.ratio_hi) else ""
            ratio = f"{it.ratio:.2f}{ci}"
        verdict = it.verdict + (f" ({it.why})" if it.verdict == stats.NONE and it.why else "")
        rows.append([Cell(ctx.where(it.workload, it.machine)), Cell(it.technique), Cell(parts),
                     Cell(fmt_ratio(it.product)), Cell(observed), Cell(ratio), Cell(verdict, verdict_tone)])
    return Table(["workload", "combination", "parts alone (speedup)", "product of parts", "observed",
                  "observed / product, paired by seed [95% CI]", "verdict"], rows, wrap=(6,))
