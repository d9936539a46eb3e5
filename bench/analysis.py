"""Statistics over trial records: what sped up, by how much, with what certainty, at what cost.

Everything the report shows is computed here, once, from records (``results.jsonl``) and their environment
(``env.json``); the report only formats it. The pipeline:

- ``load(dirs)``: records of one or more sweep directories, each with its ``env.json`` (machine fingerprint);
- ``records_frame(sweep)``: a tidy DataFrame, one row per trial, units in the column names;
- ``configurations(frame)``: one row per machine x workload x technique set: throughput median/IQR, speedup vs the
  reference set with a bootstrap interval (ratio of medians, resampling trials), memory and memory ratio, the
  memory breakdown, MFU, final metric (mean +- std over seeds) and its difference from the reference with an
  interval, time-to-target, parity, status, noise flags;
- ``interactions(configs)``: for combined sets, the observed speedup against the product of the single ones;
- ``claims_check(configs, envs)``: each technique's published claim beside what this sweep measured;
- ``diagnose(...)``: short "what to try next" findings derived from the numbers.

Intervals and verdict wording come from ``bench.stats`` with a fixed bootstrap seed, so the same records always
give the same report. Machines are never pooled: a speedup compares trials on the same machine only.
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import stats
from bench.results import ResultStore, TrialRecord

log = logging.getLogger(__name__)

BASELINE = "baseline"
SEED = 0  # bootstrap seed: the same records always give the same intervals
BREAKDOWN = ("params", "grads", "optimizer", "activations", "other")
MODEL_STATE = ("params", "grads", "optimizer")  # per-rank model state of multi-process trials, from local shards
PROBLEM_STATUSES = ("failed", "oom", "timeout", "diverged")
REPLICA_BYTES_PER_PARAM = 16  # model state of a full replica with fp32 AdamW: params 4 + grads 4 + two moments 8

# Thresholds of the diagnosis ("what to try next"); each finding says the number it saw.
DATA_WAIT_HIGH = 0.20  # data loading takes more than this fraction of the timed window
LOW_MFU = 0.05  # below this the reference is bound by per-op overhead rather than matmul throughput
ACTIVATIONS_DOMINANT = 0.50  # activations above this share of the tensor peak
OPTIMIZER_DOMINANT = 0.40  # optimizer state above this share of the tensor peak
ONE_OFF_COST_S = 0.5  # a first step longer than the reference's by more than this (and 3x) is worth a remark
MEMORY_THRESHOLD = 0.01  # a memory ratio within 1% of 1 is "no significant difference" (allocator granularity)

GPU_WORDS = ("gpu", "nvidia", "v100", "a100", "h100", "h200", "tensor core", "cuda", "tpu")


class InputError(ValueError):
    """The report's input is unusable (no results.jsonl, unknown reference set): the message says what to do."""


# ---- loading ------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """One sweep directory: its records, environment and (when present) resolved sweep settings."""

    path: Path
    records: list[TrialRecord]
    env: dict[str, Any]
    settings: dict[str, Any] | None = None
    machine: str = ""

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Sweep:
    """Records of one or more sweeps. ``machines`` maps each machine label to the environment it came from."""

    sources: list[Source]
    machines: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def records(self) -> list[TrialRecord]:
        return [r for s in self.sources for r in s.records]


def load(dirs: Sequence[Path | str]) -> Sweep:
    """Read ``results.jsonl`` (required), ``env.json`` and ``sweep.toml`` (optional) from each directory."""
    sources = []
    for d in dirs:
        path = Path(d)
        results = path / "results.jsonl"
        if not results.is_file():
            raise InputError(f"{path} has no results.jsonl (give the directory a sweep wrote, e.g. reports/quick-...)")
        try:
            records = ResultStore(results).read()
        except ValueError as exc:
            raise InputError(f"{results}: {exc}") from None
        env: dict[str, Any] = {}
        if (path / "env.json").is_file():
            env = json.loads((path / "env.json").read_text())
        else:
            log.warning("%s has no env.json: the report cannot say which machine it ran on", path)
        settings = None
        if (path / "sweep.toml").is_file():
            try:
                settings = tomllib.loads((path / "sweep.toml").read_text())
            except tomllib.TOMLDecodeError:
                log.warning("ignoring an unreadable %s", path / "sweep.toml")
        device = records[0].device if records else env.get("device", "?")
        sources.append(Source(path, records, env, settings, machine_label(env, device)))
    machines: dict[str, dict[str, Any]] = {}
    for s in sources:
        machines.setdefault(s.machine, s.env)
    return Sweep(sources, machines)


