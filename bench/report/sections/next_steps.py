"""What to try next: the findings (bottlenecks and their remedies, anomalies), one line each."""

from __future__ import annotations

from bench.report.document import Bullets, Section
from bench.report.sections import Context

ORDER = 140


def build(ctx: Context) -> Section:
    found = [(f"[{ctx.names[f.machine]}] " if ctx.several else "") + f.text for f in ctx.analysis.findings]
    return Section("What to try next", "next", "What to try next", [
        Bullets.of(found or ["Nothing stands out: no bottleneck or anomaly crossed a threshold."])])
