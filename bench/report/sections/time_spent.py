"""Where the sweep's time went: its trials' stages added up, the measured steps apart from the fixed cost."""

from __future__ import annotations

from bench.analyze import time_spent
from bench.measure.stages import MEASURED, STAGES
from bench.report.cells import fmt_secs
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 100


def build(ctx: Context) -> Section | None:
    return time_section(ctx)


def time_section(ctx: Context) -> Section | None:
    """Where the sweep's time went: every trial's stages (``TrialRecord.stages``) added up, the measured steps apart
    from the fixed cost. None when no trial ran."""
    analysis = ctx.analysis
    frames = [f for f in (analysis.frame, analysis.continuations) if f is not None and not f.empty]
    rows = [row for f in frames for row in zip(f["wall_s"], f["stages"], f["inductor_cache"], strict=True)]
    spent = time_spent.time_spent((wall, stages) for wall, stages, _ in rows)
    if spent is None or not spent.trials:  # nothing ran, or only older trials without stage times
        return None
    lines = ["Each trial's wall time split into the stages its process and its launcher timed (the records' stages; "
             "docs/methodology.md, 'A trial's stages'). The measured steps are the timed windows and the quality "
             "runs' training; the rest is what the trials cost besides them."]
    lines.append(f"{spent.trials} trials took {fmt_secs(spent.wall_s)}: {fmt_secs(spent.measured_s)} "
                 f"({spent.share(spent.measured_s):.0%}) in measured steps, {fmt_secs(spent.fixed_s)} of fixed cost, "
                 f"{fmt_secs(spent.fixed_s / spent.trials)} per trial.")
    caches = [c for _, _, c in rows if c]
    if caches:
        lines.append(f"TorchInductor caches: {caches.count('cold')} trial(s) compiled from an empty cache (cold), "
                     f"{caches.count('warm')} loaded what an earlier trial of their set compiled (warm); the one-off "
                     "cost in the tables is the cold trials'.")
    if spent.unbroken:
        lines.append(f"{spent.unbroken} trial(s) ({fmt_secs(spent.unbroken_s)}) recorded no stage times (an older "
                     "trainbench): they are not in the table.")
    table = Table(["stage", "seconds", "share", "per trial", "what"], [
        [Cell(name + (" (measured)" if name in MEASURED else "")), Cell(fmt_secs(seconds)),
         Cell(f"{spent.share(seconds):.1%}"), Cell(fmt_secs(seconds / spent.trials)), Cell(STAGES.get(name, ""))]
        for name, seconds in spent.stages.items()], wrap=(4,))
    return Section("Where the sweep's time went", "time", "Where the sweep's time went",
                   [*(Paragraph(line, quiet=True) for line in lines), table])
