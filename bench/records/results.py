"""The trial record (schema 2: one JSON line per trial) and the append-only JSONL store.

A record is made of the trial's typed stage results (``bench.trial``): what was built, the speed window, the
quality run, parity against the eager fp32 reference, memory and energy. Each section is a frozen dataclass whose
fields carry their documentation (``metadata["doc"]``); ``docs/records.md`` is generated from them
(``python -m bench.dev.schema_doc``), so the documentation cannot drift from the code. Units are in the field names or
fixed: seconds, bytes, FLOPs, joules, samples.

Schema 1 records (before the measurement protocol v2) are read for their speed and memory sections only: their
final metric came from a training run whose length depended on speed, so it is dropped and the record says why.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.text import shown
from bench.measure.stages import MEASURED

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
STATUSES = ("ok", "skipped", "failed", "oom", "killed", "timeout", "diverged")

# How a process says it ran out of memory: torch's CPU and CUDA allocators, C++ and Python. One list, so the same
# cause gets the same status whether the trial caught the error or died of it.
_MEMORY_EXHAUSTED = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc",
                     "memoryerror")


def memory_exhausted(text: str) -> bool:
    """True when an error message or a process's last lines say an allocation failed."""
    low = text.lower()
    return any(pattern in low for pattern in _MEMORY_EXHAUSTED)
MODES = ("speed", "quality", "both")

# Parity tolerances by kind, in one place: (max relative loss difference, max relative parameter-distance
# difference) over the first ``parity_steps`` optimizer steps against the eager fp32 reference. Measured on the tiny
# workloads over 8 steps: exact techniques differ by <= 1.4e-7 (checkpointing: 0), bf16/fp16 by <= 4.3e-3 (loss)
# and 4.0e-3 (distance); a 10% learning-rate change by 1.3-1.9e-2 (loss) and 0.100-0.103 (distance), a 1% change by
# 1.4-2.4e-3 and 0.010. So exact sets catch a 1% learning-rate bug, numeric ones a 10% bug.
# Other processes used more than this fraction of the CPUs while a trial measured (its timed window or its quality
# run): that measurement's clock is not this machine's. The trial retries such a measurement; the analysis leaves
# one that stayed contended out of what reads its clock. Here, not in frame.py, because the trial imports it and
# frame.py imports pandas, whose pyarrow starts a thread: the fork server refuses imports that start threads.
CONTENDED_ABOVE = 0.10

PARITY_TOLERANCES = {"exact": (1e-3, 1e-3), "numeric": (5e-2, 2e-2)}

# Both tolerances are calibrated per reference (``bench.reference``): the reference process also trains the same
# steps from initial weights jittered by a harmless amount and records that run's drifts; a set's tolerance is
# PARITY_K_TOL times the drift, never below the kind's PARITY_TOLERANCES value (the floor: a deterministic tiny CPU
# run drifts by ~1e-7 and would otherwise get a tolerance of almost zero). Where the loss spikes (a constant high
# learning rate, no warm-up), a harmless jitter drifts the loss by 5e-2 and more. Measured on gpt:tiny's model at
# constant LRs of 3e-3 to 0.1, 5 seeds, 8 steps (reports/parity-calibration-cpu): with k = 5, 58 of 60 further
# harmless jitters and 18 of 20 bf16 runs answer ok, and the 10% learning-rate bug is a mismatch in 20 of 20; a
# fixed distance tolerance answered ok for 53 of 60 jitters (the same calibration improves it), k = 10 catches
# the bug in only 17 of 20, k = 2 or 3 lets 55 of 60 jitters pass.
PARITY_K_TOL = 5.0
# The harmless perturbation, by kind: every trainable weight times (1 + scale * u), u uniform in [-1, 1] from a
# fixed seed. Exact sets: about one fp32 ulp (2^-23), the size of a reordered sum. Numeric sets: 2^-11, the
# rounding unit of TF32 (10 stored mantissa bits). TF32 is harmless and of bf16's order in a spike: on the first H200
# sweep (reports/example-h200-first, seed 1) it drifted the loss by 2.0e-2 where bf16 drifted by 6.5e-2; on CPU
# (reports/parity-calibration-cpu) this jitter drifts the loss about as much as bf16 autocast does.
PARITY_HARMLESS = {"exact": ("one fp32 ulp", 2.0 ** -23), "numeric": ("TF32's rounding unit", 2.0 ** -11)}
# The known bug the reference also trains: the learning rate times this. A check that does not catch it here has
# no power, and its answer is "inconclusive".
PARITY_BUG_LR_FACTOR = 1.1
PARITY_ANSWERS = ("ok", "mismatch", "inconclusive")


