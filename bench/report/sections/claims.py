"""Claims check: each technique's published effect beside what this sweep measured on this hardware."""

from __future__ import annotations

from bench.report.cells import claim_cell, estimate_text, known
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 110


def build(ctx: Context) -> Section:
    table = _claims_table(ctx)
    if table is None:
        return Section("Claims check", "claims", "Claims", [
            Paragraph("No technique measured alone in this sweep carries a published claim.")])
    blocks = [Paragraph("Each technique's published effect beside what this sweep measured on this hardware."), table]
    if ctx.analysis.baseline != "baseline":
        blocks.append(Paragraph(f"Published claims are stated against plain fp32 training; this report's reference "
                                f"is '{ctx.analysis.baseline}', so the measured side of each claim is relative to it.",
                                quiet=True))
    return Section("Claims check", "claims", "Claims", blocks)


def _claims_table(ctx: Context) -> Table | None:
    analysis = ctx.analysis
    claims = analysis.claims
    if claims.empty:
        return None
    rows = []
    for cl in claims.itertuples():
        metric = {"speedup": "speedup", "model_state_ratio": "model state per rank vs a full replica"}.get(
            cl.metric, "peak memory ratio")
        measured = estimate_text(cl.measured, cl.measured_lo, cl.measured_hi) if known(cl.measured) else "-"
        if cl.against:  # measured on top of the same set without the technique, not against the reference
            measured += f" over {cl.against}"
        if cl.unmet:
            measured += f"; not the claim's setting: {'; '.join(cl.unmet)}"
        verdict = claim_cell(cl.verdict, cl.why_not, speed=cl.metric == "speedup")
        who = f"{cl.name} in {cl.technique}" if cl.against else cl.technique
        rows.append([Cell(who), Cell(ctx.where(cl.workload, cl.machine)),
                     Cell(f"{metric} {cl.low:g}-{cl.high:g}x on {cl.setting}"), Cell(cl.source),
                     Cell(measured), verdict, Cell("; ".join(cl.why) if cl.why else "-")])
    return Table(["technique", "workload", "published claim", "source", "measured here [95% CI]", "verdict",
                  "why this hardware may differ"], rows, wrap=(2, 3, 4, 5, 6))
