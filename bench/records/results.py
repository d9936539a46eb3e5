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
from bench.measure.stages import MEASURED, STAGES

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
    """Per-step wall times of the timed window, in seconds."""

    median: float | None = doc("median step time")
    iqr: float | None = doc("interquartile range (q75 - q25)")
    min: float | None = doc("fastest step")
    max: float | None = doc("slowest step")
    mean: float | None = doc("mean step time (window_s / steps up to data-fetch time between steps)")
    n: int = doc("steps measured", 0)


@dataclass(frozen=True)
class Contention:
    """CPU time that processes other than the trial's own took while it measured."""

    other_cpu_s: float = doc("CPU seconds used by other processes")
    window_s: float = doc("wall seconds measured")
    ncpu: int = doc("logical CPUs the trial may run on (a Slurm job's cores; otherwise all of the machine's)")
    fraction: float = doc("other_cpu_s / (window_s * ncpu): 0 idle, 1 every core busy with foreign work")
    steal_s: float = doc("of other_cpu_s, the VM's steal time (/proc/stat): the hypervisor ran other guests on "
                         "this VM's vCPUs", 0.0)


@dataclass(frozen=True)
class BuildInfo:
    """What the trial built: model size, batch, threads, and the one-off cost of its first step."""

    n_params: int = doc("parameters of the model before any technique (the workload's model)")
    batch_size: int = doc("global samples per optimizer step (every rank's together)")
    micro_batches: int = doc("forward/backward passes per optimizer step (gradient accumulation)")
    tokens_per_sample: int = doc("sequence length for language models, 0 otherwise")
    threads: int = doc("torch intra-op threads of this process (each rank's under torchrun)")
    first_step_s: float | None = doc("wall time of the process's first training step: torch.compile's compilation, "
                                     "lazy initialisation and first-touch allocation land here")
    one_off_s: float | None = doc("first_step_s minus a steady step of the same run: the one-off cost kept out of "
                                  "throughput and of time_to_target_s")
    probe_s: float = doc("wall time of the techniques' probes before training (LR range test, batch-size search, "
                         "difficulty scoring): a one-off cost like one_off_s", 0.0)
    trained_params: int | None = doc("parameters of the model trained, after the techniques' model surgery (a "
                                     "leaner architecture, extra prediction heads), when it differs from n_params; "
                                     "a technique that shrinks the model during training reports it in "
                                     "technique_results", None)
    resources: dict[str, int] | None = doc("what the trial ran on: ranks, threads (torch threads of each rank), "
                                           "cores (ranks x threads) and devices (GPUs: one per rank on CUDA, 0 on "
                                           "the CPU); a comparison across unequal resources is labelled", None)
    recipe: dict[str, Any] | None = doc("the optimizer stepped (optimizer: class and each parameter group's "
                                        "hyper-parameters and size), whose LR schedule ran (schedule: the "
                                        "workload's own, 'replaced by' a technique that owns the LR, or None) and "
                                        "whether the workload brought its own optimizer (own_optimizer)", None)