def parity_answer(checks: Iterable[tuple[float, float, float]]) -> str:
    """ok, mismatch or inconclusive from each check's (drift, tolerance, the known bug's drift). A check whose
    tolerance the bug's drift does not exceed has no power: it cannot tell the bug from harmless drift. mismatch:
    a check with power is exceeded; ok: every check with power passes (at least one has it) and none is exceeded;
    otherwise inconclusive (no check has power, or one without power is exceeded)."""
    checks = list(checks)
    powered = [drift > tol for drift, tol, bug in checks if bug > tol]
    if any(powered):
        return "mismatch"
    if powered and all(drift <= tol for drift, tol, _ in checks):
        return "ok"
    return "inconclusive"


def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation (read by ``bench.dev.schema_doc``)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


# ---- sections -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepStats:
    """Step times of the timed window, in seconds."""

    median: float | None = doc("median")
    iqr: float | None = doc("interquartile range (q75 - q25)")
    min: float | None = doc("fastest step")
    max: float | None = doc("slowest step")
    mean: float | None = doc("mean")
    n: int = doc("steps measured", 0)


@dataclass(frozen=True)
class Contention:
    """Other processes' CPU time while the trial measured."""

    other_cpu_s: float = doc("CPU seconds of other processes")
    window_s: float = doc("wall seconds measured")
    ncpu: int = doc("CPUs the trial may use")
    fraction: float = doc("other_cpu_s / (window_s * ncpu): 0 idle, 1 every core busy")
    steal_s: float = doc("of other_cpu_s, the VM's steal time", 0.0)


@dataclass(frozen=True)
class BuildInfo:
    """What the trial built and ran on."""

    n_params: int = doc("parameters of the workload's model")
    batch_size: int = doc("global samples per optimizer step")
    micro_batches: int = doc("passes per optimizer step (gradient accumulation)")
    tokens_per_sample: int = doc("sequence length; 0 for other models")
    threads: int = doc("torch threads of each process")
    first_step_s: float | None = doc("the first training step's wall time")
    one_off_s: float | None = doc("first_step_s less a steady step (compilation): kept out of throughput")
    probe_s: float = doc("the techniques' probes before training (LR range test)", 0.0)
    trained_params: int | None = doc("parameters trained, when a technique changed the model", None)
    resources: dict[str, int] | None = doc("ranks, threads (each rank's), cores, devices (GPUs); unlike the "
                                           "reference's: labelled unequal resources", None)
    recipe: dict[str, Any] | None = doc("optimizer (class, each parameter group's hyper-parameters and size), "
                                        "schedule (the workload's, 'replaced by' a technique, or null), "
                                        "own_optimizer (the workload brought its own)", None)


@dataclass(frozen=True)
class SpeedResult:
    """The timed window, warm-up excluded."""

    warmup_steps: int = doc("untimed steps before the window")
    steps: int = doc("optimizer steps in the window")
    window_s: float = doc("the window's wall time")
    step_time_s: StepStats = doc("per-step times")
    samples_per_s: float = doc("global samples / window_s")
    samples_per_s_per_device: float = doc("samples_per_s / world size")
    tokens_per_s: float | None = doc("tokens trained / window_s (sequence models)")
    data_wait_frac: float | None = doc("share of the window spent fetching batches")
    contention: Contention = doc("other processes' CPU time")
    contended: bool = doc("contention.fraction above 0.1 after the retries: left out of speed verdicts")
    flops_per_step: int | None = doc("model FLOPs per optimizer step (docs/methodology.md, 'MFU')")
    achieved_flops: float | None = doc("flops_per_step * steps / window_s")
    compute_dtype: str = doc("the dtype matmuls run in")
    peak_flops: float | None = doc("the calibrated matmul peak for compute_dtype at the trial's threads, summed "
                                   "over ranks")
    peak_source: str | None = doc("the calibration that gave peak_flops")
    mfu: float | None = doc("achieved_flops / peak_flops")
    datasheet_peak_flops: float | None = doc("the GPU datasheet's dense peak for compute_dtype")
    mfu_datasheet: float | None = doc("achieved_flops / datasheet_peak_flops")
    contention_retries: list[float] = doc("contention fraction of each window measured again", factory=list)
    shapes: dict[str, int] | None = doc("input shape -> steps, when shapes varied", None)
    mfu_by_device: dict[str, float] | None = doc("several CUDA ranks: each device's MFU", None)