def machine_label(env: dict[str, Any], device: str) -> str:
    """A short, stable name for the machine and software a sweep ran on; sweeps with different labels are kept
    apart in every statistic."""
    if not env:
        return f"{device}, unknown machine (no env.json)"
    gpu = env.get("gpu") or {}
    if str(device).startswith("cuda") and gpu:
        count = gpu.get("count") or 1
        hw = f"{count} x {gpu.get('name')}" if count > 1 else str(gpu.get("name"))
    else:
        cores = env.get("cpu_affinity") or env.get("cpu_logical")
        hw = f"{env.get('cpu_model') or 'unknown CPU'}" + (f" ({cores} cores)" if cores else "")
    parts = [str(device), hw]
    if env.get("hostname"):
        parts.append(f"host {env['hostname']}")
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return ", ".join(parts)


# ---- the tidy frame -----------------------------------------------------------------------------------------

# Multi-process trials: per-rank memory and model state beside the ZeRO formula (None for one-process trials, where
# the clean RSS values are this process's own).
DISTRIBUTED_COLUMNS = [
    "world_size", "n_params", "samples_per_s_per_device", "rank_peak_rss_bytes", "clean_rss_at_rest_bytes",
    "clean_rss_peak_bytes", "model_state_bytes", *(f"state_{c}_bytes" for c in MODEL_STATE), "zero_stage",
    "zero_formula_bytes", "zero_note",
]

RECORD_COLUMNS = [
    "source", "machine", "sweep_id", "trial_id", "timestamp_utc", "workload", "technique", "names", "components",
    "seed", "repeat", "device", "status", "reason",
    "samples_per_s", "tokens_per_s", "step_time_s", "step_time_iqr_s", "window_steps", "first_step_s",
    "data_wait_frac", "contention_frac", "contended",
    "peak_bytes", "peak_rss_bytes", *(f"mem_{c}_bytes" for c in BREAKDOWN), "breakdown_skipped",
    "flops_per_step", "achieved_flops", "compute_dtype", "peak_flops", "mfu",
    "metric", "higher_is_better", "final", "target", "time_to_target_s", "train_time_s", "steps_trained",
    "budget_cut", "curve",
    "parity_kind", "parity_ok", "parity_diff", "parity_tol", "parity_note", "energy_j",
    *DISTRIBUTED_COLUMNS,
]


def _record_row(r: TrialRecord, source: str, machine: str) -> dict[str, Any]:
    timing, mem, comp, acc, par = r.timing or {}, r.memory or {}, r.compute or {}, r.accuracy or {}, r.parity or {}
    step = timing.get("step_time_s") or {}
    bd = mem.get("breakdown") or {}
    contention = timing.get("contention") or {}
    wl = r.workload or {}
    return {
        "source": source,
        "machine": machine,
        "sweep_id": r.sweep_id,
        "trial_id": r.trial_id,
        "timestamp_utc": r.timestamp_utc,
        "workload": f"{wl.get('name')}:{wl.get('size')}",
        "technique": r.technique_label,
        "names": tuple(t.get("name") for t in r.techniques),
        "components": tuple(p for p in r.technique_label.split("+")) if r.techniques else (),
        "seed": r.seed,
        "repeat": r.repeat,
        "device": r.device,
        "status": r.status,
        "reason": r.reason,
        "samples_per_s": timing.get("samples_per_s"),
        "tokens_per_s": timing.get("tokens_per_s"),
        "step_time_s": step.get("median"),
        "step_time_iqr_s": step.get("iqr"),
        "window_steps": timing.get("steps"),
        "first_step_s": timing.get("first_step_s"),
        "data_wait_frac": timing.get("data_wait_frac"),
        "contention_frac": contention.get("fraction"),
        "contended": bool(timing.get("contended")),
        "peak_bytes": mem.get("peak_bytes"),
        "peak_rss_bytes": mem.get("peak_rss_bytes"),
        **{f"mem_{c}_bytes": bd.get(c) for c in BREAKDOWN},
        "breakdown_skipped": mem.get("breakdown_skipped"),
        "flops_per_step": comp.get("flops_per_step"),
        "achieved_flops": comp.get("achieved_flops"),
        "compute_dtype": comp.get("compute_dtype"),
        "peak_flops": comp.get("peak_flops"),
        "mfu": comp.get("mfu"),
        "metric": acc.get("metric") or wl.get("metric"),
        "higher_is_better": acc.get("higher_is_better", wl.get("higher_is_better")),
        "final": acc.get("final"),
        "target": acc.get("target"),
        "time_to_target_s": acc.get("time_to_target_s"),
        "train_time_s": acc.get("train_time_s"),
        "steps_trained": acc.get("steps_trained"),
        "budget_cut": acc.get("budget_cut"),
        "curve": acc.get("curve") or [],
        "parity_kind": par.get("kind"),
        "parity_ok": par.get("ok"),
        "parity_diff": par.get("max_rel_loss_diff"),
        "parity_tol": par.get("tolerance"),
        "parity_note": par.get("note"),
        "energy_j": (r.energy or {}).get("joules"),
        "n_params": wl.get("n_params"),
        **_distributed_fields(r.world_size, timing, mem),
    }


