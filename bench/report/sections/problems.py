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
    # A skip is decided once per set, before any trial starts: its reason is shown once, with the seeds it covers.
    # A failure happened in one trial: each keeps its row.
    skipped: dict[tuple[str, str, str, str], list[int]] = {}
    for r in prob.itertuples():
        if r.status == "skipped":
            skipped.setdefault((r.machine, r.workload, r.technique, r.reason or ""), []).append(int(r.seed))
            continue
        rows.append([Cell(ctx.where(r.workload, r.machine)), Cell(r.technique), Cell(str(r.seed)),
                     Cell(r.status, "bad"), Cell(r.reason or "(no reason recorded)")])
    for (machine, workload, technique, reason), seeds in skipped.items():
        shown = ", ".join(map(str, sorted(set(seeds))))
        rows.append([Cell(ctx.where(workload, machine)), Cell(technique), Cell(shown), Cell("skipped", "muted"),
                     Cell(reason or "(no reason recorded)")])
    return Table(["workload", "technique set", "seed", "status", "reason"], rows, wrap=(4,))