@dataclass(frozen=True)
class ContinuationResult:
    """Training past the quality budget to a training clock, for quality at equal time."""

    until_s: float = doc("the clock to reach: the reference set's train_time_s")
    reached: bool = doc("until_s was reached (else why_not says why)")
    samples_beyond_budget: int = doc("samples trained past budget_samples")
    steps_beyond_budget: int = doc("optimizer steps past budget_steps")
    train_time_s: float = doc("training clock at the last evaluation")
    why_not: str | None = doc("a technique's blocker, a stop, or the safety cap", None)
    max_samples_factor: int = doc("cap on samples trained, in budgets", 4)


@dataclass(frozen=True)
class QualityResult:
    """The quality run: every set of a workload trains the same samples from the same initial weights."""

    metric: str = doc("the workload's held-out metric")
    higher_is_better: bool = doc("direction of the metric")
    target: float | None = doc("the size's validation target")
    budget_samples: int = doc("samples to train")
    budget_steps: int = doc("optimizer steps at this trial's global batch")
    samples_trained: int = doc("samples trained (fewer only when cut or stopped)")
    steps_trained: int = doc("optimizer steps trained")
    train_time_s: float = doc("training clock at the budget's end (evaluation and one-off cost excluded)")
    cut: str | None = doc("why the run stopped short (a safety cap)")
    curve_columns: list[str] = doc("the curve's column names")
    curve: list[list[float | int | None]] = doc("one row per evaluation: samples, steps, train_time_s, train_loss, "
                                                "metric")
    final: float | None = doc("the metric at budget_samples (null when cut)")
    samples_to_target: int | None = doc("samples at the first evaluation that reached the target (null: a miss)")
    steps_to_target: int | None = doc("optimizer steps there")
    time_to_target_s: float | None = doc("training clock there")
    time_to_target_with_one_off_s: float | None = doc("time_to_target_s + build.one_off_s + build.probe_s")
    contention: Contention | None = doc("other processes' CPU time")
    margin: float | None = doc("the workload's equivalence margin on the metric (null: none)", None)
    stopped_by: str | None = doc("a technique that ended the run early (early stopping)", None)
    tokens_trained: int | None = doc("tokens trained (sequence workloads)", None)
    continuation: ContinuationResult | None = doc("training past the budget", None)
    curve_extra: dict[str, list[float | None]] | None = doc("the workload's other held-out metrics, per curve row",
                                                            None)
    contended: bool = doc("contention.fraction above 0.1 after the retries: left out of time comparisons", False)
    contention_retries: list[float] = doc("contention fraction of each quality run trained again", factory=list)

    def __post_init__(self) -> None:
        # Every reader indexes a curve's rows by column (samples, steps, clock, loss, metric): a row of another
        # length is not a curve this trainbench reads, so the reader says so instead of failing deep in a figure.
        for i, row in enumerate(self.curve):
            if len(row) != len(self.curve_columns):
                raise ValueError(f"quality.curve[{i}] holds {len(row)} values, but curve_columns names "
                                 f"{len(self.curve_columns)} (one value per column)")


@dataclass(frozen=True)
class ParityResult:
    """The first optimizer steps against the eager fp32 reference."""

    kind: str = doc("exact or numeric: which tolerances apply")
    steps: int = doc("optimizer steps compared")
    ok: bool = doc("both trajectories within tolerance")
    loss_rel_diff: float = doc("max over steps of |loss - reference| / |reference|")
    distance_rel_diff: float = doc("the same for d_t = ||theta_t - theta_0||")
    loss_tolerance: float = doc("tolerance of loss_rel_diff")
    distance_tolerance: float = doc("tolerance of distance_rel_diff")
    losses: list[float] = doc("this trial's losses (mean over ranks)")
    reference_losses: list[float] = doc("the reference's losses")
    distances: list[float] = doc("this trial's d_t")
    reference_distances: list[float] = doc("the reference's d_t")
    note: str | None = doc("an expected mismatch and why")
    reference: str = doc("the reference's cache key")
    answer: str | None = doc("ok, mismatch or inconclusive (docs/methodology.md, 'Parity that can fail')", None)
    harmless: str | None = doc("the harmless jitter the tolerances were calibrated with", None)
    harmless_loss_drift: float | None = doc("the reference's loss drift under it", None)
    harmless_distance_drift: float | None = doc("its distance drift", None)
    bug_loss_drift: float | None = doc("the reference's loss drift with the known bug", None)
    bug_distance_drift: float | None = doc("its distance drift", None)
    k_tol: float | None = doc("tolerance = max(the kind's fixed one, k_tol x harmless drift)", None)

    @property
    def verdict(self) -> str:
        """The answer, also for records before calibration (their ``ok`` is the answer)."""
        return self.answer or ("ok" if self.ok else "mismatch")