def _distributed_fields(world_size: int | None, timing: dict[str, Any], mem: dict[str, Any]) -> dict[str, Any]:
    """Per-rank memory (the maximum over ranks where one number stands for all) and the ZeRO formula's total."""
    ranks = mem.get("per_rank") or []
    cleans = [r.get("clean_rss") or {} for r in ranks] or [mem.get("clean_rss") or {}]

    def worst(key: str) -> int | None:
        values = [c.get(key) for c in cleans]
        return max(values) if values and all(v is not None for v in values) else None

    formula = mem.get("zero_formula_bytes") or {}
    states = [r.get("model_state") or {} for r in ranks]
    largest = max(states, key=lambda st: sum(st.get(c) or 0 for c in MODEL_STATE), default={})
    return {
        "world_size": world_size or 1,
        "samples_per_s_per_device": timing.get("samples_per_s_per_device"),
        "rank_peak_rss_bytes": tuple(r.get("peak_rss_bytes") for r in ranks) or None,
        "clean_rss_at_rest_bytes": worst("at_rest_bytes"),
        "clean_rss_peak_bytes": worst("peak_bytes"),
        "model_state_bytes": mem.get("model_state_bytes"),
        **{f"state_{c}_bytes": largest.get(c) for c in MODEL_STATE},
        "zero_stage": mem.get("zero_stage"),
        "zero_formula_bytes": formula.get("total"),
        "zero_note": mem.get("zero_note"),
    }


def records_frame(sweep: Sweep | Sequence[TrialRecord]) -> pd.DataFrame:
    """One row per trial with the fields the analysis uses (see ``RECORD_COLUMNS``); missing values are None."""
    if isinstance(sweep, Sweep):
        rows = [_record_row(r, s.name, s.machine) for s in sweep.sources for r in s.records]
    else:
        rows = [_record_row(r, "", "") for r in sweep]
    return _frame(rows, RECORD_COLUMNS)


def _frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
    """A DataFrame of Python objects where missing values are None (never NaN), so formatting code can test
    ``is None`` and tuples/lists survive."""
    frame = pd.DataFrame(rows, columns=columns).astype(object)
    return frame.where(frame.notna(), None)


# ---- per-configuration aggregates ---------------------------------------------------------------------------


def _values(series: pd.Series) -> list[float]:
    return [float(v) for v in series if v is not None and not (isinstance(v, float) and math.isnan(v))]


def _median(series: pd.Series) -> float | None:
    v = _values(series)
    return float(np.median(v)) if v else None


def _per_rank_medians(series: pd.Series) -> tuple[float, ...] | None:
    """Rank by rank, the median over trials of per-rank values (trials of one configuration share a world size)."""
    lists = [v for v in series if v]
    if not lists or len({len(v) for v in lists}) != 1 or any(x is None for v in lists for x in v):
        return None
    return tuple(float(np.median(col)) for col in zip(*lists, strict=True))


def _interval_cols(prefix: str, iv: stats.Interval | None, verdict: str | None) -> dict[str, Any]:
    return {
        prefix: iv.estimate if iv else None,
        f"{prefix}_lo": iv.lo if iv else None,
        f"{prefix}_hi": iv.hi if iv else None,
        f"{prefix}_verdict": verdict,
    }


def _status_text(group: pd.DataFrame) -> str:
    counts = group["status"].value_counts()
    parts = [f"{int(counts.get('ok', 0))}/{len(group)} ok"]
    parts += [f"{int(counts[s])} {s}" for s in ("skipped", *PROBLEM_STATUSES) if s in counts]
    return ", ".join(parts)


def _ordered_groups(frame: pd.DataFrame, baseline: str) -> list[tuple[str, str, str]]:
    """(machine, workload, technique) keys: machines in order of appearance, workloads sorted, the reference set
    first, then technique sets in the order the sweep ran them."""
    machines = list(dict.fromkeys(frame["machine"]))
    keys = []
    for m in machines:
        fm = frame[frame["machine"] == m]
        for w in sorted(set(fm["workload"])):
            labels = list(dict.fromkeys(fm[fm["workload"] == w]["technique"]))
            labels.sort(key=lambda label: label != baseline)  # stable: the reference first
            keys += [(m, w, t) for t in labels]
    return keys


def configurations(frame: pd.DataFrame, baseline: str = BASELINE, seed: int = SEED) -> pd.DataFrame:
    """One row per machine x workload x technique set with every number of the report's main tables.

    Speedup and memory ratio are ratios of medians against the ``baseline`` set on the same machine and workload,
    with percentile-bootstrap intervals over trials (``bench.stats``); the final metric's difference is a difference
    of means with its interval. Only ``ok`` trials count; the status column says how many there were.
    """
    rows = []
    groups = {k: g for k, g in frame.groupby(["machine", "workload", "technique"], sort=False)}
    for key in _ordered_groups(frame, baseline):
        machine, workload, technique = key
        g = groups[key]
        ok = g[g["status"] == "ok"]
        ref = groups.get((machine, workload, baseline))
        ref_ok = ref[ref["status"] == "ok"] if ref is not None else ref
        is_ref = technique == baseline
        rows.append(_configuration(machine, workload, technique, g, ok, ref_ok, is_ref, seed))
    return _frame(rows)