@dataclass(frozen=True)
class SpeedResult:
    """The timed window: how fast a step is. Warm-up excluded, device sync only at the window's edges."""

    warmup_steps: int = doc("steps before the window, untimed (after the quality run, if any)")
    steps: int = doc("optimizer steps in the window")
    window_s: float = doc("wall time of the window")
    step_time_s: StepStats = doc("per-step times")
    samples_per_s: float = doc("global samples / window_s")
    samples_per_s_per_device: float = doc("samples_per_s / world size")
    tokens_per_s: float | None = doc("tokens trained in the window / window_s (language models; the real lengths "
                                     "when a technique shortens sequences)")
    data_wait_frac: float | None = doc("share of the window spent fetching batches")
    contention: Contention = doc("other processes' CPU time during the window")
    contended: bool = doc("other processes used more than 10% of the CPUs during the window (the one kept, after "
                          "the retries); such a window is kept out of speed verdicts")
    flops_per_step: int | None = doc("model FLOPs of one optimizer step (FlopCounterMode on the eager fp32 reference "
                                     "step: the same for every technique of a workload; the window's mean when its "
                                     "steps had other input shapes, each shape counted once)")
    achieved_flops: float | None = doc("flops_per_step * steps / window_s: the same clock as samples_per_s")
    compute_dtype: str = doc("the dtype matmuls run in: float32, tfloat32, bfloat16, float16")
    peak_flops: float | None = doc("this machine's calibrated matmul peak for compute_dtype at this trial's thread "
                                   "count; several CUDA ranks: the sum of each device's own calibrated peak (an "
                                   "env.json without per-device peaks: the first device's times the ranks); several "
                                   "CPU ranks: the one-thread peak times the ranks")
    peak_source: str | None = doc("which calibration gave peak_flops")
    mfu: float | None = doc("achieved_flops / peak_flops (PaLM's model FLOPs utilisation)")
    datasheet_peak_flops: float | None = doc("the GPU datasheet's dense peak for compute_dtype (GPUs only)")
    mfu_datasheet: float | None = doc("achieved_flops / datasheet_peak_flops")
    contention_retries: list[float] = doc("contention fraction of each window measured again because others used "
                                          "the CPUs (at most budget.contention_retries, after a pause)", factory=list)
    shapes: dict[str, int] | None = doc("input shape -> steps, when the window's steps had other shapes than the "
                                        "workload's batch (sequence-length curriculum, ...)", None)
    mfu_by_device: dict[str, float] | None = doc("several CUDA ranks: each device's MFU, an equal share of "
                                                 "achieved_flops (achieved_flops / world size, exact for data "
                                                 "parallelism, an estimate for pipeline stages of unequal work) over "
                                                 "that device's own calibrated peak; mfu is the aggregate", None)


@dataclass(frozen=True)
class ContinuationResult:
    """A quality run trained on past its budget to a training clock (the equal-time comparison of a set faster than
    the reference): the budget is trained exactly as in the trial it continues, then training goes on at the same
    evaluation cadence until the clock reaches ``until_s``."""

    until_s: float = doc("the training clock to reach: the reference set's train_time_s for this workload and seed")
    reached: bool = doc("the training clock reached until_s; false: cut by a safety cap, stopped, or not run "
                        "(why_not says which)")
    samples_beyond_budget: int = doc("samples trained after budget_samples")
    steps_beyond_budget: int = doc("optimizer steps trained after budget_steps")
    train_time_s: float = doc("training clock at the last evaluation (budget and continuation; one-off excluded)")
    why_not: str | None = doc("why the clock did not reach until_s: a technique's continuation blocker, a stop, "
                              "the safety cap (max_samples_factor x the budget's samples, or max_train_seconds)",
                              None)
    max_samples_factor: int = doc("the cap on the samples of budget and continuation together, as a multiple of "
                                  "budget_samples", 4)


@dataclass(frozen=True)
class QualityResult:
    """The quality run: how fast the model learns. Every set of a workload trains the same samples from the same
    initial weights and batches, evaluated at the same sample counts; evaluation is not timed."""

    metric: str = doc("the workload's held-out metric")
    higher_is_better: bool = doc("direction of the metric")
    target: float | None = doc("the workload size's validation target (documented in the workload)")
    budget_samples: int = doc("samples to train: budget_steps * the workload's global batch")
    budget_steps: int = doc("optimizer steps at this trial's global batch")
    samples_trained: int = doc("samples actually trained within the budget (less than budget_samples only when cut "
                               "or stopped)")
    steps_trained: int = doc("optimizer steps actually trained")
    train_time_s: float = doc("training clock at the budget's end: wall time of the training steps, evaluation "
                              "excluded, one-off cost excluded (the first step counts as a steady one)")
    cut: str | None = doc("why the run stopped before its budget (the wall-clock safety cap); a cut run is never "
                          "compared as complete")
    curve_columns: list[str] = doc("names of the curve's columns")
    curve: list[list[float | int | None]] = doc("one row per evaluation: samples, steps, train_time_s, "
                                                "train_loss (mean since the previous evaluation), metric")
    final: float | None = doc("the metric at budget_samples (None when cut)")
    samples_to_target: int | None = doc("samples at the first evaluation that reached the target (None: a miss)")
    steps_to_target: int | None = doc("optimizer steps at that evaluation")
    time_to_target_s: float | None = doc("training clock at that evaluation")
    time_to_target_with_one_off_s: float | None = doc("time_to_target_s + build.one_off_s + build.probe_s")
    contention: Contention | None = doc("other processes' CPU time during the quality run")
    margin: float | None = doc("the workload's equivalence margin on the metric: a difference at equal samples "
                               "within +-margin counts as equivalent (None: no margin)", None)
    stopped_by: str | None = doc("a technique that ended the run early through its on_eval hook (early stopping): "
                                 "the run is complete at that point", None)
    tokens_trained: int | None = doc("tokens actually trained (sequence workloads: shortened sequences count as "
                                     "short)", None)
    continuation: ContinuationResult | None = doc("a trial that trains on past the budget to a training clock: what "
                                                  "it trained beyond (the curve's rows past budget_samples); every "
                                                  "other field describes the budget", None)
    curve_extra: dict[str, list[float | None]] | None = doc("the workload's other held-out metrics at each curve row "
                                                            "(its curve_metrics, e.g. a preference workload's "
                                                            "proxy_reward and kl), aligned with curve", None)
    contended: bool = doc("other processes used more than 10% of the CPUs during the quality run after its "
                          "retries: its training clock is not this machine's, so equal-time and time-to-target "
                          "comparisons leave it out (records before this field: read from contention)", False)
    contention_retries: list[float] = doc("contention fraction of each quality run trained again from a fresh "
                                          "build because others used the CPUs (at most budget.contention_retries, "
                                          "after a pause)", factory=list)

    def __post_init__(self) -> None:
        # Every reader indexes a curve's rows by column (samples, steps, clock, loss, metric): a row of another
        # length is not a curve this trainbench reads, so the reader says so instead of failing deep in a figure.
        for i, row in enumerate(self.curve):
            if len(row) != len(self.curve_columns):
                raise ValueError(f"quality.curve[{i}] holds {len(row)} values, but curve_columns names "
                                 f"{len(self.curve_columns)} (one value per column)")


