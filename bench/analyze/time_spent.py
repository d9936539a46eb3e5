"""Where a sweep's time went: its trials' stage times (``TrialRecord.stages``) added up over the sweep.

The measured steps (the timed window, the quality run's training, a continuation's) are what a trial exists to time;
everything else (starting the process, imports, building, evaluation, the passes, teardown) is its fixed cost. The
report's section and summary.md's line come from here. Trials of older trainbench versions recorded no stages: their
wall time is counted apart, never spread over stages it was not measured in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bench.measure.stages import MEASURED, STAGES


@dataclass(frozen=True)
class TimeSpent:
    """Stage totals over the trials that recorded them."""

    trials: int  # trials with stage times
    wall_s: float  # their wall time, summed
    stages: dict[str, float]  # stage -> seconds over those trials, in ``STAGES``' order, zeros left out
    unbroken: int = 0  # trials that ran but recorded no stages (older records)
    unbroken_s: float = 0.0  # their wall time

    @property
    def measured_s(self) -> float:
        return sum(self.stages.get(name, 0.0) for name in MEASURED)

    @property
    def fixed_s(self) -> float:
        return self.wall_s - self.measured_s

    def share(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    def largest_fixed(self, n: int = 3) -> list[tuple[str, float]]:
        """The ``n`` largest stages of the fixed cost (``unaccounted`` included if it is among them)."""
        fixed = [(k, v) for k, v in self.stages.items() if k not in MEASURED and v > 0]
        return sorted(fixed, key=lambda kv: -kv[1])[:n]


def time_spent(trials: Iterable[tuple[Any, Any]]) -> TimeSpent | None:
    """From (wall_s, stages) per trial: the totals, or None when no trial ran (all skipped)."""
    totals: dict[str, float] = {}
    n = unbroken = 0
    wall = unbroken_wall = 0.0
    for wall_s, stages in trials:
        if not _number(wall_s):
            continue  # skipped: it never ran
        if not isinstance(stages, Mapping) or not stages:
            unbroken, unbroken_wall = unbroken + 1, unbroken_wall + float(wall_s)
            continue
        n, wall = n + 1, wall + float(wall_s)
        for name, seconds in stages.items():
            if _number(seconds):
                totals[name] = totals.get(name, 0.0) + float(seconds)
    if not n and not unbroken:
        return None
    ordered = {name: totals[name] for name in STAGES if totals.get(name)}
    ordered |= {name: v for name, v in totals.items() if name not in STAGES and v}  # a newer version's stages
    return TimeSpent(n, wall, ordered, unbroken, unbroken_wall)


def of_records(records: Iterable[Any]) -> TimeSpent | None:
    """``time_spent`` of TrialRecords."""
    return time_spent((r.wall_s, r.stages) for r in records)


def summary_line(spent: TimeSpent | None) -> str | None:
    """One line for summary.md: the trials' wall time, the measured steps' share, the fixed cost per trial and
    its largest parts."""
    if spent is None or not spent.trials:
        return None
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in spent.largest_fixed())
    line = (f"Where the time went: {spent.trials} trials took {spent.wall_s:.0f} s, {spent.share(spent.measured_s):.0%} "
            f"of it in measured steps (timed windows and quality training) and {spent.fixed_s / spent.trials:.2f} s "
            f"per trial of fixed cost (largest: {parts}); the report's 'Where the sweep's time went' has every stage.")
    if spent.unbroken:
        line += f" {spent.unbroken} older trial(s) ({spent.unbroken_s:.0f} s) recorded no stage times."
    return line


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