def _configuration(machine: str, workload: str, technique: str, g: pd.DataFrame, ok: pd.DataFrame,
                   ref: pd.DataFrame | None, is_ref: bool, seed: int) -> dict[str, Any]:
    have_ref = ref is not None and len(ref) > 0
    sps = _values(ok["samples_per_s"])
    row: dict[str, Any] = {
        "machine": machine,
        "workload": workload,
        "technique": technique,
        "is_reference": is_ref,
        "names": g["names"].iloc[0],
        "components": g["components"].iloc[0],
        "n_total": len(g),
        "n_ok": len(ok),
        "status": _status_text(g),
        "skip_reason": next((r for r in g.loc[g["status"] == "skipped", "reason"] if r), None),
        "problems": sorted({f"{s}: {r}" for s, r in zip(g["status"], g["reason"], strict=True)
                            if s in PROBLEM_STATUSES}),
        "sps_median": float(np.median(sps)) if sps else None,
        "sps_iqr": float(np.subtract(*np.percentile(sps, [75, 25]))) if sps else None,
        "sps_rel_iqr": stats.relative_iqr(sps),
        "n_contended": int(sum(bool(c) for c in ok["contended"])),
        "step_time_s": _median(ok["step_time_s"]),
        "first_step_s": _median(ok["first_step_s"]),
        "data_wait_frac": _median(ok["data_wait_frac"]),
        "mfu": _median(ok["mfu"]),
        "compute_dtype": next((d for d in ok["compute_dtype"] if d), None),
        "flops_per_step": _median(ok["flops_per_step"]),
        "peak_bytes": _median(ok["peak_bytes"]),
        "peak_rss_bytes": _median(ok["peak_rss_bytes"]),
        **{f"mem_{c}_bytes": _median(ok[f"mem_{c}_bytes"]) for c in BREAKDOWN},
        "breakdown_skipped": next((s for s in ok["breakdown_skipped"] if s), None),
        "train_time_s": _median(ok["train_time_s"]),
        "steps_trained": _median(ok["steps_trained"]),
        "n_budget_cut": int(sum(bool(c) for c in ok["budget_cut"])),
        "world_size": g["world_size"].iloc[0],
        "sps_per_device_median": _median(ok["samples_per_s_per_device"]),
        "rank_peak_rss_bytes": _per_rank_medians(ok["rank_peak_rss_bytes"]),
        "clean_rss_at_rest_bytes": _median(ok["clean_rss_at_rest_bytes"]),
        "clean_rss_peak_bytes": _median(ok["clean_rss_peak_bytes"]),
        "model_state_bytes": _median(ok["model_state_bytes"]),
        **{f"state_{c}_bytes": _median(ok[f"state_{c}_bytes"]) for c in MODEL_STATE},
        "zero_stage": next((z for z in ok["zero_stage"] if z is not None), None),
        "zero_formula_bytes": next((z for z in ok["zero_formula_bytes"] if z is not None), None),
        "zero_note": next((n for n in ok["zero_note"] if n), None),
    }
    # Model state per rank against a full replica (fp32 AdamW: 16 bytes/param, what DDP holds): the ZeRO paper's
    # measure. Exact bytes, so the interval is the point itself.
    n_params = next((n for n in g["n_params"] if n), None)
    state = row["model_state_bytes"]
    ratio = state / (REPLICA_BYTES_PER_PARAM * n_params) if state and n_params else None
    row.update(n_params=n_params, model_state_ratio=ratio, model_state_ratio_lo=ratio, model_state_ratio_hi=ratio)
    row["noisy"] = row["sps_rel_iqr"] is not None and row["sps_rel_iqr"] > stats.NOISY_IQR_OVER_MEDIAN

    # Speedup: ratio of median throughputs, interval over trials.
    ref_sps = _values(ref["samples_per_s"]) if have_ref else []
    iv = stats.ratio_of_medians(sps, ref_sps, seed=seed) if sps and ref_sps and not is_ref else None
    row.update(_interval_cols("speedup", iv, stats.ratio_verdict(iv, 0.0, "faster", "slower") if iv else None))

    # Memory ratio: the tensor-level peak where both sides have it, else peak RSS (the two are not comparable).
    mine_t, ref_t = _values(ok["peak_bytes"]), _values(ref["peak_bytes"]) if have_ref else []
    mine_r, ref_r = _values(ok["peak_rss_bytes"]), _values(ref["peak_rss_bytes"]) if have_ref else []
    miv, source = None, None
    if not is_ref and mine_t and ref_t:
        miv, source = stats.ratio_of_medians(mine_t, ref_t, seed=seed), "tensors"
    elif not is_ref and mine_r and ref_r:
        miv, source = stats.ratio_of_medians(mine_r, ref_r, seed=seed), "RSS"
    mverdict = stats.ratio_verdict(miv, MEMORY_THRESHOLD, "more", "less") if miv else None
    row.update(_interval_cols("mem_ratio", miv, mverdict))
    row["mem_ratio_source"] = source

    # Final metric: mean +- std over seeds; difference of means against the reference.
    finals = _values(ok["final"])
    metric = next((m for m in g["metric"] if m), None)
    hib = next((h for h in g["higher_is_better"] if h is not None), None)
    row.update(metric=metric, higher_is_better=hib, n_final=len(finals),
               final_mean=float(np.mean(finals)) if finals else None,
               final_std=float(np.std(finals, ddof=1)) if len(finals) > 1 else (0.0 if finals else None))
    ref_finals = _values(ref["final"]) if have_ref else []
    div = stats.difference_of_means(finals, ref_finals, seed=seed) if finals and ref_finals and not is_ref else None
    better, worse = ("better", "worse") if hib is not False else ("worse", "better")
    row.update(_interval_cols("delta", div, stats.difference_verdict(div, better, worse) if div else None))

    # Time to target: median over the trials that reached it; against the reference as "x times sooner".
    target = next((t for t in g["target"] if t is not None), None)
    ttt = _values(ok["time_to_target_s"])
    ref_ttt = _values(ref["time_to_target_s"]) if have_ref else []
    row.update(target=target, n_reached=len(ttt), ttt_median=float(np.median(ttt)) if ttt else None)
    tiv = stats.ratio_of_medians(ref_ttt, ttt, seed=seed) if ttt and ref_ttt and not is_ref else None
    row.update(_interval_cols("ttt_speedup", tiv, stats.ratio_verdict(tiv, 0.0, "sooner", "later") if tiv else None))

    # Parity: every ok trial's first losses against the eager fp32 reference.
    oks = [o for o in ok["parity_ok"] if o is not None]
    diffs = _values(ok["parity_diff"])
    row.update(
        parity_kind=next((k for k in ok["parity_kind"] if k), None),
        parity_ok=all(oks) if oks else None,
        parity_diff=max(diffs) if diffs else None,
        parity_tol=next((t for t in ok["parity_tol"] if t is not None), None),
        parity_note=next((n for n in ok["parity_note"] if n), None),
    )
    return row


