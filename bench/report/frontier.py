"""The reading of a workload that records a proxy of its metric and a KL beside it at every evaluation (a preference
workload's ``curve_metrics``: ``proxy_reward`` and ``kl``, in the records' ``quality.curve_extra``).

- ``frontier_figure``: the metric (gold reward) against KL(policy || start) over each set's run, the mean over seeds
  at each evaluation point joined in order (Gao et al. 2022's reward-KL plot), one panel per workload;
- ``frontier_points``: the Summary's sentences: which set reached the metric's target with the least compute (the
  estimated FLOPs up to the first evaluation at the target: steps to target x FLOPs per step, the technique's own
  estimate where it records one, ``flops_per_step_est``, else the trial's measured ``flops_per_step``), and which
  over-optimised the proxy (from the evaluation with the best metric to the end of the run, the proxy rose while the
  metric fell). Every verdict word comes from ``bench.analyze.stats`` (paired over seeds; no verdict below 3), on
  the quality runs ``bench.analyze.pairs`` counts (ok, not cut by the safety cap), keyed as it pairs them.

Nothing here names a technique or a workload: it reads the records' columns.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from bench.analyze import pairs, stats
from bench.analyze.analysis import Analysis
from bench.report.cells import interval, say

PROXY, KL = "proxy_reward", "kl"


def _has_frontier(rec: Any) -> bool:
    extra = rec.get("curve_extra") if isinstance(rec, dict) else getattr(rec, "curve_extra", None)
    return bool(extra) and PROXY in extra and KL in extra


def frontier_trials(analysis: Analysis, machine: str, workload: str) -> pd.DataFrame:
    """The complete quality runs (``bench.analyze.pairs.quality_runs``) of a workload that recorded the proxy and
    the KL beside the metric."""
    frame = analysis.frame
    if "curve_extra" not in frame:
        return frame.iloc[0:0]
    runs = pairs.quality_runs(frame[(frame["machine"] == machine) & (frame["workload"] == workload)])
    return runs[[bool(e) and PROXY in e and KL in e and len(c) > 1 for e, c in zip(runs["curve_extra"],
                                                                                runs["curve"], strict=True)]]


def _step_flops(row: Any) -> float | None:
    """FLOPs per optimizer step: a technique's own estimate (generation and reference models included), else the
    trial's counted FLOPs per step."""
    for found in (row.technique_results or {}).values():
        if isinstance(found, dict) and found.get("flops_per_step_est"):
            return float(found["flops_per_step_est"])
    return float(row.flops_per_step) if pd.notna(row.flops_per_step) and row.flops_per_step else None


def _compute_to_target(row: Any) -> float | None:
    """Estimated FLOPs to the first evaluation at the target (inf: a miss; None: unknown)."""
    if row.steps_to_target is None or pd.isna(row.steps_to_target):
        return math.inf
    found = [f for f in (row.technique_results or {}).values() if isinstance(f, dict) and "flops_per_step_est" in f]
    if found and not found[0]["flops_per_step_est"]:
        return 0.0  # trains nothing: its cost is at inference
    flops = _step_flops(row)
    if flops is None:
        return None
    return float(row.steps_to_target) * flops


def _fmt_flops(f: float) -> str:
    if not math.isfinite(f):
        return "a miss"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.3g} FLOP"


def _peak_and_end(row: Any, hib: bool) -> tuple[float, float, float, float] | None:
    """(metric at its best evaluation, metric at the end, proxy there, proxy at the end) of one trial."""
    metric = [p[4] for p in row.curve]
    proxy = row.curve_extra[PROXY]
    pts = [(i, m) for i, m in enumerate(metric) if m is not None and proxy[i] is not None]
    if len(pts) < 2:
        return None
    best = max(pts, key=lambda p: p[1] if hib else -p[1])[0]
    last = pts[-1][0]
    return metric[best], metric[last], proxy[best], proxy[last]


