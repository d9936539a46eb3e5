"""Statistics over trial records: what sped up, by how much, with what certainty, and how fast each set learns.

Everything the report and the summary show is computed here, once, from records (``results.jsonl``) and their
environment (``env.json``); the renderers only format it. Every interval and verdict comes from ``bench.analyze.stats``
(the one engine ``bench compare`` uses too). The pipeline:

- the records come from ``bench.records.reader.load(dirs)``: one or more sweep directories, each with its
  ``env.json`` (machine fingerprint);
- ``bench.records.frame.records_frame(sweep)``: a tidy DataFrame, one row per trial (``RECORD_COLUMNS``);
  continuation trials (``continues``) are set apart from every statistic but quality at equal time
  (``split_continuations``);
- ``configurations(frame)``: one row per machine x workload x technique set:
  - speed: median samples/s and its spread; speedup against the reference set, paired by seed;
  - memory: peaks and the memory ratio; the breakdown; MFU (own dtype; the headline against the device's peak
    is added by ``bench.analyze.mfu.with_mfu``, which needs the environment); one-off costs;
  - quality at equal samples, judged by the set's kind: an ``exact`` set must reproduce the reference's eval curve
    seed by seed (``EXACT_CURVE_RTOL``), ``numeric`` and ``algorithmic`` sets get the metric's difference at the
    full budget, paired by seed, and at equal training time (the reference's clock; a faster set is read on its
    continuation trained on to that clock, ``bench.run.continuation``);
  - time-to-target: censored medians (a miss is +inf and stays in), miss rate, samples-to-target, and the ratio to
    the reference when neither missed;
  - parity and status;
- ``interactions(frame, configs)``: for combined sets, one paired contrast per seed: log(a+b) - log(a) - log(b) +
  log(reference);
- ``bench.analyze.findings``: claims check and "what to try next".

Machines are never pooled: a comparison uses trials of the same machine (and, for pairing, the same sweep). Which
trials count and which pair is ``bench.analyze.pairs``'s rule, the one compare and tune use too.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bench.analyze import bottleneck, findings, mfu, pairs, stats
from bench.analyze.findings import REPLICA_BYTES_PER_PARAM
from bench.core.words import UNEQUAL
from bench.measure.phases import PHASES
from bench.records.frame import BASELINE, BREAKDOWN, MODEL_STATE, PARITY_OK, frame_of, records_frame
from bench.records.reader import InputError, Sweep

log = logging.getLogger(__name__)

PROBLEM_STATUSES = ("failed", "oom", "killed", "timeout", "diverged")

# An exact set's eval curve must match the reference set's at every evaluation, seed by seed, within this fraction
# of how far the reference's metric moved over the run (its range: a fraction of the value itself would blow up
# where the metric starts near 0, an accuracy of 0.1 before training). Exact techniques reorder floating-point sums,
# and some models amplify that over a run, which this tolerance allows for.
EXACT_CURVE_RTOL = 0.01


# ---- helpers ------------------------------------------------------------------------------------------------


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _values(series: pd.Series) -> list[float]:
    return [float(v) for v in series if _ok(v)]


def _median(series: pd.Series) -> float | None:
    v = _values(series)
    return float(np.median(v)) if v else None


def _per_rank_medians(series: pd.Series) -> tuple[float, ...] | None:
    """Rank by rank, the median over trials of per-rank values (trials of one configuration share a world size)."""
    lists = [v for v in series if v]
    if not lists or len({len(v) for v in lists}) != 1 or any(x is None for v in lists for x in v):
        return None
    return tuple(float(np.median(col)) for col in zip(*lists, strict=True))


def _estimate_cols(prefix: str, est: stats.Estimate | None, verdict: stats.Verdict | None) -> dict[str, Any]:
    return {
        prefix: est.value if est else None,
        f"{prefix}_lo": est.lo if est else None,
        f"{prefix}_hi": est.hi if est else None,
        f"{prefix}_n": est.n if est else None,
        f"{prefix}_paired": est.paired if est else None,
        f"{prefix}_verdict": verdict.word if verdict else None,
        f"{prefix}_why": verdict.why if verdict else None,
    }


def _compare(prefix: str, mine: Mapping[Any, float], ref: Mapping[Any, float], log: bool, threshold: float,
             words: tuple[str, str], max_looks: int | None = None) -> dict[str, Any]:
    """The estimate, its verdict, and what a multiplicity correction needs (the verdict's p-value, the threshold
    it was judged at, how many pairs would decide it)."""
    if not mine or not ref:
        return {**_estimate_cols(prefix, None, None), f"{prefix}_p": None, f"{prefix}_threshold": threshold,
                f"{prefix}_needed": None, f"{prefix}_futile": False}
    est = stats.ratio(mine, ref, max_looks) if log else stats.difference(mine, ref)
    v = stats.verdict(est, threshold, *words)
    return {**_estimate_cols(prefix, est, v), f"{prefix}_p": stats.p_value(est, threshold, v.word, *words),
            f"{prefix}_threshold": threshold, f"{prefix}_needed": v.needed, f"{prefix}_futile": v.futile}


def _rows(frame: pd.DataFrame, mask: Sequence[bool]) -> pd.DataFrame:
    """The rows where ``mask`` is true (a plain list of booleans would select columns when empty)."""
    return frame[pd.Series(list(mask), index=frame.index, dtype=bool)]


def _status_text(group: pd.DataFrame) -> str:
    counts = group["status"].value_counts()
    parts = [f"{int(counts.get('ok', 0))}/{len(group)} ok"]
    parts += [f"{int(counts[s])} {s}" for s in ("skipped", *PROBLEM_STATUSES) if s in counts]
    return ", ".join(parts)


def _ordered_groups(frame: pd.DataFrame, baseline: str) -> list[tuple[str, str, str]]:
    """(machine, workload, technique) keys: machines in order of appearance, workloads sorted, the reference set
    first, then technique sets in the order the sweep first ran them."""
    keys = []
    for m in dict.fromkeys(frame["machine"]):
        fm = frame[frame["machine"] == m]
        for w in sorted(set(fm["workload"])):
            labels = list(dict.fromkeys(fm[fm["workload"] == w].sort_values("position", kind="stable")["technique"]))
            labels.sort(key=lambda label: label != baseline)  # stable: the reference first
            keys += [(m, w, t) for t in labels]
    return keys


# ---- per-configuration aggregates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """The smallest change that counts, by quantity (``bench.analyze.stats.THRESHOLDS`` by default)."""

    speed: float = stats.THRESHOLDS["speed"]
    memory: float = stats.THRESHOLDS["memory"]
    time_to_target: float = stats.THRESHOLDS["time_to_target"]
    metric: float = stats.THRESHOLDS["metric"]


def split_continuations(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the planned trials, the continuations): a continuation (``continues``, ``bench.run.continuation``) trains a
    set's budget a second time and on past it, so it counts in quality at equal time only."""
    mask = [c is not None for c in frame["continues"]] if "continues" in frame else [False] * len(frame)
    return _rows(frame, [not m for m in mask]), _rows(frame, mask)