# ---- combined techniques ------------------------------------------------------------------------------------


def interactions(configs: pd.DataFrame) -> pd.DataFrame:
    """For each combined set (``a+b``): the observed speedup beside the product of its parts' speedups.

    ``verdict``: "gains multiply" when the product lies inside the observed interval, "gains partly cancel" when
    the combination is below it, "more than multiplicative" when above; "cannot tell" when a part was not measured
    alone (or without an interval).
    """
    rows = []
    by_key = {(r.machine, r.workload, r.technique): r for r in configs.itertuples()}
    for c in configs.itertuples():
        if len(c.components) < 2 or c.is_reference:
            continue
        parts = [by_key.get((c.machine, c.workload, p)) for p in c.components]
        missing = [p for p, r in zip(c.components, parts, strict=True) if r is None or r.speedup is None]
        product = math.prod(r.speedup for r in parts) if not missing else None
        row = {"machine": c.machine, "workload": c.workload, "technique": c.technique,
               "components": c.components, "parts": [None if r is None else r.speedup for r in parts],
               "observed": c.speedup, "observed_lo": c.speedup_lo, "observed_hi": c.speedup_hi,
               "product": product, "ratio": None, "verdict": None}
        if missing or c.speedup is None:
            what = ", ".join(missing) if missing else c.technique
            row["verdict"] = f"cannot tell: {what} has no speedup measured"
        else:
            row["ratio"] = c.speedup / product
            if c.speedup_lo is None:
                row["verdict"] = "cannot tell: not enough repeats for an interval"
            elif product > c.speedup_hi:
                row["verdict"] = "gains partly cancel"
            elif product < c.speedup_lo:
                row["verdict"] = "more than multiplicative"
            else:
                row["verdict"] = "gains multiply"
        rows.append(row)
    cols = ["machine", "workload", "technique", "components", "parts", "observed", "observed_lo", "observed_hi",
            "product", "ratio", "verdict"]
    return _frame(rows, cols)


# ---- claims check -------------------------------------------------------------------------------------------


def registered_claims() -> dict[str, tuple[Any, ...]]:
    """Each registered technique's published claims, by technique name."""
    import techniques

    return {name: tuple(cls.claims) for name, cls in techniques.registry().items() if cls.claims}


_CLAIM_FIELDS = {"speedup": "speedup", "memory_ratio": "mem_ratio", "model_state_ratio": "model_state_ratio"}