@dataclass(frozen=True)
class ParityResult:
    """The first optimizer steps against the eager fp32 reference (same seed and batches, own process)."""

    kind: str = doc("exact | numeric: which tolerances apply")
    steps: int = doc("optimizer steps compared")
    ok: bool = doc("both trajectories within their tolerances")
    loss_rel_diff: float = doc("max over steps of |loss - reference loss| / |reference loss|")
    distance_rel_diff: float = doc("max over steps of |d_t - reference d_t| / reference d_t, where d_t = "
                                   "||theta_t - theta_0||: how far the parameters moved (a 10% learning-rate "
                                   "change moves it by 10%)")
    loss_tolerance: float = doc("tolerance of loss_rel_diff for this kind")
    distance_tolerance: float = doc("tolerance of distance_rel_diff for this kind")
    losses: list[float] = doc("this trial's losses (mean over ranks)")
    reference_losses: list[float] = doc("the reference's losses")
    distances: list[float] = doc("this trial's d_t after each update")
    reference_distances: list[float] = doc("the reference's d_t")
    note: str | None = doc("an expected mismatch and why (BatchNorm under gradient accumulation)")
    reference: str = doc("the reference's cache key (workload, size, seed, batch, steps)")
    answer: str | None = doc("ok | mismatch | inconclusive: mismatch when a check that catches the known bug (a "
                             "10% learning-rate change) is exceeded; ok when every such check passes; "
                             "inconclusive when no check catches the bug, or one that does not is exceeded. None "
                             "on records before calibration (ok says it)", None)
    harmless: str | None = doc("the harmless perturbation the tolerances were calibrated with (initial weights "
                               "times 1 + scale x u); None: the fixed tolerances of the kind, not calibrated", None)
    harmless_loss_drift: float | None = doc("the reference's loss drift under that perturbation (same measure "
                                            "as loss_rel_diff)", None)
    harmless_distance_drift: float | None = doc("its parameter-distance drift", None)
    bug_loss_drift: float | None = doc("the reference's loss drift with the learning rate x 1.1", None)
    bug_distance_drift: float | None = doc("its parameter-distance drift", None)
    k_tol: float | None = doc("loss_tolerance = max(the kind's fixed loss tolerance, k_tol x "
                              "harmless_loss_drift), and distance_tolerance likewise", None)

    @property
    def verdict(self) -> str:
        """The answer, also for records before calibration (their ``ok`` is the answer)."""
        return self.answer or ("ok" if self.ok else "mismatch")


