"""Where a sweep's timing noise comes from: within a window, between processes, and over minutes.

    .venv/bin/python scripts/noise_decomposition.py runs/quick-YYYYMMDD-HHMMSS [more dirs]

From the records alone (no trial is run), per configuration (workload x set) with at least 3 uncontended trials:

- **within a window**: the step times' IQR / median inside each timed window (median over the configuration's
  trials), and the window's mean step over its median step (above 1: a few slow steps; the mean is what
  samples/s measures);
- **between processes**: the CV of per-trial samples/s over the configuration's trials (what the intervals see
  before pairing);
- **over minutes**: one slope of log samples/s against the trial's start time (% per 10 minutes), fitted within
  every configuration at once, and the share of the between-process variance it explains;
- **machine**: the share of timed windows the contention check flagged, and the VM's steal time over the windows.

Its output on the committed sweeps it names is one line per machine; docs/methodology.md ("Where the noise comes
from") quotes each sweep's noise from its report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.records.results import ResultStore, TrialRecord


def _start(r: TrialRecord) -> float:
    return dt.datetime.fromisoformat(r.timestamp_utc).timestamp()


def decompose(records: list[TrialRecord]) -> tuple[list[dict], dict]:
    """Per configuration: within-window spread and between-process CV; over the sweep: the drift, one slope of
    log samples/s against time fitted within every configuration at once (a fixed-effects regression)."""
    groups: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for r in records:
        if r.status == "ok" and r.speed is not None and r.continues is None:
            groups[(r.workload_label, r.technique_label)].append(r)
    rows, ts, ys = [], [], []
    for (workload, technique), rs in groups.items():
        clean = [r for r in rs if not r.speed.contended]
        if len(clean) < 3:
            continue
        steps = [r.speed.step_time_s for r in clean]
        within = [s.iqr / s.median for s in steps if s.median and s.iqr is not None]
        mean_over_median = [s.mean / s.median for s in steps if s.mean and s.median]
        t = np.array([_start(r) for r in clean])
        y = np.log([r.speed.samples_per_s for r in clean])
        ts.append(t - t.mean())
        ys.append(y - y.mean())
        steal = sum(r.speed.contention.steal_s for r in rs)
        window = sum(r.speed.contention.window_s for r in rs)
        rows.append({
            "workload": workload, "technique": technique, "n": len(clean),
            "within_iqr": float(np.median(within)) if within else math.nan,
            "mean_over_median": float(np.median(mean_over_median)) if mean_over_median else math.nan,
            "worst_mean_over_median": float(np.max(mean_over_median)) if mean_over_median else math.nan,
            "between_cv": float(np.std(y, ddof=1)),
            "contended": sum(bool(r.speed.contended) for r in rs) / len(rs),
            "steal_share": steal / window if window else 0.0,
        })
    drift = {"slope_pct_per_10min": math.nan, "share": math.nan}
    if ts:
        t, y = np.concatenate(ts), np.concatenate(ys)
        if np.sum(t * t) > 0:
            slope = float(np.sum(t * y) / np.sum(t * t))
            drift = {"slope_pct_per_10min": math.expm1(slope * 600) * 100,
                     "share": 1 - float(np.sum((y - slope * t) ** 2)) / float(np.sum(y * y))}
    return rows, drift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    records = [r for d in args.dirs for r in ResultStore(d / "results.jsonl").read()]
    rows, drift = decompose(records)
    print("| workload | set | trials | within a window: step IQR / median | window mean / median step (worst) | "
          "between processes: CV of samples/s | contended windows | steal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["workload"], r["technique"] != "baseline", r["technique"])):
        print(f"| {r['workload']} | {r['technique']} | {r['n']} | {r['within_iqr']:.1%} | "
              f"{r['mean_over_median']:.3f} ({r['worst_mean_over_median']:.3f}) | {r['between_cv']:.1%} | "
              f"{r['contended']:.0%} | {r['steal_share']:.2%} |")
    med = {k: float(np.median([r[k] for r in rows])) for k in ("within_iqr", "mean_over_median", "between_cv")}
    print(f"\nMedian over configurations: within a window {med['within_iqr']:.1%} (step IQR / median), window mean "
          f"over median step {med['mean_over_median']:.3f}, between processes {med['between_cv']:.1%} (CV). "
          f"Over minutes: {drift['slope_pct_per_10min']:+.1f}% per 10 minutes, {drift['share']:.0%} of the "
          "between-process variance.")


if __name__ == "__main__":
    main()