def claims_check(configs: pd.DataFrame, machines: dict[str, dict[str, Any]] | None = None,
                 claims: dict[str, tuple[Any, ...]] | None = None) -> pd.DataFrame:
    """Each single technique's published claim beside this sweep's measurement, with a verdict and, when the two
    disagree, why this hardware may differ from the claim's.

    ``verdict``: "within" (the estimate lies in the claimed range), "below" or "above"; ``certain`` is False when
    the estimate is outside the range but its interval still reaches it, None without an interval.
    """
    claims = registered_claims() if claims is None else claims
    machines = machines or {}
    rows = []
    refs = {(r.machine, r.workload): r for r in configs.itertuples() if r.is_reference}
    for c in configs.itertuples():
        if c.is_reference or len(c.names) != 1 or c.names[0] not in claims:
            continue
        for claim in claims[c.names[0]]:
            col = _CLAIM_FIELDS.get(claim.metric)
            if col is None:
                continue
            est, lo, hi = getattr(c, col), getattr(c, f"{col}_lo"), getattr(c, f"{col}_hi")
            row = {"machine": c.machine, "workload": c.workload, "technique": c.technique,
                   "name": c.names[0], "metric": claim.metric, "low": claim.low, "high": claim.high,
                   "setting": claim.setting, "source": claim.source, "measured": est, "measured_lo": lo,
                   "measured_hi": hi, "verdict": None, "certain": None, "why": []}
            if est is None:
                row["verdict"] = "not measured"
                row["why"] = [c.skip_reason] if c.skip_reason else list(c.problems)
            else:
                # Exact bytes may miss a range's edge by shard padding (uneven tensors): allow 1% there.
                slack = MEMORY_THRESHOLD if claim.metric == "model_state_ratio" else 0.0
                if claim.low * (1 - slack) <= est <= claim.high * (1 + slack):
                    row["verdict"] = "within"
                else:
                    row["verdict"] = "below" if est < claim.low else "above"
                if lo is not None and hi is not None:
                    row["certain"] = row["verdict"] == "within" or hi < claim.low or lo > claim.high
                if row["verdict"] != "within":
                    ref = refs.get((c.machine, c.workload))
                    row["why"] = why_hardware_differs(c.names[0], claim, c, ref, machines.get(c.machine, {}))
            rows.append(row)
    cols = ["machine", "workload", "technique", "name", "metric", "low", "high", "setting", "source", "measured",
            "measured_lo", "measured_hi", "verdict", "certain", "why"]
    return _frame(rows, cols)


def _peak(env: dict[str, Any], dtype: str) -> float | None:
    entry = (env.get("peak_flops") or {}).get(dtype) or {}
    return entry.get("flops") if isinstance(entry, dict) else entry


def why_hardware_differs(name: str, claim: Any, config: Any, ref: Any, env: dict[str, Any]) -> list[str]:
    """Reasons, read off this sweep's own measurements, why a result may differ from a published claim; the most
    specific first (the dtype's measured matmul peak, then where the claim was made, then the model's scale)."""
    reasons = []
    dtype = config.compute_dtype
    fp32, low = _peak(env, "float32"), _peak(env, dtype) if dtype else None
    if dtype and dtype != "float32" and fp32 and low:
        ratio = low / fp32
        speed = f"{dtype} matmul peaks at {low / 1e9:,.0f} GFLOP/s here vs {fp32 / 1e9:,.0f} for float32 ({ratio:.2g}x)"
        if ratio < 1:
            flags = env.get("cpu_flags") or {}
            wanted = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16",)}.get(dtype, ())
            absent = [f for f in wanted if flags.get(f) is False]
            unit = f" (no {' / '.join(absent)})" if absent and not str(config.machine).startswith("cuda") else ""
            reasons.append(f"{speed}: no fast {dtype} matmul units{unit}")
        else:
            reasons.append(speed)
    device = str(config.machine).split(",")[0] if config.machine else ""
    if any(w in claim.setting.lower() for w in GPU_WORDS) and not device.startswith("cuda"):
        reasons.append(f"the claim comes from GPUs; this ran on a CPU ({env.get('cpu_model') or 'unknown'})")
    if ref is not None and ref.mfu is not None and ref.mfu < LOW_MFU:
        reasons.append(f"the reference reaches {ref.mfu:.1%} MFU: a model this small is bound by per-op overhead, "
                       "so faster arithmetic helps less")
    if ref is not None and ref.data_wait_frac is not None and ref.data_wait_frac > DATA_WAIT_HIGH:
        reasons.append(f"data loading takes {ref.data_wait_frac:.0%} of the reference's timed window")
    if claim.metric == "model_state_ratio" and config.world_size and config.zero_formula_bytes and config.n_params:
        predicted = config.zero_formula_bytes / (REPLICA_BYTES_PER_PARAM * config.n_params)
        reasons.append(f"with {config.world_size} ranks and fp32 AdamW the ZeRO formula itself predicts "
                       f"{predicted:.2f}x; the claim's ratio needs more ranks (and mixed precision, where the "
                       "fp32 master copy counts as optimizer state)")
    if name == "compile" and config.first_step_s is not None:
        reasons.append(f"compile time is kept out of the speedup (first step {config.first_step_s:.1f} s)")
    if not reasons:
        reasons.append("no hardware difference measured; the workload (model size, batch) differs from the claim's")
    return reasons


