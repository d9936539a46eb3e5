"""Findings read off an analysis: each technique's published claim beside this sweep's measurement, and short
"what to try next" items (bottlenecks, one-off costs, slowdowns, quality changes, parity, noise). Every finding
says the number it saw; the thresholds are named constants here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.analyze import bottleneck, pairs, stats
from bench.core import words
from bench.core.words import say
from bench.records.frame import frame_of

REPLICA_BYTES_PER_PARAM = 16  # model state of a full replica with fp32 AdamW: params 4 + grads 4 + two moments 8

# Thresholds of the diagnosis ("what to try next"); each finding says the number it saw.
DATA_WAIT_HIGH = 0.20  # data loading takes more than this fraction of the timed window
LOW_MFU = 0.05  # below this the reference is bound by per-op overhead rather than matmul throughput
ACTIVATIONS_DOMINANT = 0.50  # activations above this share of the tensor peak
OPTIMIZER_DOMINANT = 0.40  # optimizer state above this share of the tensor peak
MEMORY_WORTH = 0.9  # a slower set that cuts the peak at least this much is a memory trade worth naming
ONE_OFF_COST_S = 0.5  # a one-off cost above this (and 3x the reference's) is worth a remark

MODEL_STATE_SLACK = 0.01  # exact bytes may miss a claimed range's edge by shard padding (uneven tensors)

GPU_WORDS = ("gpu", "nvidia", "v100", "a100", "h100", "h200", "tensor core", "cuda", "tpu")
NOT_FASTER = ("slower", stats.EQUIVALENT, stats.INCONCLUSIVE)  # verdicts of a set that did not pay off here


# ---- claims check -------------------------------------------------------------------------------------------


def registered_claims() -> dict[str, tuple[Any, ...]]:
    """Each registered technique's published claims, by technique name."""
    import techniques  # on first use: it imports torch

    return {name: tuple(cls.claims) for name, cls in techniques.registry().items() if cls.claims}


_CLAIM_FIELDS = {"speedup": "speedup", "memory_ratio": "mem_ratio", "model_state_ratio": "model_state_ratio"}