@dataclass(frozen=True)
class MemoryResult:
    """Peaks from the timed window, a clean RSS pass, and the tensor breakdown of one tracked step."""

    peak_bytes: int | None = doc("tensor-level peak (tracked step) or CUDA allocator peak")
    peak_source: str = doc("which of the two peak_bytes is")
    peak_reserved_bytes: int | None = doc("CUDA allocator reserved peak")
    peak_rss_bytes: int | None = doc("process peak RSS over the timed window (largest rank)")
    clean_rss: dict[str, Any] = doc("at_rest_bytes, peak_bytes, steps, method, malloc: RSS with glibc returning "
                                    "freed memory at once; or skipped with the reason", factory=dict)
    breakdown: dict[str, Any] | None = doc("params, grads, optimizer, activations, other, peak_bytes, "
                                           "activation_peak_bytes at the tensor peak; held: the bytes of each "
                                           "part of other a technique keeps resident (teacher, reference "
                                           "policy, reward model)", None)
    breakdown_skipped: str | None = doc("why there is no breakdown", None)
    per_rank: list[dict[str, Any]] | None = doc("multi-process: each rank's peak_rss_bytes, clean_rss, "
                                                "cuda_peak_bytes, model_state {params, grads, optimizer, "
                                                "optimizer_scalars}", None)
    model_state_bytes: int | None = doc("multi-process: the largest rank's params + grads + optimizer bytes", None)
    clean_rss_peak_bytes: int | None = doc("multi-process: the largest rank's clean RSS peak", None)
    zero_stage: int | None = doc("multi-process: the ZeRO stage of the set (0 = DDP)", None)
    zero_formula_bytes: dict[str, float] | None = doc("the ZeRO paper's per-rank model state for that stage", None)
    zero_note: str | None = doc("how the implementation departs from the formula", None)


@dataclass(frozen=True)
class EnergyResult:
    """Joules over the timed window where the hardware counts them."""

    joules: float | None = doc("energy used during the timed window")
    source: str | None = doc("the counter (NVML, RAPL)")
    reason: str | None = doc("why nothing was measured", None)


@dataclass(frozen=True)
class PhaseResult:
    """Where a step's time goes: a pass of its own after the timed window, each labelled region of the step timed
    (synced at its edges on a GPU, so its steps are slower than the window's there)."""

    steps: int = doc("steps of the pass")
    step_s: float = doc("mean wall time of a step in the pass, data fetch included")
    mean_s: dict[str, float] = doc("phase -> mean seconds per step: data (waiting for the batch), h2d (inputs to "
                                   "the device), forward (and loss), backward (and any all-reduce overlapped with "
                                   "it), optimizer (zero_grad, step, after-step hooks), other (the rest)")
    median_s: dict[str, float] = doc("phase -> median seconds per step")
    iqr_s: dict[str, float] = doc("phase -> interquartile range of its seconds per step")
    share: dict[str, float] = doc("phase -> its share of the pass's step time (the shares add up to 1)")
    diagnosis: str = doc("the bottleneck these shares point to, and the technique to try (rules in "
                         "docs/profiling.md)")
    device_busy: float | None = doc("GPU only: the device's busy time over the wall time of a step (the union of its "
                                    "kernels, copies and memsets), from a short pass with CUDA activity traced and no "
                                    "region synced; None on CPU or where not measured", None)
    device_busy_s: float | None = doc("GPU only: the device's busy seconds per step in that pass", None)
    device_ops_per_step: float | None = doc("GPU only: kernels, copies and memsets per step in that pass", None)
    device_op_s: float | None = doc("GPU only: their mean duration in seconds", None)
    device_source: str | None = doc("what the device-busy figures were measured over", None)


# ---- the record -----------------------------------------------------------------------------------------------