@dataclass(frozen=True)
class MemoryResult:
    """Peaks of the timed window, a clean RSS (resident set size) pass, one step's tensor breakdown."""

    peak_bytes: int | None = doc("tensor-level peak (tracked step) or CUDA allocator peak")
    peak_source: str = doc("which of the two")
    peak_reserved_bytes: int | None = doc("CUDA allocator reserved peak")
    peak_rss_bytes: int | None = doc("process peak RSS over the window (largest rank)")
    clean_rss: dict[str, Any] = doc("RSS at rest and peak, freed memory returned at once", factory=dict)
    breakdown: dict[str, Any] | None = doc("params, grads, optimizer, activations, other at the tensor peak", None)
    breakdown_skipped: str | None = doc("why there is no breakdown", None)
    per_rank: list[dict[str, Any]] | None = doc("multi-process: each rank's peaks and model state", None)
    model_state_bytes: int | None = doc("multi-process: the largest rank's params + grads + optimizer", None)
    clean_rss_peak_bytes: int | None = doc("multi-process: the largest rank's clean RSS peak", None)
    zero_stage: int | None = doc("multi-process: the set's ZeRO stage (0 = DDP)", None)
    zero_formula_bytes: dict[str, float] | None = doc("the ZeRO paper's per-rank model state", None)
    zero_note: str | None = doc("how the implementation departs from it", None)


@dataclass(frozen=True)
class EnergyResult:
    """Joules over the timed window, where the hardware counts them."""

    joules: float | None = doc("energy of the timed window")
    source: str | None = doc("the counter (NVML, RAPL)")
    reason: str | None = doc("why nothing was measured", None)


@dataclass(frozen=True)
class PhaseResult:
    """Where a step's time goes: a pass after the window, each region of the step timed. device_*: GPUs only."""

    steps: int = doc("steps of the pass")
    step_s: float = doc("mean step time, data fetch included")
    mean_s: dict[str, float] = doc("phase -> mean seconds per step")
    median_s: dict[str, float] = doc("phase -> median seconds per step")
    iqr_s: dict[str, float] = doc("phase -> interquartile range")
    share: dict[str, float] = doc("phase -> share of the step (adds up to 1)")
    diagnosis: str = doc("the bottleneck and the technique to try (docs/profiling.md)")
    device_busy: float | None = doc("the device's busy share of a step", None)
    device_busy_s: float | None = doc("busy seconds per step", None)
    device_ops_per_step: float | None = doc("kernels, copies and memsets per step", None)
    device_op_s: float | None = doc("their mean duration", None)
    device_source: str | None = doc("what the device figures were measured over", None)


# ---- the record -----------------------------------------------------------------------------------------------