def configurations(frame: pd.DataFrame, baseline: str = BASELINE, thresholds: Thresholds | None = None
                   ) -> pd.DataFrame:
    """One row per machine x workload x technique set with every number of the report's main tables; only ``ok``
    trials count (the status column says how many there were). Continuation trials are set apart
    (``split_continuations``) and used for quality at equal time alone."""
    th = thresholds or Thresholds()
    frame, continued = split_continuations(frame)
    rows = []
    groups = {k: g for k, g in frame.groupby(["machine", "workload", "technique"], sort=False)}
    continuations = {k: g for k, g in continued.groupby(["machine", "workload", "technique"], sort=False)}
    for machine, workload, technique in _ordered_groups(frame, baseline):
        g = groups[(machine, workload, technique)]
        ref = groups.get((machine, workload, baseline))
        is_ref = technique == baseline
        ok = pairs.trials(g)
        ref_ok = pairs.trials(ref) if ref is not None and not is_ref else None
        row = _identity(machine, workload, technique, g, ok, is_ref)
        row["caveats"] += recipe_caveats(ok, ref_ok) if ref_ok is not None else ()
        row.update(_speed(ok, ref_ok, th))
        row.update(_resources(ok, ref_ok, th, row))
        row.update(_memory(ok, ref_ok, th))
        idle = None if is_ref else _trains_nothing(row["names"])
        if idle:
            row.update(_step_not_its_cost(idle))
        row.update(_quality(ok, ref_ok, row["kind"], th, continuations.get((machine, workload, technique))))
        row.update(_time_to_target(ok, ref_ok, th))
        row.update(_parity(ok))
        row.update(_phases(ok, first_device(g)))
        row.update(_distributed(g, ok))
        rows.append(row)
    for prefix in QUALITY_FAMILIES:
        correct_family(rows, prefix)
    for row in rows:
        row["exact_quality"] = exact_quality(row)
    return frame_of(rows)


# The quality comparisons of one report, each a family whose verdicts are corrected for their number (Holm): with
# 30 comparisons at 5% each, one or two chance "better"/"worse" are expected without it.
QUALITY_FAMILIES = ("delta", "delta_at_time")


def correct_family(rows: list[dict[str, Any]], prefix: str) -> None:
    """Holm's step-down correction over every decided verdict of ``prefix`` in ``rows`` (the numeric and
    algorithmic sets x workloads x machines of the report; an exact set's metric difference is a check of its
    curve, not a finding, and is left as it is): a decision whose p-value does not survive becomes inconclusive,
    with the reason.
    Each row records the family's size (``{prefix}_family``) and whether its decision survived."""
    judged = [r for r in rows if r.get("kind") != "exact"]  # an exact set's metric is a check of its curve
    decided = [r for r in judged if r.get(f"{prefix}_verdict") not in (None, *stats.UNDECIDED)]
    family = [r for r in judged if r.get(f"{prefix}_verdict") not in (None, stats.NONE)]
    keep = stats.holm([r.get(f"{prefix}_p") for r in decided], m=len(family))
    for r in rows:
        r[f"{prefix}_family"] = len(family)
        r[f"{prefix}_holm_dropped"] = False
    for r, kept in zip(decided, keep, strict=True):
        if not kept:
            r[f"{prefix}_holm_dropped"] = True
            r[f"{prefix}_why"] = (f"{r[f'{prefix}_verdict']} at p = {r[f'{prefix}_p']:.3f} alone; not after Holm's "
                                  f"correction over the {len(family)} comparisons of this report")
            r[f"{prefix}_verdict"] = stats.INCONCLUSIVE