def claims_check(configs: pd.DataFrame, machines: dict[str, dict[str, Any]] | None = None,
                 claims: dict[str, tuple[Any, ...]] | None = None, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each technique's published claim beside this sweep's measurement, with a verdict and, when the two
    disagree, why this hardware may differ from the claim's.

    A set of one technique is measured against the reference. A claim stated for the technique on top of others
    (``Claim.over_rest``: fp8 over bf16 + compile) is also checked on every set holding it, against the same set
    without it (``bf16+fp8+compile`` over ``bf16+compile``), paired by seed from ``frame``'s trials; ``against``
    names that set (None: the reference). ``unmet`` lists the claim's conditions the measured setting does not
    meet (a technique its setting ran with, its model size, its GPU count).

    ``verdict`` (``stats.claim_verdict``): "within" (the whole interval lies in the claimed range), "below" or
    "above" (wholly outside it), "inconclusive" (it reaches across an edge; ``why_not`` says which side the estimate
    is on), "no verdict" (fewer than 3 repeats), or "not measured".
    """
    claims = registered_claims() if claims is None else claims
    machines = machines or {}
    rows = []
    refs = {(r.machine, r.workload): r for r in configs.itertuples() if r.is_reference}
    sets = {(r.machine, r.workload, frozenset(r.components)): r for r in configs.itertuples()}
    for c in configs.itertuples():
        if c.is_reference:
            continue
        for name, component in zip(c.names, c.components, strict=True):
            for claim in claims.get(name, ()):
                if claim.metric not in _CLAIM_FIELDS or (len(c.names) > 1 and not (
                        claim.over_rest and claim.metric == "speedup" and frame is not None)):
                    continue
                rest = None if len(c.names) == 1 else \
                    sets.get((c.machine, c.workload, frozenset(c.components) - {component}))
                row = _claim_row(c, name, claim, rest, frame)
                if row["verdict"] in ("below", "above"):
                    ref = refs.get((c.machine, c.workload))
                    row["why"] = why_hardware_differs(name, claim, c, ref, machines.get(c.machine, {}))
                rows.append(row)
    cols = ["machine", "workload", "technique", "name", "metric", "low", "high", "setting", "source", "measured",
            "measured_lo", "measured_hi", "verdict", "why_not", "why", "against", "unmet"]
    return frame_of(rows, cols)


def _claim_row(c: Any, name: str, claim: Any, rest: Any, frame: pd.DataFrame | None) -> dict[str, Any]:
    """One claim of technique ``name`` on the set ``c``: measured against the reference when ``c`` holds it alone,
    else against ``rest`` (the same set without it; None when the sweep did not run that set)."""
    col = _CLAIM_FIELDS[claim.metric]
    row = {"machine": c.machine, "workload": c.workload, "technique": c.technique, "name": name,
           "metric": claim.metric, "low": claim.low, "high": claim.high, "setting": claim.setting,
           "source": claim.source, "measured": None, "measured_lo": None, "measured_hi": None, "verdict": None,
           "why_not": None, "why": [], "against": None, "unmet": unmet_conditions(claim, c)}
    if len(c.names) == 1:
        est, lo, hi, n = getattr(c, col), getattr(c, f"{col}_lo"), getattr(c, f"{col}_hi"), getattr(c, f"{col}_n", None)
    elif rest is None:
        without = "+".join(p for p, t in zip(c.components, c.names, strict=True) if t != name)
        est = lo = hi = n = None
        row["against"] = without
        if c.n_ok:
            row["why"] = [f"this sweep ran no {without} set to measure {name} against: add it"]
    else:
        row["against"] = rest.technique
        speed = pairs.pair(_trials_of(frame, c), _trials_of(frame, rest), pairs.THROUGHPUT)
        ratio = stats.ratio(speed.mine, speed.ref, speed.cap)  # a sequential design's pairs: its repeated interval
        est, lo, hi, n = ratio.value, ratio.lo, ratio.hi, ratio.n
    row.update(measured=est, measured_lo=lo, measured_hi=hi)
    if est is None:
        row["verdict"] = "not measured"
        row["why"] = row["why"] or ([c.skip_reason] if c.skip_reason else list(c.problems))
        return row
    # Exact bytes may miss a range's edge by shard padding (uneven tensors): allow 1% there.
    exact = claim.metric == "model_state_ratio"
    slack = MODEL_STATE_SLACK if exact else 0.0
    v = stats.claim_verdict(est, lo, hi, n, claim.low * (1 - slack), claim.high * (1 + slack), exact=exact)
    row["verdict"], row["why_not"] = v.word, v.why
    return row


def _trials_of(frame: pd.DataFrame, c: Any) -> pd.DataFrame:
    """The trials of the configuration ``c`` (a row of ``configurations``): ``bench.analyze.pairs`` says which of
    them count, and pairs them, as it does for the speedup column."""
    return frame[(frame["machine"] == c.machine) & (frame["workload"] == c.workload) &
                 (frame["technique"] == c.technique)]


def _count(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def unmet_conditions(claim: Any, c: Any) -> list[str]:
    """The conditions of ``claim`` that the measured set ``c`` does not meet: a technique the claim's setting ran
    with and the set lacks, a model far smaller than the claim's (under half its parameters), fewer GPUs."""
    out = [f"no {t} in the set (the claim's setting ran with it)" for t in getattr(claim, "needs", ())
           if t not in c.names]
    params, n_params = getattr(claim, "params", None), getattr(c, "n_params", None)
    if params and n_params and 2 * n_params < params:
        out.append(f"a model of {_count(n_params)} parameters, {params / n_params:.0f}x smaller than the claim's "
                   f"{_count(params)}")
    devices, ranks = getattr(claim, "devices", None), int(getattr(c, "world_size", None) or 1)
    if devices and ranks < devices:
        out.append(f"{ranks} device{'s' if ranks > 1 else ''} against the claim's {devices} GPUs")
    return out


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
        elif claim.metric == "speedup":  # a faster matmul that did not make the step faster: the rest of it did not
            reasons.append(f"{speed}, so the matmuls are not what held it back: the rest of the step (per-op "
                           f"overhead, casts to and from {dtype}, non-matmul ops) did not speed up")
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
    if config.one_off_s is not None and config.one_off_s > ONE_OFF_COST_S:
        reasons.append(f"its one-off cost is kept out of the speedup ({config.one_off_s:.1f} s in the first step)")
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
    topic: str  # data, overhead, memory, one-off, slower, quality, parity, claim, setting, interaction, noise, failure
    text: str


def _starts_apart(c: Any) -> bool:
    """Its first loss, computed before any update, already differs from the reference's beyond tolerance."""
    return c.parity_start_diff is not None and c.parity_loss_tol is not None and \
        c.parity_start_diff > c.parity_loss_tol


def _reference_parity_finding(c: Any) -> tuple[str, str] | None:
    """The reference set failing its own parity: the workload does not reproduce for a seed, so every "exact" and
    equal-samples comparison on it compares different starts."""
    if c.parity_ok is not False:
        return None
    head = (f"{c.technique} on {c.workload} does not reproduce its own eager fp32 reference (same seed, a fresh "
            f"process): losses differ by {c.parity_loss_diff:.2g}")
    if _starts_apart(c):
        why = (f"already at the first loss, before any update ({c.parity_start_diff:.2g}): build does not give the "
               "same model or first batch for a seed in a fresh process (something in it draws from the global RNG "
               "only in some processes, such as a probe cached per process, or its data order is not seeded)")
    else:
        why = ("after equal first losses: its training steps are not deterministic across processes "
               "(nondeterministic kernels, thread-count-dependent reductions)")
    return ("parity", f"{head}, {why}; its quality comparisons compare different runs until that is fixed")


def _reference_findings(c: Any) -> list[tuple[str, str]]:
    out = []
    parity = _reference_parity_finding(c)
    if parity:
        out.append(parity)
    input_bound = c.data_wait_frac is not None and c.data_wait_frac > DATA_WAIT_HIGH  # its own finding says why
    if c.mfu is not None and c.mfu < LOW_MFU and not input_bound:
        out.append(("overhead", f"{c.workload} reaches {c.mfu:.1%} MFU at {c.technique}: per-op overhead dominates "
                                "a model this small; a larger batch or model, or torch.compile (fuses ops), shows "
                                "technique effects closer to published ones"))
    diagnosis = getattr(c, "phase_diagnosis", None)
    if diagnosis and diagnosis.split(":")[0] in ("copy-bound", "optimizer-bound", "overhead-bound", "launch-bound",
                                                 "host-bound", "host- or launch-bound"):
        # input-bound has its own finding from the timed window's data wait; compute-bound is no news
        out.append(("bottleneck", f"{c.workload}'s step at {c.technique} is {diagnosis}"))
    peak = c.peak_bytes
    if peak and c.mem_activations_bytes is not None and c.mem_activations_bytes / peak > ACTIVATIONS_DOMINANT:
        from techniques.base import Bottleneck

        cut = " or ".join(bottleneck.say(t, r) for t, r in bottleneck.remedies(Bottleneck.ACTIVATIONS))
        out.append(("memory", f"activations are {c.mem_activations_bytes / peak:.0%} of {c.workload}'s tensor "
                              f"peak: {cut or 'a smaller batch'} cut the peak most"))
    if peak and c.mem_optimizer_bytes is not None and c.mem_optimizer_bytes / peak > OPTIMIZER_DOMINANT:
        out.append(("memory", f"optimizer state is {c.mem_optimizer_bytes / peak:.0%} of {c.workload}'s tensor "
                              "peak: a sharded (ZeRO) or 8-bit optimizer saves most"))
    return out


def _one_off_finding(c: Any, ref: Any) -> str | None:
    """A one-off cost (compilation) larger than what the faster steps win back over the quality budget."""
    if ref is None or c.one_off_s is None or c.one_off_s <= ONE_OFF_COST_S:
        return None
    if ref.one_off_s is not None and c.one_off_s <= 3 * ref.one_off_s:
        return None
    head = f"{c.technique} costs {c.one_off_s:.1f} s once on {c.workload} (its first step beyond a steady one)"
    saved = (ref.train_time_s - c.train_time_s) if ref.train_time_s and c.train_time_s else None
    if saved is None and ref.step_time_s and c.step_time_s:
        saved_per_step = ref.step_time_s - c.step_time_s
        if saved_per_step <= 0:
            return f"{head} and its steps are not faster here: it does not pay off"
        return f"{head}; it pays off after about {math.ceil(c.one_off_s / saved_per_step):,} steps"
    if saved is None:
        return None
    if saved <= 0:
        return f"{head} and it trains the quality budget no faster ({c.train_time_s:.2f} s vs {ref.train_time_s:.2f} s)"
    if saved < c.one_off_s:
        runs = math.ceil(c.one_off_s / saved)
        text = (f"{head}, more than the {saved:.2f} s it saves over the quality budget ({c.train_time_s:.2f} vs "
                f"{ref.train_time_s:.2f} s): it pays off only for runs about {runs}x longer")
        if c.speedup_verdict != "faster":
            text += f", and only if its speedup ({say(c.speedup_verdict)} here) is real"
        return text
    return None


def _quality_finding(c: Any) -> tuple[str, str] | None:
    if c.n_cut:
        return ("quality", f"{c.n_cut} quality run(s) of {c.technique} on {c.workload} were cut by the wall-clock "
                           "safety cap (max_train_seconds): raise it, or their quality is not compared")
    if c.exact_quality == "bug":
        return ("quality", f"{c.technique} is exact by design, but its eval curve on {c.workload} differs from the "
                           f"reference's by up to {c.curve_max_rel_diff:.1%} at equal samples and its first steps "
                           "do not match the reference: it is not computing the same thing; check it")
    if c.delta_verdict == "worse":
        head = (f"{c.technique} changes {c.metric} on {c.workload} by {c.delta:+.4g} [{c.delta_lo:+.4g}, "
                f"{c.delta_hi:+.4g}] at equal samples")
        if c.caveats:  # what the record knows about the set explains it better than a guess at numerics
            return ("quality", f"{head}; what it did to this model: {'; '.join(c.caveats)}")
        return ("quality", f"{head}: check its numerics before adopting it")
    return None


def _technique_findings(c: Any, ref: Any) -> list[tuple[str, str]]:
    out = []
    one_off = _one_off_finding(c, ref)
    if one_off:
        out.append(("one-off", one_off))
    if c.speedup_verdict == "slower":
        mem = ""
        if c.mem_ratio_verdict == "less" and c.mem_ratio <= MEMORY_WORTH:
            mem = (f"; it cuts peak memory to {c.mem_ratio:.2f}x ({c.mem_ratio_source}), so use it only when memory "
                   "is the limit")
        elif c.mem_ratio_verdict == "less":  # a few percent less is a side effect, not a reason to pay the time
            mem = f"; its peak memory is only {c.mem_ratio:.2f}x ({c.mem_ratio_source}): not a memory trade either"
        out.append(("slower", f"{c.technique} is {1 - c.speedup:.0%} {say('slower')} than {ref.technique} on "
                              f"{c.workload} ({c.speedup:.2f}x){mem}"))
    if c.speedup_verdict == words.UNEQUAL and getattr(c, "resource_unit", None):
        unit, mine, theirs = c.resource_unit, int(c.resource_mine), int(c.resource_ref)
        per = f"{c.speedup_per_unit:.2f}x per {unit} ({say(c.speedup_per_unit_verdict)})"
        fix = (f"to hold the cores equal, give the reference {mine} threads (without --threads it takes the "
               "machine's cores and each rank 1 thread)" if unit == "core" else
               "read it per device, or against a data-parallel set on as many devices")
        out.append(("resources", f"{c.technique} on {c.workload} ran on {mine} {unit}s against the reference's "
                                 f"{theirs}: its {c.speedup:.2f}x is not a speedup, {per}; {fix}"))
    quality = _quality_finding(c)
    if quality:
        out.append(quality)
    said = quality[1] if quality else ""
    # what the record knows about the set (a tied head frozen with it, another model size, another optimizer):
    # its numbers are that set's, and the advice says so once
    out += [("caveat", f"{c.technique} on {c.workload}: {text}") for text in c.caveats if text not in said]
    if c.parity_ok is False:
        head = (f"{c.technique} on {c.workload}: its first steps differ from the fp32 reference (losses by "
                f"{c.parity_loss_diff:.2g}, parameter distance by {c.parity_distance_diff:.2g}; tolerances for "
                f"{c.parity_kind} sets {c.parity_loss_tol:.0e} and {c.parity_distance_tol:.0e})")
        if _starts_apart(c):
            head += f", already at the first loss before any update ({c.parity_start_diff:.2g})"
        if c.parity_note:
            out.append(("parity", f"{head}; {c.parity_note}"))
        else:
            out.append(("parity", f"{head}: it does not compute the same thing here; check it before trusting "
                                  "its speed"))
    return out


def _data_fix(rows: pd.DataFrame) -> str:
    """What to try for a data wait: the techniques' remedies for an input-bound step, unless this sweep measured a
    set holding one that did not help (then why it may not have, and what else helps)."""
    from techniques.base import Bottleneck

    offered = bottleneck.remedies(Bottleneck.INPUT)
    remedied = bottleneck.refutable(Bottleneck.INPUT)
    measured_sets = [r for r in rows.itertuples() if remedied.intersection(r.names) and r.n_ok and r.speedup is not None
                     and r.speedup_verdict in NOT_FASTER]
    if not measured_sets:
        tried = " or ".join(bottleneck.say(t, r) for t, r in offered)
        return (f"try {tried}, or cache the transformed batches, before tuning the model" if tried else
                "cache the transformed batches, or make the transform cheaper, before tuning the model")
    remedy = next(r for _, r in offered if r.refuted)
    measured = ", ".join(f"{r.technique} {r.speedup:.2f}x {r.speedup_verdict}" for r in measured_sets)
    why = f": {remedy.refuted_why}" if remedy.refuted_why else ""
    return (f"{remedy.refuted} ({measured}{why}), so cache the transformed batches, make the transform cheaper, or "
            "run where cores are idle (a GPU host)")


def _below_claim(technique: str, rows: pd.DataFrame) -> str:
    """A set measured below its technique's claimed speedup: by how much, against what, and why it may be (the
    claim's conditions this setting does not meet first, then what the hardware measured)."""
    first = rows.iloc[0]
    def said(r: Any) -> str:  # against the set without it, the interval too: it says whether that set got slower
        over = f" [{r.measured_lo:.2f}, {r.measured_hi:.2f}] over {r.against}" if r.against else ""
        return f"{r.measured:.2f}x{over} on {r.workload}"

    measured = ", ".join(said(r) for r in rows.itertuples())
    who = technique if technique == first["name"] else f"{first['name']} in {technique}"
    text = (f"{who} is {say('below', words.CLAIMS)} here ({measured}; claimed {first['low']:g}-{first['high']:g}x "
            f"on {first['setting']})")
    if first["against"] and all(r.measured_hi < 1 for r in rows.itertuples()):
        text += f": it lowers {first['against']}'s throughput on this device (the whole interval below 1)"
    if first["unmet"]:
        return f"{text}; not the claim's setting: {'; '.join(first['unmet'])}"
    return f"{text}: {first['why'][0]}" if first["why"] else text


def _setting_findings(configs: pd.DataFrame) -> list[Finding]:
    """A set that runs a technique in a setting it is not meant to run in (its ``setting_caveat``: fp8 without
    compile), for every set whose trials ran."""
    import techniques  # each technique reads its own setting (on first use: it imports torch)

    known = techniques.registry()
    out = []
    for c in configs.itertuples():
        if c.is_reference or not c.n_ok:
            continue
        for name in dict.fromkeys(c.names):
            text = known[name].setting_caveat(tuple(c.names)) if name in known else None
            if text:
                out.append(Finding(c.machine, c.workload, c.technique, "setting", f"{c.technique} on {c.workload}: "
                                                                                 f"{text}"))
    return out


MODEL_SKIP_WORDS = ("its description (", "this model computes its own loss")  # a skip that names the model


def _model_skip_findings(configs: pd.DataFrame) -> list[Finding]:
    """Sets skipped for what the model is (a part its description lacks, a forward that does not trace, a loss it
    computes itself): one finding per reason and workload, naming every set it skipped, so the advice names the line
    to change once rather than per set."""
    out = []
    for (machine, workload), rows in configs.groupby(["machine", "workload"], sort=False):
        by_reason: dict[str, list[str]] = {}
        for c in rows.itertuples():
            reason = c.skip_reason or ""
            if any(w in reason for w in MODEL_SKIP_WORDS):
                name, _, why = reason.partition(": ")
                by_reason.setdefault(why or reason, []).append(c.technique)
        for why, sets in by_reason.items():
            out.append(Finding(machine, workload, None, "model", f"{', '.join(sets)} on {workload} skipped: {why}"))
    return out


def diagnose(configs: pd.DataFrame, interactions_: pd.DataFrame | None = None,
             claims: pd.DataFrame | None = None) -> list[Finding]:
    """Short, number-backed suggestions: bottlenecks (data wait, per-op overhead, the largest memory category),
    one-off costs larger than their gain, techniques slower than the reference or than claimed, quality changes,
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
                               f"pipeline limits throughput; {_data_fix(rows)}"))
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
    out += _setting_findings(configs)
    out += _model_skip_findings(configs)
    if claims is not None and not claims.empty:
        below = claims[(claims["verdict"] == "below") & (claims["metric"] == "speedup")]
        for (machine, technique), rows in below.groupby(["machine", "technique"], sort=False):
            out.append(Finding(machine, None, technique, "claim", _below_claim(technique, rows)))
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
            had = int(ran["n_ok"].astype(int).max())
            more = "5 or more" if had < 5 else f"more than the {had} here"
            out.append(Finding(machine, None, None, "noise",
                               f"timings are noisy for {len(noisy)} of {len(ran)} configurations (spread above "
                               f"{stats.NOISY_IQR_OVER_MEDIAN:.0%} of the median, or other processes using the "
                               f"CPU): differences of that size need more repeats (--repeats {more}), longer timed "
                               "windows (--window-seconds) or a quieter machine"))
    return out