def frontier_points(analysis: Analysis, machine: str, workload: str) -> list[str]:
    """The Summary's sentences on compute to target and over-optimisation (empty without a frontier)."""
    trials = frontier_trials(analysis, machine, workload)
    if trials.empty:
        return []
    out = []
    hib = bool(next((h for h in trials["higher_is_better"] if h is not None), True))
    metric = next((m for m in trials["metric"] if m), "metric")
    target = next((t for t in trials["target"] if t is not None and not pd.isna(t)), None)
    by_set = {label: g for label, g in trials.groupby("technique", sort=False)}
    if target is not None:
        cost = {label: {r.key: _compute_to_target(r) for r in g.itertuples()} for label, g in by_set.items()}
        cost = {k: v for k, v in cost.items() if all(x is not None for x in v.values())}
        medians = {k: stats.censored_median(list(v.values())) for k, v in cost.items()}
        untrained = [k for k, m in medians.items() if m == 0.0]
        reached = sorted((m, k) for k, m in medians.items() if m is not None and 0 < m < math.inf)
        missed = [k for k, m in medians.items() if m is None or not math.isfinite(m)]
        if untrained:
            out.append(f"reached {metric} {target:g} without training (the cost is at inference, every answer): "
                       + ", ".join(untrained))
        if reached:
            m, best = reached[0]
            hits = sum(math.isfinite(x) for x in cost[best].values())
            text = (f"least compute to reach {metric} {target:g}: {best} (median {_fmt_flops(m)} estimated, "
                    f"{hits}/{len(cost[best])} seeds reached it)")
            if len(reached) > 1:
                m2, second = reached[1]
                est = stats.ratio({s: v for s, v in cost[best].items() if math.isfinite(v)},
                                  {s: v for s, v in cost[second].items() if math.isfinite(v)})
                word = stats.verdict(est, stats.THRESHOLDS["time_to_target"], "more", "less")
                text += (f"; next {second} ({_fmt_flops(m2)}): {best} needs "
                         f"{est.value:.2f}x{interval(est.lo, est.hi)} of its compute, {say(word.word)}"
                         ) if est.value is not None else f"; next {second} ({_fmt_flops(m2)})"
            if missed:
                text += "; median run misses the target: " + ", ".join(missed)
            out.append(text)
        elif missed:
            out.append(f"no set's median run reached {metric} {target:g}: " + ", ".join(missed))
    over, steady = [], []
    margin = next((float(m) for m in trials["margin"] if m is not None and not pd.isna(m)), 0.0)
    for label, g in by_set.items():
        ends = {r.key: _peak_and_end(r, hib) for r in g.itertuples()}
        ends = {s: e for s, e in ends.items() if e is not None}
        if not ends:
            continue
        gold = stats.difference({s: e[1] for s, e in ends.items()}, {s: e[0] for s, e in ends.items()})
        proxy = stats.difference({s: e[3] for s, e in ends.items()}, {s: e[2] for s, e in ends.items()})
        g_word = stats.verdict(gold, margin, "higher", "lower").word
        p_word = stats.verdict(proxy, 0.0, "higher", "lower").word
        fell = g_word == ("lower" if hib else "higher")
        if fell and p_word == "higher":
            over.append(f"{label} ({metric} {gold.value:+.3f}{_ci(gold)} from its best evaluation to the end, "
                        f"{say(g_word)}; proxy {proxy.value:+.3f}{_ci(proxy)}, {say(p_word)})")
        elif gold.value is not None and proxy.value is not None and gold.value * (1 if hib else -1) < 0 < proxy.value:
            steady.append(f"{label} ({metric} {gold.value:+.3f}, {say(g_word)}; proxy {proxy.value:+.3f}, "
                          f"{say(p_word)})")
    if over:
        out.append("over-optimised the proxy (proxy up while the gold metric went down): " + "; ".join(over))
    else:
        text = "no set over-optimised the proxy (proxy up while the gold metric went down, both shown by the data)"
        if steady:
            text += "; the direction without a decision: " + "; ".join(steady)
        out.append(text)
    return out


def set_outcomes(analysis: Analysis, machine: str, workload: str) -> dict[str, dict[str, Any]]:
    """Per set (in the records' order), over its seeds: the metric at the end and at its best evaluation, the proxy
    and the KL at the end (lists, one value per seed), and the estimated compute to the target (censored median, and
    how many seeds reached it). Point estimates only: the verdicts are the analysis's and ``frontier_points``'."""
    trials = frontier_trials(analysis, machine, workload)
    out: dict[str, dict[str, Any]] = {}
    if trials.empty:
        return out
    hib = bool(next((h for h in trials["higher_is_better"] if h is not None), True))
    for label, g in trials.groupby("technique", sort=False):
        rows = list(g.itertuples())
        metric = [[p[4] for p in r.curve if p[4] is not None] for r in rows]
        cost = [_compute_to_target(r) for r in rows]
        known = [c for c in cost if c is not None]
        out[label] = {
            "seeds": len(rows),
            "end": [m[-1] for m in metric if m],
            "best": [(max(m) if hib else min(m)) for m in metric if m],
            "proxy_end": [r.curve_extra[PROXY][-1] for r in rows if r.curve_extra[PROXY][-1] is not None],
            "kl_end": [r.curve_extra[KL][-1] for r in rows if r.curve_extra[KL][-1] is not None],
            "compute_to_target": stats.censored_median(known) if len(known) == len(cost) else None,
            "reached": sum(c is not None and math.isfinite(c) for c in cost),
        }
    return out


def fmt_flops(f: float) -> str:
    """FLOPs with a unit (GFLOP, TFLOP, PFLOP); "a miss" for +inf."""
    return _fmt_flops(f)


def _ci(est: stats.Estimate) -> str:
    return f" [{est.lo:+.3f}, {est.hi:+.3f}]" if est.has_interval else ""