def _identity(machine: str, workload: str, technique: str, g: pd.DataFrame, ok: pd.DataFrame,
              is_ref: bool) -> dict[str, Any]:
    first = (ok if len(ok) else g).iloc[0]  # a record that ran knows its set best (a killed trial's is bare)
    return {
        "machine": machine, "workload": workload, "technique": technique, "is_reference": is_ref,
        "names": first["names"], "components": first["components"],
        "kind": first["kind"] or "exact",
        "n_total": len(g), "n_ok": len(ok), "status": _status_text(g),
        "skip_reason": next((r for r in g.loc[g["status"] == "skipped", "reason"] if r), None),
        "problems": sorted({f"{s}: {r}" for s, r in zip(g["status"], g["reason"], strict=True)
                            if s in PROBLEM_STATUSES}),
        "notes": sorted({n for ns in g["notes"] for n in ns}),
        "batch_size": next((b for b in g["batch_size"] if b), None),
        "first_step_s": _median(ok["first_step_s"]), "one_off_s": _median(ok["one_off_s"]),
        "probe_s": _median(ok["probe_s"]),
        "world_size": g["world_size"].iloc[0],
        "trained_params": _median(ok["trained_params"]) if "trained_params" in ok else None,
        "caveats": _caveats(ok, tuple(first["names"] or ())) + _size_caveat(ok),
    }


def _size_caveat(ok: pd.DataFrame) -> tuple[str, ...]:
    """A set whose techniques changed the model's size (a leaner architecture, extra heads) trains another model:
    its speed and quality are that model's, which the set's cell and the advice say."""
    trained, whole = (_median(ok[c]) if c in ok else None for c in ("trained_params", "n_params"))
    if not trained or not whole or trained == whole:
        return ()
    return (f"it trains a model of {trained:,.0f} parameters, {trained / whole:.2f}x the workload's {whole:,.0f}: "
            "its speed and quality are that model's",)


def recipe_caveats(ok: pd.DataFrame, ref: pd.DataFrame | None) -> tuple[str, ...]:
    """Where a set does not train with its reference's recipe: another optimizer (class, parameter groups, betas or
    weight decay; the LR is what schedules and LR finders change, so it is not compared) or the workload's own LR
    schedule replaced. The set's cell and the advice say so."""
    if ref is None or not len(ok) or not len(ref):
        return ()
    mine, theirs = (next((r for r in rows["recipe"] if r), None) for rows in (ok, ref))
    if not mine or not theirs:
        return ()
    out = []
    a, b = _optimizer_shape(mine.get("optimizer")), _optimizer_shape(theirs.get("optimizer"))
    if a != b and a and b:
        out.append(f"its optimizer is not the reference's: {_optimizer_text(mine['optimizer'])} against "
                   f"{_optimizer_text(theirs['optimizer'])}")
    if theirs.get("schedule") == "the workload's" and mine.get("schedule") != "the workload's":
        out.append(f"the workload's own LR schedule is {mine.get('schedule') or 'not applied'}")
    return tuple(out)


def _optimizer_shape(optimizer: dict[str, Any] | None) -> Any:
    """An optimizer as it shapes training: its inner class (a sharding wrapper is its technique, not another
    optimizer) and the hyper-parameters its groups hold, other than the LR and the group's size (which freezing
    changes by design)."""
    if not optimizer:
        return None
    name = optimizer["class"]
    inner = name[name.index("(") + 1:-1] if "(" in name else name
    return inner, frozenset(tuple(sorted((k, str(v)) for k, v in g.items() if k not in ("lr", "params")))
                            for g in optimizer["groups"])


def _optimizer_text(optimizer: dict[str, Any]) -> str:
    groups = optimizer["groups"]
    decay = "/".join(f"{g.get('weight_decay', 0):g}" for g in groups)
    return f"{optimizer['class']} with {len(groups)} group(s) (weight decay {decay})"