@dataclass
class TrialRecord:
    """Everything one trial measured."""

    sweep_id: str = doc("the sweep directory's name")
    trial_id: str = doc("workload:size/set[/npN]/seedS/rR")
    workload: dict[str, Any] = doc("name, size, dataset, params, metric, target, ...; a --model's source and sha256")
    techniques: list[dict[str, Any]] = doc("[{name, options}] in phase order; empty for the baseline")
    technique_label: str = doc("the set as written")
    seed: int = doc("seed of the initial weights and the batch order")
    repeat: int = doc("repeat index")
    world_size: int = doc("processes (torchrun ranks)")
    device: str = doc("cpu or cuda")
    status: str = doc("ok, or why not (Constants)")
    kind: str = doc("exact, numeric or algorithmic: how the set is judged on quality", "exact")
    mode: str = doc("speed, quality or both: what the trial measured", "both")
    position: int = doc("index in the sweep's run order", 0)
    reason: str | None = doc("why the trial is not ok", None)
    timestamp_utc: str = doc("when the trial started", "")
    build: BuildInfo | None = doc("what was built", None)
    speed: SpeedResult | None = doc("the timed window", None)
    quality: QualityResult | None = doc("the quality run", None)
    parity: ParityResult | None = doc("parity (exact and numeric sets)", None)
    memory: MemoryResult | None = doc("the memory passes", None)
    energy: EnergyResult | None = doc("energy of the timed window", None)
    phases: PhaseResult | None = doc("where a step's time goes", None)
    notes: list[str] = doc("the harness's remarks", factory=list)
    unavailable: dict[str, str] = doc("measurements that failed, name -> why; the trial went on without them",
                                      factory=dict)
    technique_results: dict[str, Any] = doc("what each technique found, by name", factory=dict)
    error: str | None = doc("the end of a failed trial's traceback", None)
    env_ref: str = doc("the environment file beside results.jsonl", "env.json")
    wall_s: float | None = doc("the trial's wall time as its launcher saw it", None)
    added_by: str | None = doc("null (planned), sequential (--repeats auto), continuation or tune", None)
    stages: dict[str, float] | None = doc(
        f"seconds per stage, adding up to wall_s; {', '.join(MEASURED)} are measured, the rest fixed cost "
        "(docs/methodology.md, 'A trial's stages')", None)
    caches: dict[str, str] | None = doc("dataset: read or decoded; inductor: cold or warm", None)
    isolation: str | None = doc("fork (from the sweep's fork server) or fresh (docs/methodology.md, 'Fork "
                                "isolation')", None)
    continues: str | None = doc("the trial whose quality run this one continues", None)
    config_hash: str = doc("hash of the sweep's settings; --resume refuses to mix two", "")
    schema_version: int = doc("2", SCHEMA_VERSION)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got '{self.status}'")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got '{self.mode}'")

    @property
    def workload_label(self) -> str:
        return f"{self.workload.get('name')}:{self.workload.get('size')}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False, default=_jsonable)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        if not isinstance(data, dict):
            raise ValueError(f"a record is a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version == 1:
            data = _from_schema_1(data)
        elif version != SCHEMA_VERSION:
            raise ValueError(f"record schema_version {shown(version)} is not supported (this trainbench reads 1 and "
                             f"{SCHEMA_VERSION})")
        return _build(cls, data, "record")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__} in a record")


def _build(cls: type, data: Any, where: str) -> Any:
    """A dataclass from its dict, nested sections included; unknown and missing fields are errors naming where."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object, got {type(data).__name__}")
    fields, hints = _schema(cls)
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where} has unknown fields: {', '.join(shown(k) for k in sorted(unknown)[:5])}")
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where} is missing the field '{name}'")
            continue
        values[name] = _convert(hints[name], data[name], f"{where}.{name}")
    return cls(**values)


@functools.cache
def _schema(cls: type) -> tuple[dict[str, dataclasses.Field], dict[str, Any]]:
    """A record section's fields and their resolved types, resolved once per class: resolving them for every
    section of every record was most of the time it took to read a sweep's records."""
    return {f.name: f for f in dataclasses.fields(cls)}, typing.get_type_hints(cls)


