"""Failures and skips: every trial that did not finish ok, with its reason."""

from __future__ import annotations

from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 120


def build(ctx: Context) -> Section:
    table = _problems_table(ctx)
    return Section("Failures and skips", "problems", "Failures",
                   [table if table is not None else Paragraph("None: every trial finished.")])


def _problems_table(ctx: Context) -> Table | None:
    analysis = ctx.analysis
    prob = analysis.problems
    if prob.empty:
        return None
    rows = []
    for r in prob.itertuples():
        tone = "muted" if r.status == "skipped" else "bad"
        rows.append([Cell(ctx.where(r.workload, r.machine)), Cell(r.technique), Cell(str(r.seed)),
                     Cell(r.status, tone), Cell(r.reason or "(no reason recorded)")])
    return Table(["workload", "technique set", "seed", "status", "reason"], rows, wrap=(4,))
