"""The records as a frame: one row per trial, the fields the analysis, ``bench.load`` and the exporters read.

``records_frame(sweep)`` flattens ``TrialRecord``s (``bench.records.results``) into a pandas DataFrame of Python
objects (``RECORD_COLUMNS``; None for a missing value, never NaN), one row per trial, in the records' order.
``bench.records.columns`` types it for users (``bench.load``); the analysis (``bench.analyze``) reads it as it is.
It lives with the records, below the analysis, so that reading trials never imports the statistics.

``key`` = (sweep directory, seed, repeat) is what pairs trials of different technique sets (``bench.analyze.pairs``):
a planned repeat has its own seed, a sequential design's speed-only pairs reuse the seeds under new repeat numbers,
and trials of two directories merged into one frame never share a key.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from bench.measure.phases import PHASES
from bench.records.reader import Sweep
from bench.records.results import CONTENDED_ABOVE, TrialRecord

BASELINE = "baseline"  # the label of the empty technique set, the default reference
BREAKDOWN = ("params", "grads", "optimizer", "activations", "other")
MODEL_STATE = ("params", "grads", "optimizer")  # per-rank model state of multi-process trials, from local shards

# A trial's parity answer as the frame's parity_ok: inconclusive is neither a match nor a mismatch.
PARITY_OK = {"ok": True, "mismatch": False, "inconclusive": None}


def frame_of(rows: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
    """A DataFrame of Python objects where missing values are None (never NaN), so formatting code can test
    ``is None`` and tuples/lists survive."""
    frame = pd.DataFrame(rows, columns=columns).astype(object)
    return frame.where(frame.notna(), None)


# Multi-process trials: per-rank memory and model state beside the ZeRO formula (None for one-process trials, where
# the clean RSS values are this process's own).
DISTRIBUTED_COLUMNS = [
    "world_size", "n_params", "samples_per_s_per_device", "rank_peak_rss_bytes", "clean_rss_at_rest_bytes",
    "clean_rss_peak_bytes", "model_state_bytes", *(f"state_{c}_bytes" for c in MODEL_STATE), "zero_stage",
    "zero_formula_bytes", "zero_note",
]

RECORD_COLUMNS = [
    "source", "machine", "key", "sweep_id", "trial_id", "timestamp_utc", "workload", "technique", "names",
    "components", "kind", "mode", "seed", "repeat", "position", "device", "status", "reason", "notes",
    "added_by", "wall_s", "stages", "inductor_cache", "max_looks", "margin",
    "batch_size", "first_step_s", "one_off_s", "probe_s", "trained_params", "threads", "cores", "devices", "recipe",
    "samples_per_s", "tokens_per_s", "step_time_s", "step_time_iqr_s", "window_steps", "data_wait_frac",
    "contention_frac", "contended", "contention_retries", "flops_per_step", "achieved_flops", "compute_dtype",
    "peak_flops", "mfu",
    "mfu_datasheet",
    "peak_bytes", "peak_rss_bytes", *(f"mem_{c}_bytes" for c in BREAKDOWN), "mem_held", "breakdown_skipped",
    "metric", "higher_is_better", "target", "budget_samples", "samples_trained", "final", "train_time_s", "cut",
    "stopped_by", "quality_contended", "quality_contention_frac", "curve", "curve_extra", "samples_to_target", "steps_to_target", "time_to_target_s", "time_to_target_one_off_s",
    "parity_kind", "parity_ok", "parity_loss_diff", "parity_start_diff", "parity_distance_diff", "parity_loss_tol",
    "parity_distance_tol", "parity_note", "parity_answer", "parity_harmless_drift", "parity_bug_loss_drift",
    "parity_bug_distance_drift", "parity_k_tol", "energy_j", "technique_results",
    "phase_step_s", *(f"phase_{p}_share" for p in PHASES), "phase_device_busy", "phase_device_op_s",
    *DISTRIBUTED_COLUMNS,
    "continues", "continuation",
]


def _record_row(r: TrialRecord, source: str, machine: str, max_looks: int | None = None) -> dict[str, Any]:
    b, s, q, p, m = r.build, r.speed, r.quality, r.parity, r.memory
    bd = (m.breakdown if m else None) or {}
    wl = r.workload or {}
    return {
        "source": source, "machine": machine, "key": (source, r.seed, r.repeat), "sweep_id": r.sweep_id,
        "trial_id": r.trial_id, "timestamp_utc": r.timestamp_utc, "workload": r.workload_label,
        "technique": r.technique_label, "names": tuple(p.split(":")[0] for p in _components(r.technique_label)),
        "components": _components(r.technique_label), "kind": r.kind,
        "mode": r.mode, "seed": r.seed, "repeat": r.repeat, "position": r.position, "device": r.device,
        "status": r.status, "reason": r.reason, "notes": tuple(r.notes),
        "added_by": r.added_by, "wall_s": r.wall_s, "stages": r.stages,
        "inductor_cache": (r.caches or {}).get("inductor"), "max_looks": max_looks, "margin": q.margin if q else None,
        "batch_size": b.batch_size if b else wl.get("batch_size"),
        "first_step_s": b.first_step_s if b else None, "one_off_s": b.one_off_s if b else None,
        "probe_s": b.probe_s if b else None, "trained_params": b.trained_params if b else None,
        **_resources(r),
        "recipe": b.recipe if b else None,
        "samples_per_s": s.samples_per_s if s else None, "tokens_per_s": s.tokens_per_s if s else None,
        "step_time_s": s.step_time_s.median if s else None, "step_time_iqr_s": s.step_time_s.iqr if s else None,
        "window_steps": s.steps if s else None, "data_wait_frac": s.data_wait_frac if s else None,
        "contention_frac": s.contention.fraction if s else None, "contended": bool(s and s.contended),
        "contention_retries": list(s.contention_retries) if s else [],
        "flops_per_step": s.flops_per_step if s else None, "achieved_flops": s.achieved_flops if s else None,
        "compute_dtype": s.compute_dtype if s else None, "peak_flops": s.peak_flops if s else None,
        "mfu": s.mfu if s else None, "mfu_datasheet": s.mfu_datasheet if s else None,
        "peak_bytes": m.peak_bytes if m else None, "peak_rss_bytes": m.peak_rss_bytes if m else None,
        **{f"mem_{c}_bytes": bd.get(c) for c in BREAKDOWN}, "mem_held": bd.get("held") or None,
        "breakdown_skipped": m.breakdown_skipped if m else None,
        "metric": q.metric if q else wl.get("metric"),
        "higher_is_better": q.higher_is_better if q else wl.get("higher_is_better"),
        "target": q.target if q else wl.get("target"),
        "budget_samples": q.budget_samples if q else None, "samples_trained": q.samples_trained if q else None,
        "final": q.final if q else None, "train_time_s": q.train_time_s if q else None, "cut": q.cut if q else None,
        "stopped_by": q.stopped_by if q else None,
        "quality_contended": bool(q and (q.contended or (q.contention is not None
                                                          and q.contention.fraction > CONTENDED_ABOVE))),
        "quality_contention_frac": q.contention.fraction if q and q.contention is not None else None,
        "curve": q.curve if q else [],
        "curve_extra": q.curve_extra if q else None,
        "samples_to_target": q.samples_to_target if q else None,
        "steps_to_target": q.steps_to_target if q else None,
        "time_to_target_s": q.time_to_target_s if q else None,
        "time_to_target_one_off_s": q.time_to_target_with_one_off_s if q else None,
        "parity_kind": p.kind if p else None, "parity_ok": PARITY_OK[p.verdict] if p else None,
        "parity_loss_diff": p.loss_rel_diff if p else None, "parity_start_diff": _start_diff(p),
        "parity_distance_diff": p.distance_rel_diff if p else None,
        "parity_loss_tol": p.loss_tolerance if p else None, "parity_distance_tol": p.distance_tolerance if p else None,
        "parity_note": p.note if p else None, "parity_answer": p.verdict if p else None,
        "parity_harmless_drift": p.harmless_loss_drift if p else None,
        "parity_bug_loss_drift": p.bug_loss_drift if p else None,
        "parity_bug_distance_drift": p.bug_distance_drift if p else None, "parity_k_tol": p.k_tol if p else None,
        "energy_j": r.energy.joules if r.energy else None,
        "technique_results": r.technique_results,
        "phase_step_s": r.phases.step_s if r.phases else None,
        **{f"phase_{name}_share": r.phases.share.get(name) if r.phases else None for name in PHASES},
        "phase_device_busy": r.phases.device_busy if r.phases else None,
        "phase_device_op_s": r.phases.device_op_s if r.phases else None,
        "n_params": b.n_params if b else wl.get("n_params"),
        **_distributed_fields(r.world_size, s, m),
        "continues": r.continues,
        "continuation": dataclasses.asdict(q.continuation) if q and q.continuation else None,
    }


def _resources(r: TrialRecord) -> dict[str, Any]:
    """What the trial ran on (``build.resources``; for a record before that field, from its world size, threads and
    device): threads per rank, cores (ranks x threads) and devices (GPUs; 0 on the CPU)."""
    b = r.build
    if b is not None and b.resources:
        return {k: b.resources.get(k) for k in ("threads", "cores", "devices")}
    threads = b.threads if b is not None else None
    ranks = r.world_size or 1
    return {"threads": threads, "cores": ranks * threads if threads else None,
            "devices": ranks if str(r.device).startswith("cuda") else 0 if b is not None else None}


def _components(label: str) -> tuple[str, ...]:
    """The parts of a technique set's label ("bf16+grad_accum:steps=4"); the empty set (baseline) has none. Read
    from the label, which every record has, even one of a trial killed before it built anything."""
    return () if label == BASELINE else tuple(label.split("+"))


def _distributed_fields(world_size: int | None, speed: Any, mem: Any) -> dict[str, Any]:
    """Per-rank memory (the maximum over ranks where one number stands for all) and the ZeRO formula's total."""
    ranks = (mem.per_rank if mem else None) or []
    cleans = [r.get("clean_rss") or {} for r in ranks] or [(mem.clean_rss if mem else None) or {}]

    def worst(key: str) -> int | None:
        values = [c.get(key) for c in cleans]
        return max(values) if values and all(v is not None for v in values) else None

    formula = (mem.zero_formula_bytes if mem else None) or {}
    states = [r.get("model_state") or {} for r in ranks]
    largest = max(states, key=lambda st: sum(st.get(c) or 0 for c in MODEL_STATE), default={})
    return {
        "world_size": world_size or 1,
        "samples_per_s_per_device": speed.samples_per_s_per_device if speed else None,
        "rank_peak_rss_bytes": tuple(r.get("peak_rss_bytes") for r in ranks) or None,
        "clean_rss_at_rest_bytes": worst("at_rest_bytes"),
        "clean_rss_peak_bytes": worst("peak_bytes"),
        "model_state_bytes": mem.model_state_bytes if mem else None,
        **{f"state_{c}_bytes": largest.get(c) for c in MODEL_STATE},
        "zero_stage": mem.zero_stage if mem else None,
        "zero_formula_bytes": formula.get("total"),
        "zero_note": mem.zero_note if mem else None,
    }