# ---- diagnosis ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One "what to try next" item: where it applies and what the numbers say."""

    machine: str
    workload: str | None  # None: across workloads
    technique: str | None  # None: the workload (or the machine) as a whole
    topic: str  # data, overhead, memory, compile, slower, accuracy, parity, claim, interaction, noise
    text: str


def _reference_findings(c: Any) -> list[tuple[str, str]]:
    out = []
    if c.mfu is not None and c.mfu < LOW_MFU:
        out.append(("overhead", f"{c.workload} reaches {c.mfu:.1%} MFU at {c.technique}: per-op overhead dominates "
                                "a model this small; a larger batch or model, or torch.compile (fuses ops), shows "
                                "technique effects closer to published ones"))
    peak = c.peak_bytes
    if peak and c.mem_activations_bytes is not None and c.mem_activations_bytes / peak > ACTIVATIONS_DOMINANT:
        out.append(("memory", f"activations are {c.mem_activations_bytes / peak:.0%} of {c.workload}'s tensor "
                              "peak: activation checkpointing or gradient accumulation cut the peak most"))
    if peak and c.mem_optimizer_bytes is not None and c.mem_optimizer_bytes / peak > OPTIMIZER_DOMINANT:
        out.append(("memory", f"optimizer state is {c.mem_optimizer_bytes / peak:.0%} of {c.workload}'s tensor "
                              "peak: a sharded (ZeRO) or 8-bit optimizer saves most"))
    return out


def fewer_steps(c: Any, ref: Any) -> str | None:
    """'trained 40 of the reference's 61 steps in the time budget' when the time cap cut ``c`` short of ``ref``."""
    if ref is None or not c.n_budget_cut or not c.steps_trained or not ref.steps_trained:
        return None
    if c.steps_trained >= ref.steps_trained:
        return None
    return f"trained {c.steps_trained:.0f} of the reference's {ref.steps_trained:.0f} steps in the time budget"


def _technique_findings(c: Any, ref: Any) -> list[tuple[str, str]]:
    out = []
    if ref is not None and c.first_step_s is not None and ref.first_step_s is not None:
        extra = c.first_step_s - ref.first_step_s
        saved_per_step = (ref.step_time_s - c.step_time_s) if ref.step_time_s and c.step_time_s else None
        steps = c.steps_trained or 0
        gain = saved_per_step * steps if saved_per_step is not None else None
        if extra > ONE_OFF_COST_S and c.first_step_s > 3 * ref.first_step_s and (gain is None or gain < extra):
            head = f"{c.technique}'s first step on {c.workload} takes {extra:.1f} s longer than {ref.technique}'s"
            if saved_per_step and saved_per_step > 0:
                even = math.ceil(extra / saved_per_step)
                out.append(("compile", f"{head}, more than the {gain:.1f} s it saves over the {steps:.0f} steps "
                                       f"trained here; it pays off after about {even:,} steps"))
            else:
                out.append(("compile", f"{head} and its steps are not faster here: it does not pay off"))
    if c.speedup_verdict == "slower":
        mem = ""
        if c.mem_ratio_verdict == "less":
            mem = (f"; it cuts peak memory to {c.mem_ratio:.2f}x ({c.mem_ratio_source}), so use it only when memory "
                   "is the limit")
        out.append(("slower", f"{c.technique} is {1 - c.speedup:.0%} slower than {ref.technique} on {c.workload} "
                              f"({c.speedup:.2f}x){mem}"))
    if c.delta_verdict == "worse":
        head = (f"{c.technique} changes {c.metric} on {c.workload} by {c.delta:+.4g} "
                f"[{c.delta_lo:+.4g}, {c.delta_hi:+.4g}]")
        fewer = fewer_steps(c, ref)
        if fewer and c.parity_ok and c.parity_kind == "exact":
            out.append(("accuracy", f"{head}, but it {fewer} and its first losses match the reference: the gap is "
                                    "training time, not numerics (raise --seconds to compare at equal steps)"))
        elif fewer:
            out.append(("accuracy", f"{head}, but it {fewer}: compare at equal steps (raise --seconds) before "
                                    "judging its numerics"))
        else:
            out.append(("accuracy", f"{head}: check its numerics before adopting it"))
    if c.parity_ok is False:
        head = (f"{c.technique} on {c.workload}: the first losses differ from the fp32 reference by "
                f"{c.parity_diff:.2g} (tolerance {c.parity_tol:.0e})")
        if c.parity_note:
            out.append(("parity", f"{head}; {c.parity_note}"))
        else:
            out.append(("parity", f"{head}: it does not compute the same thing here; check it before trusting "
                                  "its speed"))
    return out