@dataclass
class TrialRecord:
    """Everything one trial measured. A stage that did not run is None (the ``mode`` or an error says why)."""

    sweep_id: str = doc("the sweep directory's name")
    trial_id: str = doc("workload:size/technique set[/npN]/seedS/rR")
    workload: dict[str, Any] = doc("name, size, dataset {...}, params {...}, metric, higher_is_better, batch_size, "
                                   "tokens_per_sample, n_params, target; a user's model (--model) also source "
                                   "{file or module, function, sha256}")
    techniques: list[dict[str, Any]] = doc("[{name, options}] in phase order; empty for the baseline; a plugin "
                                           "technique also has source (and sha256 of its file)")
    technique_label: str = doc("the set as written: bf16+grad_accum:steps=4, or baseline")
    seed: int = doc("seed of the model's initialisation and the batch order")
    repeat: int = doc("repeat index; repeat r uses seed + r")
    world_size: int = doc("processes of the trial (torchrun ranks)")
    device: str = doc("cpu or cuda")
    status: str = doc("ok | skipped | failed | oom | killed | timeout | diverged")
    kind: str = doc("exact | numeric | algorithmic: how the set is judged on quality", "exact")
    mode: str = doc("speed | quality | both: which measurements the trial made", "both")
    position: int = doc("index of the trial in the sweep's run order", 0)
    reason: str | None = doc("why the trial is not ok", None)
    timestamp_utc: str = doc("when the trial started", "")
    build: BuildInfo | None = doc("what was built", None)
    speed: SpeedResult | None = doc("the timed window", None)
    quality: QualityResult | None = doc("the quality run", None)
    parity: ParityResult | None = doc("parity against the reference (exact and numeric sets)", None)
    memory: MemoryResult | None = doc("memory passes", None)
    energy: EnergyResult | None = doc("energy over the timed window", None)
    phases: PhaseResult | None = doc("where a step's time goes (a pass after the timed window)", None)
    notes: list[str] = doc("remarks of the harness about this record", factory=list)
    unavailable: dict[str, str] = doc("measurements that were attempted and failed, by name, with why; the trial "
                                      "went on without them: device_busy (the device-busy pass's profiler or its "
                                      "trace), energy (a counter that could not be read at the window's edges), "
                                      "step_times (CUDA events: the window's step times are then the host's)",
                                      factory=dict)
    technique_results: dict[str, Any] = doc("what each technique found, by name (an LR range test's curve and "
                                            "choice, a batch-size search trace, early stopping's savings)",
                                            factory=dict)
    error: str | None = doc("traceback of a failed trial (last 4000 characters)", None)
    env_ref: str = doc("the environment file beside results.jsonl", "env.json")
    wall_s: float | None = doc("the trial's wall time as its launcher saw it, process start to record (what a "
                               "sequential sweep budgets with)", None)
    added_by: str | None = doc("None for a planned trial; 'sequential': a speed-only pair added by --repeats auto "
                               "while the configuration's speed or memory verdict was open; 'continuation': a "
                               "time-budgeted continuation of a quality run (see continues); 'tune': a trial "
                               "of `bench tune`'s search", None)
    stages: dict[str, float] | None = doc(
        "where the trial's wall_s went, in seconds, stage by stage, each timed by the process that ran it; they add "
        "up to wall_s, unaccounted holding the rest. Stages: " + ", ".join(STAGES) + " (docs/methodology.md, 'A "
        f"trial's stages', says what each holds). The measured steps are {', '.join(MEASURED)}; the rest is the "
        "trial's fixed cost", None)
    caches: dict[str, str] | None = doc(
        "what the trial found in the sweep's caches: dataset: read (decoded by an earlier process of the sweep, "
        "references/datasets/) or decoded; inductor: cold (a TorchInductor cache of the set's own that nothing had "
        "filled: the one-off cost measured in full) or warm (filled by an earlier trial of the same workload and "
        "set: the first step's one-off is smaller, and the analysis takes the set's one-off cost from its cold "
        "trials); absent: not used", None)
    isolation: str | None = doc(
        "how the trial's process started: fork (forked from the sweep's fork server, which had imported torch and the "
        "harness once; the child maps the file pages the server held, so RSS counts what a fresh process's counts) or "
        "fresh (a new interpreter: torchrun trials, --isolation fresh, sweep --ab against another checkout, batch "
        "jobs, a sweep whose server could not start); docs/methodology.md, 'Fork isolation'. None: a skipped trial, "
        "or a record from before the field", None)
    continues: str | None = doc("the trial_id of the trial whose quality run this one continues past its budget "
                                "(a time-budgeted continuation, quality.continuation); such records are kept out of "
                                "every statistic but quality at equal time", None)
    config_hash: str = doc("hash of the sweep settings the trial ran under (budget, mode, device, threads, processes, "
                           "seed); --resume refuses to mix records of two settings", "")
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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where} has unknown fields: {', '.join(shown(k) for k in sorted(unknown)[:5])}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{where} is missing the field '{name}'")
            continue
        values[name] = _convert(hints[name], data[name], f"{where}.{name}")
    return cls(**values)


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