def records_frame(sweep: Sweep | Sequence[TrialRecord], max_looks: int | None = None) -> pd.DataFrame:
    """One row per trial with the fields the analysis uses (see ``RECORD_COLUMNS``); missing values are None.
    ``key`` = (sweep directory, seed, repeat): what pairs trials of different sets (a planned repeat has its own
    seed; a sequential design's speed-only pairs reuse the seeds under new repeat numbers). Bare records (not a
    ``Sweep``) are one directory, named "" on an unnamed machine. ``max_looks``: the cap of the sequential design
    the records came from (a sweep's own comes from its sweep.toml)."""
    if isinstance(sweep, Sweep):
        rows = [_record_row(r, s.name, s.machine, design_cap(s.settings)) for s in sweep.sources for r in s.records]
    else:
        rows = [_record_row(r, "", "", max_looks) for r in sweep]
    return cold_one_off(frame_of(rows, RECORD_COLUMNS))


def cold_one_off(frame: pd.DataFrame) -> pd.DataFrame:
    """A trial that found its set's compile cache warm (``inductor_cache``) compiled little: its one-off cost, and
    its time to target with one-off, take the median one-off of its set's cold trials (ok ones) on the same machine,
    the cost a user pays once. Without a cold trial of the set in the frame, warm trials keep their own."""
    warm = frame["inductor_cache"] == "warm"
    if not warm.any():
        return frame
    frame = frame.copy()
    for _, g in frame[frame["inductor_cache"].notna()].groupby(["machine", "workload", "technique"], sort=False):
        cold = _values(g.loc[(g["inductor_cache"] == "cold") & (g["status"] == "ok"), "one_off_s"])
        if not cold:
            continue
        one_off = float(np.median(cold))
        for i in g.index[g["inductor_cache"] == "warm"]:
            frame.at[i, "one_off_s"] = one_off
            ttt = frame.at[i, "time_to_target_s"]
            if _ok(ttt):
                frame.at[i, "time_to_target_one_off_s"] = ttt + one_off + (frame.at[i, "probe_s"] or 0.0)
    return frame


def design_cap(settings: Mapping[str, Any] | None) -> int | None:
    """The cap of a sweep's sequential design (``max_repeats`` in sweep.toml), or None for a fixed design."""
    cap = (settings or {}).get("max_repeats")
    repeats = (settings or {}).get("repeats")
    return int(cap) if isinstance(cap, int) and isinstance(repeats, int) and cap > repeats else None



def _start_diff(p: Any) -> float | None:
    """The relative difference of the first loss, computed before any update: a difference there is a different
    starting model or first batch, not arithmetic."""
    if not p or not p.losses or not p.reference_losses:
        return None
    a, b = p.losses[0], p.reference_losses[0]
    return abs(a - b) / max(abs(b), 1e-12)


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _values(series: pd.Series) -> list[float]:
    return [float(v) for v in series if _ok(v)]