def diagnose(configs: pd.DataFrame, interactions_: pd.DataFrame | None = None,
             claims: pd.DataFrame | None = None) -> list[Finding]:
    """Short, number-backed suggestions: bottlenecks (data wait, per-op overhead, the largest memory category),
    one-off costs larger than their gain, techniques slower than the reference or than claimed, accuracy loss,
    parity failures, gains that cancel when combined, and noisy timings."""
    out: list[Finding] = []
    refs = {(r.machine, r.workload): r for r in configs.itertuples() if r.is_reference}
    for (machine, workload), rows in configs.groupby(["machine", "workload"], sort=False):
        waits = [(r.technique, r.data_wait_frac) for r in rows.itertuples()
                 if r.n_ok and r.data_wait_frac is not None and r.data_wait_frac > DATA_WAIT_HIGH]
        if waits:
            lo, hi = min(w for _, w in waits), max(w for _, w in waits)
            share = f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}-{hi:.0%}"
            sets = "every technique set" if len(waits) == int((rows["n_ok"].astype(int) > 0).sum()) else \
                ", ".join(t for t, _ in waits)
            out.append(Finding(machine, workload, None, "data",
                               f"{workload} waits for data {share} of the timed window ({sets}): the input "
                               "pipeline limits throughput; prefetch or cache batches before tuning the model"))
    for c in configs.itertuples():
        if c.n_ok == 0:
            continue
        ref = refs.get((c.machine, c.workload))
        found = _reference_findings(c) if c.is_reference else _technique_findings(c, ref)
        out += [Finding(c.machine, c.workload, None if c.is_reference else c.technique, t, x) for t, x in found]

    for machine, rows in configs.groupby("machine", sort=False):
        by_reason: dict[str, list[str]] = {}
        for c in rows.itertuples():
            for problem in c.problems:
                by_reason.setdefault(problem, []).append(f"{c.technique} on {c.workload}")
        for problem, where in by_reason.items():
            out.append(Finding(machine, None, None, "failure",
                               f"{len(where)} configuration{'s' if len(where) > 1 else ''} had trials end in "
                               f"{problem} ({', '.join(where)}): fix that before reading their numbers"))
    if claims is not None and not claims.empty:
        below = claims[(claims["verdict"] == "below") & (claims["metric"] == "speedup")]
        for (machine, technique), rows in below.groupby(["machine", "technique"], sort=False):
            first = rows.iloc[0]
            measured = ", ".join(f"{r.measured:.2f}x on {r.workload}" for r in rows.itertuples())
            why = f": {first['why'][0]}" if first["why"] else ""
            out.append(Finding(machine, None, technique, "claim",
                               f"{technique} is slower here than claimed ({measured}; claimed {first['low']:g}-"
                               f"{first['high']:g}x on {first['setting']}){why}"))
    if interactions_ is not None:
        for it in interactions_.itertuples():
            if it.verdict == "gains partly cancel":
                out.append(Finding(it.machine, it.workload, it.technique, "interaction",
                                   f"{it.technique} on {it.workload} gives {it.observed:.2f}x, less than the "
                                   f"{it.product:.2f}x product of its parts: the gains partly cancel"))
    for machine, rows in configs.groupby("machine", sort=False):
        ran = rows[rows["n_ok"].astype(int) > 0]
        noisy = ran[ran["noisy"].astype(bool) | (ran["n_contended"].astype(int) > 0)]
        if len(noisy):
            out.append(Finding(machine, None, None, "noise",
                               f"timings are noisy for {len(noisy)} of {len(ran)} configurations (spread above "
                               f"{stats.NOISY_IQR_OVER_MEDIAN:.0%} of the median, or other processes using the "
                               "CPU): rerun with more repeats on an idle machine before trusting small differences"))
    return out


# ---- everything at once -------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """All the numbers of one report."""

    sweep: Sweep
    baseline: str
    frame: pd.DataFrame
    configs: pd.DataFrame
    interactions: pd.DataFrame
    claims: pd.DataFrame
    findings: list[Finding]

    @property
    def machines(self) -> list[str]:
        return list(dict.fromkeys(self.frame["machine"]))

    @property
    def problems(self) -> pd.DataFrame:
        """Trials that did not finish ok (skipped, failed, oom, timeout, diverged), with their reasons."""
        return self.frame[self.frame["status"] != "ok"]


def analyze(sweep: Sweep, baseline: str = BASELINE, seed: int = SEED,
            claims: dict[str, tuple[Any, ...]] | None = None) -> Analysis:
    frame = records_frame(sweep)
    if frame.empty:
        dirs = ", ".join(str(s.path) for s in sweep.sources)
        raise InputError(f"no trial records in {dirs}")
    if baseline not in set(frame["technique"]):
        known = ", ".join(dict.fromkeys(frame["technique"]))
        raise InputError(f"reference technique set '{baseline}' is not in these records (sets here: {known})")
    configs = configurations(frame, baseline, seed)
    inter = interactions(configs)
    checked = claims_check(configs, sweep.machines, claims)
    return Analysis(sweep, baseline, frame, configs, inter, checked, diagnose(configs, inter, checked))
