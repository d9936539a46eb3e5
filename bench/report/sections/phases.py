"""Where the step's time goes: each set's step split into its labelled phases (a pass of its own after the timed
window) and the bottleneck the shares point to."""

from __future__ import annotations

from bench.measure.phases import PHASES
from bench.report.cells import fmt_pct, known
from bench.report.document import Cell, FigureRef, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 40


def build(ctx: Context) -> Section | None:
    table = _phases_table(ctx)
    if table is None:
        return None
    return Section("Where the step's time goes", "phases", "Step phases", [
        Paragraph("Each set's step split into its labelled phases, timed in a pass of its own after the timed "
                  "window (median share over seeds), and the bottleneck the shares point to "
                  "(python -m bench profile WORKLOAD --techniques SET adds a trace and the top operators)."),
        table, FigureRef("phases")])


def _phases_table(ctx: Context) -> Table | None:
    """Per set: the phase pass's step time, each phase's share, and the bottleneck the shares point to."""
    analysis = ctx.analysis
    rows = analysis.configs[analysis.configs["phase_step_s"].notna()]
    if rows.empty:
        return None
    several = ctx.several
    body = []
    for r in rows.itertuples():
        cells = [Cell(ctx.where(r.workload, r.machine) if several else r.workload), Cell(r.technique),
                 Cell(f"{1e3 * r.phase_step_s:.2f} ms")]
        for phase in PHASES:
            share = getattr(r, f"phase_{phase}_share")
            cells.append(Cell(fmt_pct(share), "warn" if phase == "data" and known(share) and share >= 0.2 else ""))
        cells.append(Cell(r.phase_diagnosis or "-"))
        body.append(cells)
    return Table(["workload", "set", "step (phase pass)", *PHASES, "bottleneck"], body, wrap=(len(PHASES) + 3,))