def _convert(hint: Any, value: Any, where: str) -> Any:
    """``value`` as the field's declared type: nested sections built, every leaf's JSON type checked (down to an
    eval curve's points), so a string where a number belongs is an error naming where, not a traceback deep in the
    statistics later."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) > 1:  # e.g. float | int: any of them will do
            for option in inner:
                try:
                    return _convert(option, value, where)
                except ValueError:
                    continue
            names = " or ".join(dict.fromkeys(_TYPE_NAMES.get(typing.get_origin(a) or a, str(a)) for a in inner))
            raise ValueError(f"{where} must be {names}, got {type(value).__name__}")
        hint, origin = inner[0], typing.get_origin(inner[0])
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    base = origin or hint
    if base is int and isinstance(value, float) and value.is_integer():  # JSON does not tell 1 from 1.0
        return int(value)
    expected = _JSON_TYPES.get(base)
    if expected and (not isinstance(value, expected) or (base is not bool and isinstance(value, bool))):
        raise ValueError(f"{where} must be {_TYPE_NAMES[base]}, got {type(value).__name__}")
    args = typing.get_args(hint)
    if base is list and args:
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if base is dict and len(args) == 2:
        return {k: _convert(args[1], v, f"{where}.{k}") for k, v in value.items()}
    return value


# What a field of each declared type may hold in JSON (an int where a float is declared is fine).
_JSON_TYPES: dict[Any, tuple[type, ...]] = {int: (int,), float: (int, float), str: (str,), bool: (bool,),
                                            list: (list,), dict: (dict,)}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "an array",
               dict: "an object"}


def sanitize(value: Any) -> Any:
    """Replace NaN/inf floats with None so records stay strict JSON (a diverged loss is said in ``status``)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)(**{f.name: sanitize(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, dict):
        return {k: sanitize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [sanitize(v) for v in value]
    return value


# ---- schema 1 -------------------------------------------------------------------------------------------------

SCHEMA_1_QUALITY_NOTE = ("schema-1 record (trainbench before measurement protocol v2): its final metric came from a "
                         "training run whose length depended on the set's speed, so quality is not compared")


def _from_schema_1(old: dict[str, Any]) -> dict[str, Any]:
    """The speed and memory parts of a schema-1 record, in schema 2; quality and parity are dropped."""
    timing, compute = old.get("timing") or {}, old.get("compute") or {}
    wl = old.get("workload") or {}
    new: dict[str, Any] = {k: old[k] for k in ("sweep_id", "trial_id", "workload", "techniques", "technique_label",
                                                "seed", "repeat", "world_size", "device", "status", "reason",
                                                "timestamp_utc", "env_ref") if k in old}
    new.update(schema_version=SCHEMA_VERSION, mode="speed", kind=(old.get("parity") or {}).get("kind", "exact"),
               notes=[SCHEMA_1_QUALITY_NOTE])
    if timing.get("steps"):
        new["build"] = {"n_params": wl.get("n_params") or 0, "batch_size": wl.get("batch_size") or 0,
                        "micro_batches": timing.get("micro_batches", 1),
                        "tokens_per_sample": wl.get("tokens_per_sample") or 0,
                        "threads": timing.get("threads", 0), "first_step_s": timing.get("first_step_s"),
                        "one_off_s": None}
        step = timing.get("step_time_s") or {}
        new["speed"] = {
            "warmup_steps": timing.get("warmup_steps", 0), "steps": timing["steps"],
            "window_s": timing.get("window_s"),
            "step_time_s": {k: step.get(k) for k in ("median", "iqr", "min", "max", "mean")} | {"n": step.get("n", 0)},
            "samples_per_s": timing.get("samples_per_s"),
            "samples_per_s_per_device": timing.get("samples_per_s_per_device", timing.get("samples_per_s")),
            "tokens_per_s": timing.get("tokens_per_s"), "data_wait_frac": timing.get("data_wait_frac"),
            "contention": timing.get("contention") or {"other_cpu_s": 0.0, "window_s": 0.0, "ncpu": 1,
                                                       "fraction": 0.0},
            "contended": bool(timing.get("contended")), "flops_per_step": compute.get("flops_per_step"),
            "achieved_flops": compute.get("achieved_flops"), "compute_dtype": compute.get("compute_dtype", "float32"),
            "peak_flops": compute.get("peak_flops"), "peak_source": "schema-1 record",
            "mfu": compute.get("mfu"), "datasheet_peak_flops": None, "mfu_datasheet": None,
        }
    mem = old.get("memory") or {}
    if mem:
        keep = {f.name for f in dataclasses.fields(MemoryResult)}
        new["memory"] = {"peak_bytes": None, "peak_reserved_bytes": None, "peak_rss_bytes": None, "peak_source": ""}
        new["memory"].update({k: v for k, v in mem.items() if k in keep})
    if old.get("energy"):
        new["energy"] = {k: old["energy"].get(k) for k in ("joules", "source", "reason")}
    return new


# ---- the store ------------------------------------------------------------------------------------------------


class RecordError(ValueError):
    """A line of results.jsonl that is not a record this trainbench reads (corrupt, wrong shape, other schema)."""


class ResultStore:
    """``results.jsonl``: append-only, one record per line, fsync'd so an interrupted sweep loses nothing written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = record.to_json()
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def repair_tail(self) -> bool:
        """Drop a last line cut short by an interrupted write, so appends start on a fresh line. True if cut."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        log.warning("dropping %d bytes of a half-written last record in %s", len(data) - keep, self.path)
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
        return True

    def read(self) -> list[TrialRecord]:
        return list(self.iter_records())

    def iter_records(self) -> Iterable[TrialRecord]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            lines = fh.readlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                # Only the last line can be cut short by an interrupted write; anything else is corruption.
                if number == len(lines):
                    log.warning("ignoring a truncated last line in %s", self.path)
                    continue
                raise RecordError(f"{self.path}:{number} is not valid JSON (a corrupt line; only a cut last line "
                                  "is repaired)") from None
            try:
                yield TrialRecord.from_dict(data)
            except (TypeError, ValueError) as exc:
                raise RecordError(f"{self.path}:{number}: {exc}") from None

    def done_trial_ids(self) -> set[str]:
        return {r.trial_id for r in self.iter_records()}