def _caveats(ok: pd.DataFrame, names: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What makes a set's numbers mean something else than its name says, from what its techniques recorded and
    from the set's technique ``names`` (a setting a technique is not meant to run in), for a set whose trials ran."""
    results = list(ok["technique_results"])
    found_names = dict.fromkeys(name for r in results for name in (r or {}))
    if ok.empty or not (found_names or names):
        return ()
    import techniques  # each technique reads its own results (imported once some are there: it imports torch)

    known = techniques.registry()
    found = [known[name].caveat([(r or {}).get(name) for r in results]) for name in found_names if name in known]
    found += [known[name].setting_caveat(names) for name in names if name in known]
    return tuple(dict.fromkeys(c for c in found if c))


def _trains_nothing(names: Sequence[str]) -> str | None:
    """The technique of a set whose steps train nothing (``Technique.trains`` False: best-of-n), or None."""
    if not names:
        return None
    import techniques

    known = techniques.registry()
    return next((n for n in names if n in known and not known[n].trains), None)


def _step_not_its_cost(name: str) -> dict[str, Any]:
    """A set that trains nothing has a step that costs nothing: its samples/s, MFU and memory ratio against a
    training set would read as a speedup it does not have. Its cost is at inference (its technique's results)."""
    why = f"{name} trains nothing: its step is not its cost, which is at inference (What the techniques found)"
    none = stats.Verdict(stats.NONE, why)
    return {"sps_median": None, "sps_iqr": None, "sps_rel_iqr": None, "mfu": None, "mfu_datasheet": None,
            "achieved_flops": None,
            "noisy": False, **_estimate_cols("speedup", None, none), **_estimate_cols("mem_ratio", None, none)}


def _speed(ok: pd.DataFrame, ref: pd.DataFrame | None, th: Thresholds) -> dict[str, Any]:
    """Speed numbers from the windows that had the cores to themselves (``pairs.timed``); contended ones are
    counted, so the report can say so."""
    n_contended = int(sum(bool(c) for c in ok["contended"]))
    speedup = pairs.pair(ok, ref, pairs.THROUGHPUT)
    ok = pairs.timed(ok)
    sps = _values(ok["samples_per_s"])
    row = {
        "sps_median": float(np.median(sps)) if sps else None,
        "sps_iqr": float(np.subtract(*np.percentile(sps, [75, 25]))) if sps else None,
        "sps_rel_iqr": stats.relative_iqr(sps),
        "n_speed": len(sps),
        "n_contended": n_contended,
        "step_time_s": _median(ok["step_time_s"]),
        "data_wait_frac": _median(ok["data_wait_frac"]),
        "mfu": _median(ok["mfu"]),
        "mfu_datasheet": _median(ok["mfu_datasheet"]),
        "achieved_flops": _median(ok["achieved_flops"]),  # the headline MFU's numerator (bench.analyze.mfu)
        "peak_flops": _median(ok["peak_flops"]),
        "compute_dtype": next((d for d in ok["compute_dtype"] if d), None),
        "flops_per_step": _median(ok["flops_per_step"]),
    }
    row["noisy"] = row["sps_rel_iqr"] is not None and row["sps_rel_iqr"] > stats.NOISY_IQR_OVER_MEDIAN
    row.update(_compare("speedup", speedup.mine, speedup.ref, True, th.speed, ("faster", "slower"), speedup.cap))
    row["max_looks"] = speedup.cap
    row["n_added"] = int(sum(a == "sequential" for a in ok["added_by"]))
    return row


def _units(ok: pd.DataFrame) -> tuple[int | None, int | None]:
    """(cores, devices) a set's trials ran on: the most common value over its trials (they share the sweep's
    settings), None where no trial recorded it."""
    out = []
    for column in ("cores", "devices"):
        found = [int(v) for v in ok[column] if _ok(v)] if column in ok else []
        out.append(max(set(found), key=found.count) if found else None)
    return out[0], out[1]


def _resources(ok: pd.DataFrame, ref: pd.DataFrame | None, th: Thresholds, row: dict[str, Any]) -> dict[str, Any]:
    """The resources of a set against its reference's. Across unequal ones (a 2-rank set beside a 1-thread
    reference, 4 GPUs against 1) the throughput ratio is no speedup: its answer becomes "unequal resources" (never
    "faster"), with why, and the ratio per core (per device on GPUs) gets the answer instead, on the same pairs."""
    cores, devices = _units(ok)
    out: dict[str, Any] = {"cores": cores, "devices": devices, "resource_unit": None, "resource_mine": None,
                           "resource_ref": None, **_estimate_cols("speedup_per_unit", None, None)}
    if ref is None or row["is_reference"] or not known_speedup(row):
        return out
    ref_cores, ref_devices = _units(ref)
    unit, mine, theirs = ("device", devices, ref_devices) if (devices or ref_devices) else ("core", cores, ref_cores)
    if not mine or not theirs or mine == theirs:
        return out
    speed = pairs.pair(ok, ref, pairs.THROUGHPUT)
    per = _compare("speedup_per_unit", {k: v / mine for k, v in speed.mine.items()},
                   {k: v / theirs for k, v in speed.ref.items()}, True, th.speed, ("faster", "slower"), speed.cap)
    plural = lambda n: f"{n} {unit}{'s' if n != 1 else ''}"  # noqa: E731
    out.update(per, resource_unit=unit, resource_mine=mine, resource_ref=theirs,
               speedup_verdict=UNEQUAL, speedup_futile=False,
               speedup_why=f"{plural(mine)} against the reference's {plural(theirs)}: the throughput ratio is not a "
                           f"speedup; per {unit} it is {per['speedup_per_unit']:.2f}x")
    return out


def known_speedup(row: Mapping[str, Any]) -> bool:
    return _ok(row.get("speedup"))


def first_device(g: pd.DataFrame) -> str:
    return next((d for d in g["device"] if d), "cpu")


def _phases(ok: pd.DataFrame, device: str) -> dict[str, Any]:
    """Where the step's time goes: the median over trials of each phase's share and of the phase pass's step
    time, and the diagnosis those medians point to (None when no trial ran a phase pass). Trials whose timed window
    stayed contended are left out, as from the speed numbers (their phase pass ran beside the same other work);
    ``with_diagnoses`` narrows the advice with the machine's peaks and the sweep's own measurements."""
    ok = pairs.timed(ok)
    shares = {name: _median(ok[f"phase_{name}_share"]) for name in PHASES}
    row: dict[str, Any] = {f"phase_{name}_share": v for name, v in shares.items()}
    row["phase_step_s"] = _median(ok["phase_step_s"])
    row["phase_device"] = device
    # a GPU's busy fraction and mean kernel time (None where not measured: the diagnosis then says so)
    row["phase_device_busy"], row["phase_device_op_s"] = _median(ok["phase_device_busy"]), _median(ok["phase_device_op_s"])
    names = tuple(ok["names"].iloc[0]) if len(ok) else ()
    complete = all(v is not None for v in shares.values())
    row["phase_diagnosis"] = bottleneck.diagnose(  # type: ignore[arg-type]
        shares, names, device, busy=row["phase_device_busy"], op_s=row["phase_device_op_s"]) if complete else None
    return row


def with_diagnoses(configs: pd.DataFrame, machines: Mapping[str, dict[str, Any]]) -> pd.DataFrame:
    """The phase diagnoses again, knowing what one set alone does not: the machine's calibrated matmul peaks (a
    lower precision is suggested only where it beats fp32), and which sets this sweep measured no faster than the
    reference on the same workload while holding a remedy for the bottleneck (``bottleneck.refutable``)."""
    if configs.empty or "phase_diagnosis" not in configs:
        return configs
    from techniques.base import Bottleneck

    out = configs.copy()
    rows = list(out.itertuples())  # once: itertuples costs a column lookup per column, and frames here are wide
    by_workload = collections.defaultdict(list)
    for r in rows:
        by_workload[(r.machine, r.workload)].append(r)
    for i, c in zip(out.index, rows, strict=True):
        shares = {name: getattr(c, f"phase_{name}_share") for name in PHASES}
        if not all(_ok(v) for v in shares.values()):
            continue
        env = machines.get(c.machine) or {}
        peaks = {d: (p or {}).get("flops") for d, p in (env.get("peak_flops") or {}).items()}
        same = by_workload[(c.machine, c.workload)] if pd.notna(c.machine) and pd.notna(c.workload) else []
        refuted = {}
        for kind in Bottleneck:
            remedied = bottleneck.refutable(kind)
            sets = [f"{r.technique} {r.speedup:.2f}x" for r in same
                    if remedied.intersection(r.names) and _ok(r.speedup)
                    and r.speedup_verdict in findings.NOT_FASTER]
            if sets:
                refuted[kind] = ", ".join(sets)
        busy, op_s = (v if _ok(v) else None for v in (c.phase_device_busy, c.phase_device_op_s))
        out.at[i, "phase_diagnosis"] = bottleneck.diagnose(shares, tuple(c.names), c.phase_device, peaks, refuted,
                                                           busy=busy, op_s=op_s)
    return out


def _median_held(column: pd.Series) -> dict[str, int] | None:
    """Per named held part (teacher, reference policy), the median of its bytes over the trials that name it."""
    parts: dict[str, list[int]] = {}
    for held in column:
        for name, nbytes in (held or {}).items():
            parts.setdefault(name, []).append(nbytes)
    return {name: int(_median(pd.Series(v))) for name, v in parts.items()} or None


def _memory(ok: pd.DataFrame, ref: pd.DataFrame | None, th: Thresholds) -> dict[str, Any]:
    """Peaks, and the ratio on the tensor-level peak where both sides have it for every trial, else on peak RSS
    (the two are not comparable)."""
    row = {"peak_bytes": _median(ok["peak_bytes"]), "peak_rss_bytes": _median(ok["peak_rss_bytes"]),
           **{f"mem_{c}_bytes": _median(ok[f"mem_{c}_bytes"]) for c in BREAKDOWN},
           "mem_held": _median_held(ok["mem_held"]),
           "breakdown_skipped": next((s for s in ok["breakdown_skipped"] if s), None)}
    mem = pairs.pair(ok, ref, pairs.PEAK_MEMORY)
    if mem.source is None:
        row.update(_estimate_cols("mem_ratio", None, None))
    else:
        row.update(_compare("mem_ratio", mem.mine, mem.ref, True, th.memory, ("more", "less"), mem.cap))
    row["mem_ratio_source"] = mem.source
    return row


def _quality(ok: pd.DataFrame, ref: pd.DataFrame | None, kind: str, th: Thresholds,
             continued: pd.DataFrame | None = None) -> dict[str, Any]:
    """Quality at equal samples, and at equal time (``_equal_time``, with the set's continuations). Runs cut by
    the safety cap are counted and left out."""
    with_quality = _rows(ok, [bool(c) for c in ok["curve"]])
    complete = pairs.quality_runs(ok)
    finals = _values(complete["final"])
    metric = next((m for m in ok["metric"] if m), None)
    hib = next((h for h in ok["higher_is_better"] if h is not None), None)
    row: dict[str, Any] = {
        "metric": metric, "higher_is_better": hib, "n_final": len(finals),
        "n_cut": int(sum(bool(c) for c in with_quality["cut"])),
        "budget_samples": next((b for b in with_quality["budget_samples"] if b), None),
        "final_mean": float(np.mean(finals)) if finals else None,
        "final_std": float(np.std(finals, ddof=1)) if len(finals) > 1 else (0.0 if finals else None),
        "train_time_s": _median(complete["train_time_s"]),
        **_stopped_early(complete),
    }
    ref_complete = pairs.quality_runs(ref) if ref is not None else None
    words = ("better", "worse") if hib is not False else ("worse", "better")
    margin = next((float(m) for m in ok["margin"] if _ok(m)), None)
    row["margin"] = margin
    threshold = margin if margin is not None else th.metric
    delta = pairs.pair(ok, ref, pairs.FINAL_METRIC)
    row.update(_compare("delta", delta.mine, delta.ref, False, threshold, words))
    row.update(_curve_match(complete, ref_complete) if kind == "exact" else
               {"curve_max_rel_diff": None, "curve_pairs": 0, "curve_points": 0})
    same = (kind == "exact" and row["curve_pairs"] > 0 and row["curve_max_rel_diff"] is not None
            and row["curve_max_rel_diff"] <= EXACT_CURVE_RTOL)
    row["quality_same_exact"] = same
    clocked = pairs.quality_clocks(ok)
    ref_clocked = pairs.quality_clocks(ref) if ref is not None else None
    row.update(_equal_time(clocked, ref_clocked, words, threshold, continued if kind != "exact" else None))
    # a set with no complete quality run reads no clock: nothing of the reference's to say on its row
    row["clock_contended"] = contended_clocks(ok, ref) if len(complete) else None
    if row["clock_contended"] and row["delta_at_time_verdict"] in (None, stats.NONE) and ref_complete is not None \
            and len(ref_complete):
        row["delta_at_time_why"] = f"{row['delta_at_time_why'] or 'no interval'}; {row['clock_contended']}"
    return row


def contended_clocks(ok: pd.DataFrame, ref: pd.DataFrame | None) -> str | None:
    """Which complete quality runs (the set's, and its reference's) ran beside other processes even after their
    retries, in a few words: their clocks are left out of quality at equal time and time to target; None: none."""
    parts = []
    for whose, rows in (("its", ok), ("the reference's", ref)):
        if rows is None:
            continue
        runs = pairs.quality_runs(rows)
        hit = [(seed, frac) for seed, c, frac in zip(runs["seed"], runs["quality_contended"],
                                                     runs["quality_contention_frac"], strict=True) if c]
        if hit:
            seeds = ", ".join(f"seed {seed}" + (f" {frac:.0%}" if _ok(frac) else "") for seed, frac in hit)
            parts.append(f"{whose} {seeds}")
    if not parts:
        return None
    n = sum(p.count("seed ") for p in parts)
    return (f"{n} contended quality run{'s' if n > 1 else ''} left out ({'; '.join(parts)} of the cores used by "
            "other processes): a clock shared with other work is not this machine's")


def _stopped_early(complete: pd.DataFrame) -> dict[str, Any]:
    """How many complete runs a technique ended early (early stopping) and the median share of the budget's samples
    the stopped ones trained: their final metric is the metric at the stop, not at equal samples."""
    fractions = [t / b for t, b, stop in zip(complete["samples_trained"], complete["budget_samples"],
                                             complete["stopped_by"], strict=True) if stop and _ok(t) and _ok(b) and b]
    return {"n_stopped": sum(bool(s) for s in complete["stopped_by"]),
            "samples_frac_median": float(np.median(fractions)) if fractions else None}


EXACT_QUALITY = {
    "identical": "its eval curves match the reference's seed by seed",
    "drift": "its first steps match the reference (parity ok) and its metric at the full budget is equivalent or "
             "not significantly different, but its eval curves drift apart: floating-point rounding amplified over "
             "the run",
    "unverified drift": "its eval curves drift apart, and without parity or a verdict on its metric difference "
                        "(fewer than 3 seeds) rounding cannot be told from a real change",
    "expected mismatch": "its eval curves differ for a known reason (the parity note says which)",
    "drift changes quality": "its first steps match the reference, yet its metric at the full budget differs: "
                             "floating-point rounding amplified into a real difference",
    "bug": "its first steps do not match the reference: it does not compute the same thing",
}


def exact_quality(c: dict[str, Any]) -> str | None:
    """How an exact set's quality compares with the reference's (a key of ``EXACT_QUALITY``), or None for other
    kinds or without curves on both sides."""
    if c["kind"] != "exact" or c["is_reference"] or not c["curve_pairs"]:
        return None
    if c["quality_same_exact"]:
        return "identical"
    if c["parity_note"]:
        return "expected mismatch"
    if c["parity_ok"] is False:
        return "bug"
    if c["delta_verdict"] in ("better", "worse"):
        return "drift changes quality"
    no_change = c["delta_verdict"] == stats.EQUIVALENT or (
        c["delta_verdict"] == stats.INCONCLUSIVE and _ok(c["delta_lo"]) and c["delta_lo"] <= 0 <= c["delta_hi"])
    if c["parity_ok"] is None or not no_change:
        return "unverified drift"
    return "drift"


def _curve_match(mine: pd.DataFrame, ref: pd.DataFrame | None) -> dict[str, Any]:
    """The largest difference between an exact set's eval curve and the reference's, over the seeds both ran and
    the sample counts both evaluated at, as a fraction of the range the reference's metric covered in that seed."""
    out = {"curve_max_rel_diff": None, "curve_pairs": 0, "curve_points": 0}
    if ref is None or ref.empty:
        return out
    ref_curves = {k: c for k, c in zip(ref["key"], ref["curve"], strict=True)}
    worst, pairs, points = 0.0, 0, 0
    for key, curve in zip(mine["key"], mine["curve"], strict=True):
        theirs = {p[0]: p[-1] for p in ref_curves.get(key, []) if _ok(p[-1])}
        shared = [(p[-1], theirs[p[0]]) for p in curve if p[0] in theirs and _ok(p[-1])]
        if not shared:
            continue
        pairs += 1
        points += len(shared)
        scale = max(max(theirs.values()) - min(theirs.values()), 1e-12)
        worst = max(worst, *(abs(a - b) / scale for a, b in shared))
    if pairs:
        out.update(curve_max_rel_diff=worst, curve_pairs=pairs, curve_points=points)
    return out


def metric_at_time(curve: Sequence[Sequence[Any]], seconds: float) -> float | None:
    """The metric of the last evaluation whose training clock is at most ``seconds``."""
    reached = [p for p in curve if _ok(p[2]) and p[2] <= seconds and _ok(p[-1])]
    return float(reached[-1][-1]) if reached else None


EQUAL_TIME_EMPTY = {"equal_time_s": None, "equal_time_faster": 0, "equal_time_continued": 0,
                    "equal_time_beyond_samples": None, "equal_time_until_s": None, "equal_time_blocked": None,
                    "equal_time_cut": None}


def _equal_time(mine: pd.DataFrame, ref: pd.DataFrame | None, words: tuple[str, str], threshold: float,
                continued: pd.DataFrame | None = None) -> dict[str, Any]:
    """The metric at equal training time (for sets that change how fast a model learns or how fast a step runs,
    the other half of the question), seed by seed at the clock of the reference's run of that seed (the
    reference's median clock, ``equal_time_s``, for a seed it lacks).

    A run that finished sooner than that clock is read on its continuation's curve (``bench.run.continuation``: the
    same budget, then trained on to the reference's clock) when one trained past the budget, so the set gets the
    time its speed buys; otherwise, and for a slower run, on its own curve (a faster run's then ends early). The
    row counts the faster seeds (``equal_time_faster``), those read on a continuation (``equal_time_continued``),
    their median samples beyond the budget and clock reached, why a continuation was not possible
    (``equal_time_blocked``) and why one ended before the clock (``equal_time_cut``).
    """
    budget = _median(ref["train_time_s"]) if ref is not None and not ref.empty else None
    if budget is None or mine.empty:
        return {**EQUAL_TIME_EMPTY, **_compare("delta_at_time", {}, {}, False, threshold, words)}
    clocks = pairs.values(ref, "train_time_s")
    runs, blocked = _continuations(continued)
    at, beyond, until, cut, faster = {}, [], [], [], 0
    for key, curve, own in zip(mine["key"], mine["curve"], mine["train_time_s"], strict=True):
        clock = clocks.get(key, budget)
        if _ok(own) and own < clock:
            faster += 1
            run = runs.get(key)
            if run is not None:
                curve, info = run
                beyond.append(info["samples_beyond_budget"])
                until.append(info["train_time_s"])
                if not info["reached"] and info["why_not"]:
                    cut.append(info["why_not"])
        at[key] = metric_at_time(curve, clock)
    ref_at = {k: metric_at_time(c, clocks.get(k, budget)) for k, c in zip(ref["key"], ref["curve"], strict=True)}
    at = {k: v for k, v in at.items() if v is not None}
    ref_at = {k: v for k, v in ref_at.items() if v is not None}
    return {"equal_time_s": budget, "equal_time_faster": faster, "equal_time_continued": len(beyond),
            "equal_time_beyond_samples": float(np.median(beyond)) if beyond else None,
            "equal_time_until_s": float(np.median(until)) if until else None,
            "equal_time_blocked": "; ".join(dict.fromkeys(blocked)) or None,
            "equal_time_cut": "; ".join(dict.fromkeys(cut)) or None,
            **_compare("delta_at_time", at, ref_at, False, threshold, words)}


def _continuations(continued: pd.DataFrame | None) -> tuple[dict[Any, tuple[list, dict]], list[str]]:
    """{key: (curve, continuation)} of the continuations that trained past the budget (or found the clock reached
    within it), and the reasons of those that could not (skipped by their set's blocker, or not run by the
    trial)."""
    runs: dict[Any, tuple[list, dict]] = {}
    blocked: list[str] = []
    if continued is None:
        return runs, blocked
    for key, status, reason, curve, info, cut in zip(continued["key"], continued["status"], continued["reason"],
                                                     continued["curve"], continued["continuation"],
                                                     continued["cut"], strict=True):
        if status == "skipped" and reason:
            blocked.append(reason)
        elif status == "ok" and info and not cut:
            if info["samples_beyond_budget"] > 0 or info["reached"]:  # reached in the budget: that run was slower
                runs[key] = (curve, info)
            elif not info["reached"] and info["why_not"]:
                blocked.append(info["why_not"])
    return runs, blocked


def _time_to_target(ok: pd.DataFrame, ref: pd.DataFrame | None, th: Thresholds) -> dict[str, Any]:
    """Censored medians (a miss is +inf), the miss rate, and the ratio to the reference's time-to-target when
    neither side missed in any trial."""
    runs = pairs.quality_clocks(ok)  # a contended run's clock is not this machine's (``contended_clocks``)
    target = next((t for t in ok["target"] if t is not None), None)
    ttt = list(runs["time_to_target_s"])
    row: dict[str, Any] = {
        "target": target, "n_ttt": len(ttt),
        "ttt_median": stats.censored_median(ttt), "ttt_miss_rate": stats.miss_rate(ttt),
        **_median_interval(ttt),
        "ttt_one_off_median": stats.censored_median(list(runs["time_to_target_one_off_s"])),
        "stt_median": stats.censored_median(list(runs["samples_to_target"])),
    }
    times = pairs.pair(ok, ref, pairs.TIME_TO_TARGET)
    missed = any(times.misses)
    contended = contended_clocks(ok, ref) if target is not None else None
    if ref is None or target is None or missed or not times.mine or not times.ref:
        row.update(_estimate_cols("ttt_ratio", None, None))
        if ref is not None and missed:
            row["ttt_ratio_why"] = "misses on one side: compare the censored medians and miss rates"
        elif contended:
            row["ttt_ratio_why"] = contended
        return row
    row.update(_compare("ttt_ratio", times.mine, times.ref, True, th.time_to_target, ("later", "sooner")))
    if contended and row["ttt_ratio_verdict"] in (None, stats.NONE):
        row["ttt_ratio_why"] = f"{row['ttt_ratio_why'] or 'no interval'}; {contended}"
    return row


MIN_MEDIAN_COVERAGE = 0.9  # below it (fewer than 5 seeds) an interval of the median is too weak to show


def _median_interval(values: list[Any]) -> dict[str, Any]:
    found = stats.median_interval(values)
    if found is None or found[2] < MIN_MEDIAN_COVERAGE:
        return {"ttt_lo": None, "ttt_hi": None, "ttt_coverage": None}
    return dict(zip(("ttt_lo", "ttt_hi", "ttt_coverage"), found, strict=True))


_PARITY_RANK = {"mismatch": 0, "inconclusive": 1, "ok": 2}  # the set's answer is its worst trial's
PARITY_COLUMNS = ("parity_loss_diff", "parity_distance_diff", "parity_loss_tol", "parity_distance_tol",
                  "parity_harmless_drift", "parity_bug_loss_drift", "parity_bug_distance_drift", "parity_k_tol")


def _reason_of(note: str) -> str:
    """A parity note's reason: records before the shared vocabulary began theirs with their own label."""
    return note.removeprefix("expected mismatch: ")


def _parity(ok: pd.DataFrame) -> dict[str, Any]:
    """The set's parity: its worst trial's answer (mismatch, then inconclusive, then ok), and that trial's drifts
    and tolerances (calibrated per reference, so they differ by seed); the answers' counts beside it."""
    rows = [r for r in ok.to_dict("records") if r["parity_answer"]]
    start = _values(ok["parity_start_diff"])
    out: dict[str, Any] = dict.fromkeys(PARITY_COLUMNS)
    out.update(parity_kind=next((k for k in ok["parity_kind"] if k), None), parity_ok=None, parity_answer=None,
               parity_answers={}, parity_start_diff=max(start) if start else None,
               parity_note=next((_reason_of(n) for n in ok["parity_note"] if n), None))
    if not rows:
        return out
    worst = min(rows, key=lambda r: (_PARITY_RANK[r["parity_answer"]],
                                     -(r["parity_loss_diff"] or 0.0) / max(r["parity_loss_tol"] or 1.0, 1e-300)))
    answers = [r["parity_answer"] for r in rows]
    out.update({c: worst[c] for c in PARITY_COLUMNS})
    out.update(parity_answer=worst["parity_answer"], parity_ok=PARITY_OK[worst["parity_answer"]],
               parity_answers={a: answers.count(a) for a in _PARITY_RANK if a in answers})
    return out


def _distributed(g: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    row = {
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
    return row


# ---- combined techniques ------------------------------------------------------------------------------------


MULTIPLY = "consistent with multiplying"  # an interaction whose interval contains 1: no departure shown


def interactions(frame: pd.DataFrame, configs: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """For each combined set (``a+b``): the observed speedup beside the product of its parts', and the paired
    contrast log(a+b) - log(a) - log(b) + log(reference) per seed (one joint estimate, so the uncertainty of all
    four sets is counted once).

    ``verdict``: "consistent with multiplying" (the contrast's interval contains 1), "gains partly cancel" (below 1),
    "more than multiplicative" (above 1), or "no verdict" with the reason.
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
               "product": product, "ratio": None, "ratio_lo": None, "ratio_hi": None, "verdict": None, "why": None}
        if missing or c.speedup is None:
            row["verdict"] = stats.NONE
            row["why"] = f"{', '.join(missing) if missing else c.technique} has no speedup measured"
            rows.append(row)
            continue
        here = frame[(frame["machine"] == c.machine) & (frame["workload"] == c.workload)]
        sps = {label: pairs.samples(rows, pairs.THROUGHPUT) for label, rows in here.groupby("technique")}
        terms = [(sps.get(c.technique, {}), 1.0), *((sps.get(p, {}), -1.0) for p in c.components),
                 (sps.get(baseline, {}), float(len(c.components) - 1))]
        est = stats.contrast(terms, log=True, max_looks=pairs.cap(pairs.timed(here)))
        v = stats.verdict(est, 0.0, "more than multiplicative", "gains partly cancel")
        row.update(ratio=est.value, ratio_lo=est.lo, ratio_hi=est.hi,
                   verdict=MULTIPLY if v.word == stats.INCONCLUSIVE else v.word, why=v.why)
        rows.append(row)
    cols = ["machine", "workload", "technique", "components", "parts", "observed", "observed_lo", "observed_hi",
            "product", "ratio", "ratio_lo", "ratio_hi", "verdict", "why"]
    return frame_of(rows, cols)


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
    findings: list[findings.Finding]
    thresholds: Thresholds = field(default_factory=Thresholds)
    continuations: pd.DataFrame | None = None  # continuation trials (bench.run.continuation), apart from ``frame``

    @property
    def machines(self) -> list[str]:
        return list(dict.fromkeys(self.frame["machine"]))

    @property
    def problems(self) -> pd.DataFrame:
        """Trials that did not finish ok (skipped, failed, oom, timeout, diverged), with their reasons."""
        return self.frame[self.frame["status"] != "ok"]


def analyze(sweep: Sweep, baseline: str = BASELINE, thresholds: Thresholds | None = None,
            claims: dict[str, tuple[Any, ...]] | None = None) -> Analysis:
    full = records_frame(sweep)
    frame, continued = split_continuations(full)
    if frame.empty:
        dirs = ", ".join(str(s.path) for s in sweep.sources)
        raise InputError(f"no trial records in {dirs}")
    if baseline not in set(frame["technique"]):
        known = ", ".join(dict.fromkeys(frame["technique"]))
        raise InputError(f"reference technique set '{baseline}' is not in these records (sets here: {known})")
    th = thresholds or Thresholds()
    configs = mfu.with_mfu(with_diagnoses(configurations(full, baseline, th), sweep.machines), sweep.machines)
    inter = interactions(frame, configs, baseline)
    checked = findings.claims_check(configs, sweep.machines, claims, frame)
    return Analysis(sweep, baseline, frame, configs, inter, checked, findings.diagnose(configs, inter, checked), th,
                    continued)
