"""The GPU preset's arithmetic and ``scripts/gpu_check.sh``'s plan: what each stage of a trial and of the check costs,
priced from measured figures, with a margin. Every figure this module gives is an estimate, not a measurement.

Where the costs come from (``Costs.derived`` says it again beside each figure):

- **The recorded H200 run** (reports/example-h200-first, 2026-12-04: ``H200``). Its records carry no ``stages`` (they
  came later), so what they do hold is used:

  - a trial's fixed cost (process start, imports, CUDA's first use, data, build, the reference's loading, FLOP count,
    parity, the record, teardown): the median over its 13 trials of the wall time less the timed window, the first
    step and the passes' steps at the window's median step (``fixed_cost_s``), 18.1 s;
  - compile's one-off with an empty cache: the median ``build.one_off_s`` of its compiled trials (the cache was empty
    in every repeat), 24.9 s; an eager first step's excess likewise, 0.31 s;
  - compile's one-off with a warm cache: never measured on a GPU, so priced as the cold one (an upper bound);
  - a step: the harness's FLOP count of the size's step (a meta build) over the achieved FLOP/s the set's compute
    dtype reached there at batch 8 (``H200_FLOPS``);
  - the references: its reference files' ``seconds`` (each one 8-step fp32 run at batch 8 and one FLOP-counted step:
    2.8 s, their median; seed 0's 9.5 s more is the device's first use). ``bench.reference`` now trains 4 such
    runs per seed (the plain one, a harmless jitter per kind, the 10% learning-rate bug), each on a model it builds,
    and counts one step: priced as 4 x (2.8 s less its 8 steps: the build, the count counted each time) plus 33 fp32
    steps of the size, plus the first use once;
  - the GPU tests: its ``pytest -m gpu`` took 31.7 s.
- **The last gpu_check on the same machine** (``measured_costs``: the output directory, or a ``.prev-*`` beside it,
  whose env.json names the same GPUs and torch), once one exists: each set's median stage times from its records'
  ``stages``, compile's one-off cold and warm (``caches.inductor``), its references' own ``seconds``, and the GPU
  tests' time from its gpu-check.json. What it lacks falls back to the H200's figures.
- **Estimates, measured nowhere yet**: the sweep's start (imports, fingerprint, peak calibration: 10 s), the report
  (30 s), the device-busy pass's profiler set-up (1 s a trial), the references' process start (5 s).

The plan prices every stage the trial code runs (``trial_stages``): the fixed cost, the one-off, the warm-up (the
parity steps), the timed window, the phase pass, the device-busy pass (CUDA: its warm-up step, ``BUSY_STEPS`` and the
profiler's set-up) and the memory passes; and the check's own stages (``check_plan``): the GPU tests, the sweep's
start, the references (only those not cached), the planned trials not yet done, group by group in the order they run
(``order = "priority"``: the baseline with bf16, then bf16+compile, then tf32, then the rest), and the report. Every
estimate carries a margin of ``MARGIN`` (20%): the groups that end within the slot with it are said to complete, the
others to be cut by the cap (a second run resumes them); only when all fit does the sequential phase get time.

tests/test_gpu_check.py derives the H200 figures again from the committed records and holds the script to the plan;
docs/gpu.md's cost of the check is a block generated from ``cost_rows`` (bench.dev.docs_tables).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench import workloads
from bench.core.errors import ConfigError
from bench.measure import cuda_caps
from bench.measure.env import cpu_model
from bench.measure.flops import count_flops
from bench.measure.phases import BUSY_STEPS
from bench.plan.config import (
    GPU_CHECK,
    PRESETS,
    Budget,
    SweepConfig,
    TechniqueSet,
    WorkloadSpec,
    build_config,
)
from bench.plan.planner import ReferenceKey, Trial, priority_groups, reference_key, run_order, trial_id
from bench.records import reader
from bench.records.results import TrialRecord
from bench.workloads import cnn_fashion, gpt_chars, llama_chars, mlp_mnist1d
from techniques.base import Phase, set_compute_dtype

# ---- what the first H200 run measured (reports/example-h200-first) ---------------------------------------------

T = 1e12
# Achieved FLOP/s of gpt:gpt2-124m at batch 8, by (compute dtype, compiled): the median over the trials of the sets
# baseline, tf32, bf16 and bf16+compile. fp16 has no measurement and is taken as bf16 (the same tensor-core peak on
# the datasheet; calibrated there at 660 against bf16's 707 TFLOP/s).
H200_FLOPS: dict[tuple[str, bool], float] = {
    ("float32", False): 44.6 * T,
    ("tfloat32", False): 115.6 * T,
    ("bfloat16", False): 169.2 * T,
    ("bfloat16", True): 202.1 * T,
}
H200_FIXED_S = 18.1  # median over the 13 trials of the wall time beside the window, first step and passes' steps
H200_COMPILE_COLD_S = 24.9  # median one-off of the compiled trials (first step minus a steady step), cache empty
H200_EAGER_ONE_OFF_S = 0.31  # median one-off of the other trials
H200_REFERENCE_KEY_S = 2.8  # median ``seconds`` of its reference files: one 8-step fp32 run at batch 8 and a count
H200_REFERENCE_FIRST_S = 9.5  # seed 0's file took this much more: the device's first use in that process
H200_FP32_STEP_B8_S = 0.1178  # the baseline's median step at batch 8 (its window)
H200_REFERENCE_STEPS = 8  # the steps of each of its reference files
H200_TESTS_S = 31.7  # its pytest -m gpu (pytest-m-gpu.txt)
VOCAB = 224  # the corpus's characters on the H200 (Python 3.12.3); another CPython differs by a few
PHASE_STEPS = 10  # bench.trial.PHASE_STEPS (the phase pass), checked by the tests
MEMORY_STEPS = 4  # the memory passes: one step into place, bench.trial.CLEAN_RSS_STEPS (2), one tracked step
BUSY_PASS_STEPS = BUSY_STEPS + 1  # the device-busy pass: the profiler's warm-up step, then BUSY_STEPS
REFERENCE_RUNS = 4  # bench.reference.compute: the plain run, a harmless jitter per kind, the learning-rate bug
# Estimates, measured nowhere yet (the first gpu_check's gpu-check.txt and records will say):
STARTUP_S = 10.0  # a sweep's start: imports, the fingerprint, peak calibration (about 0.7 s of matmuls on the H200)
REPORT_S = 30.0  # summary, report.md, report.html and figures at the end
BUSY_SETUP_S = 1.0  # the device-busy pass's profiler (CUPTI) set-up and trace export, per trial
REFERENCE_PROCESS_S = 5.0  # the references' process: interpreter start and imports
CHECK_BUDGET_S = 480.0  # gpu_check.sh's slot: 8 minutes, so a 15-minute slot can run it twice
MARGIN = 0.2  # on every estimate: a plan is said to fit only if it fits 20% slower


@dataclass(frozen=True)
class Costs:
    """What the plan prices a trial and the check with (seconds), and how each figure was found (``derived``)."""

    name: str
    device: str  # "cuda" or "cpu": the device-busy pass runs on CUDA only
    fixed_s: float  # a trial's wall time beside its steps and its one-off
    eager_one_off_s: float  # the first step's excess over a steady one, without compile
    compile_cold_s: float  # ... with compile and an empty cache (a set's first trial)
    compile_warm_s: float  # ... with compile and the set's cache filled by an earlier trial
    busy_setup_s: float  # the device-busy pass's profiler, beside its steps
    startup_s: float  # the sweep's start: imports, fingerprint, peak calibration
    report_s: float
    tests_s: float  # the GPU tests
    reference_process_s: float  # the references' process start
    reference_first_s: float  # the device's first use in that process
    reference_build_s: float  # one reference run beside its steps: the model's build (and, pessimistically, a count)
    rates: Mapping[tuple[str, bool], float]  # achieved FLOP/s by (compute dtype, compiled)
    step_s: Mapping[str, float] = field(default_factory=dict)  # measured: a set's steady step, by set label
    stages_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # measured: a set's stages, one-off out
    reference_key_s: float | None = None  # measured: one reference (all its runs), from a previous check's files
    derived: tuple[str, ...] = ()

    def rate(self, techs: TechniqueSet) -> float:
        """The achieved FLOP/s assumed for a set: by its compute dtype and whether it compiles."""
        instances = [spec.resolve() for spec in techs.specs]
        dtype = set_compute_dtype(instances)
        dtype = "bfloat16" if dtype == "float16" and (dtype, False) not in self.rates else dtype
        compiled = any(t.phase == Phase.COMPILE for t in instances)
        return self.rates.get((dtype, compiled)) or self.rates.get((dtype, False)) or self.rates[("float32", False)]

    def step(self, workload: WorkloadSpec, techs: TechniqueSet) -> float:
        """A steady step of the set: measured where a previous check has it, else FLOPs over the rate."""
        if techs.label in self.step_s:
            return self.step_s[techs.label]
        batch = workloads.get(workload.name).size_params(workload.size)["batch_size"]
        return flops_per_sample(workload.name, workload.size) * batch / self.rate(techs)


H200 = Costs(
    name="the first H200 run's (reports/example-h200-first)", device="cuda", fixed_s=H200_FIXED_S,
    eager_one_off_s=H200_EAGER_ONE_OFF_S, compile_cold_s=H200_COMPILE_COLD_S, compile_warm_s=H200_COMPILE_COLD_S,
    busy_setup_s=BUSY_SETUP_S, startup_s=STARTUP_S, report_s=REPORT_S, tests_s=H200_TESTS_S,
    reference_process_s=REFERENCE_PROCESS_S, reference_first_s=H200_REFERENCE_FIRST_S,
    reference_build_s=H200_REFERENCE_KEY_S - H200_REFERENCE_STEPS * H200_FP32_STEP_B8_S, rates=H200_FLOPS,
    derived=(
        f"fixed {H200_FIXED_S:g} s a trial: the H200 records' median wall time less window, first step and passes",
        f"compilation {H200_COMPILE_COLD_S:g} s cold (its compiled trials' median one-off) and as much warm (no "
        "GPU measurement of a warm cache: the cold one is the upper bound)",
        "steps: FLOPs per step over the achieved FLOP/s of the set's dtype at batch 8 (H200_FLOPS)",
        f"references: 4 runs of (build {H200_REFERENCE_KEY_S - H200_REFERENCE_STEPS * H200_FP32_STEP_B8_S:.2f} s "
        "+ 8 fp32 steps) and a counted step per seed, the first use "
        f"{H200_REFERENCE_FIRST_S:g} s once: from its reference files' seconds",
        f"GPU tests {H200_TESTS_S:g} s: its pytest -m gpu",
        f"estimates: sweep start {STARTUP_S:g} s, report {REPORT_S:g} s, profiler set-up {BUSY_SETUP_S:g} s a "
        f"trial, references' process {REFERENCE_PROCESS_S:g} s",
    ))

# The rehearsal's first pass (gpu_check.sh --rehearse) has no measurement of this CPU to start from: a guess from
# DESIGN's 2-core figures (compile 8-10 s cold, 1-1.6 s warm; about 3 s of imports a process). The resumed pass
# prices from the first pass's records, as a GPU's second check does.
CPU_GUESS = Costs(
    name="a guess for 2 CPU cores (no measurement yet)", device="cpu", fixed_s=6.0, eager_one_off_s=0.3,
    compile_cold_s=12.0, compile_warm_s=3.0, busy_setup_s=0.0, startup_s=8.0, report_s=15.0, tests_s=45.0,
    reference_process_s=3.0, reference_first_s=0.0, reference_build_s=0.3,
    rates={("float32", False): 10e9, ("bfloat16", False): 5e9, ("float16", False): 0.5e9},
    derived=("a guess from DESIGN's 2-core CPU figures: fixed 6 s a trial, compilation 12 s cold and 3 s warm, "
             "10 GFLOP/s in float32 (bfloat16 half, float16 a tenth)",))


# ---- FLOPs per sample, counted on the meta device ---------------------------------------------------------------


def _gpt(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    cfg = gpt_chars.GPTConfig(vocab_size=VOCAB, seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                              d_model=p["d_model"])
    return gpt_chars.GPT(cfg), (1, p["seq_len"])


def _llama(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    return llama_chars.Llama(llama_chars.config_of({**p, "vocab_size": VOCAB})), (1, p["seq_len"])


def _cnn(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    return cnn_fashion.ResNet(list(p["widths"]), p["blocks_per_stage"], p["stem_stride"]), (1, 1, 28, 28)


def _mlp(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    return mlp_mnist1d.MLP(mlp_mnist1d.SEQ_LEN, p["width"], p["depth"], mlp_mnist1d.N_CLASSES), (1, mlp_mnist1d.SEQ_LEN)


# The workloads whose models this module can build without their data: the GPU sizes' families and the rehearsal's.
_MODELS: dict[str, Callable[[dict], tuple[nn.Module, tuple[int, ...]]]] = {
    "gpt": _gpt, "llama": _llama, "cnn": _cnn, "mlp": _mlp}


# The initialisers a model's build calls (through ``torch.nn.init``, looked up when called): on the meta device
# they write nothing, but each goes through the device mode's dispatch, which was half of ``bench list``'s 5 s.
_INITS = ("normal_", "uniform_", "trunc_normal_", "zeros_", "ones_", "constant_", "kaiming_uniform_",
          "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_")


@contextmanager
def _meta_build() -> Iterator[None]:
    """Build on the meta device (shapes only, nothing allocated), skipping the weight initialisers."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, _keep)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@cache
def flops_per_sample(workload: str, size: str) -> int:
    """Model FLOPs of one training step at batch 1 (forward, loss and backward), counted on a meta build."""
    if workload not in _MODELS:
        raise ConfigError(f"no FLOP estimate for workload {workload!r} (estimated: {', '.join(_MODELS)})")
    p = workloads.get(workload).size_params(size)
    with _meta_build():
        model, shape = _MODELS[workload](p)
        if workload in ("gpt", "llama"):  # token ids in, a character at each position out
            x = torch.zeros(shape, dtype=torch.long)
            y = torch.zeros(shape, dtype=torch.long)

            def step() -> None:
                gpt_chars.lm_loss(model(x), y).backward()
        else:
            x, y = torch.zeros(shape), torch.zeros(shape[0], dtype=torch.long)

            def step() -> None:
                F.cross_entropy(model(x), y).backward()

        return count_flops(step)


@cache
def n_params(workload: str, size: str) -> int:
    """The parameters of a size's model (a meta build: nothing allocated)."""
    with _meta_build():
        model, _ = _MODELS[workload](workloads.get(workload).size_params(size))
    return sum(p.numel() for p in model.parameters())


def rate(techs: TechniqueSet) -> float:
    """The H200 throughput an estimate assumes for a set: by its compute dtype and whether it compiles."""
    return H200.rate(techs)


def step_s(workload: WorkloadSpec, techs: TechniqueSet, batch_size: int | None = None) -> float:
    """Seconds per optimizer step on an H200 (an estimate: FLOPs over the measured rate)."""
    batch = batch_size or workloads.get(workload.name).size_params(workload.size)["batch_size"]
    return flops_per_sample(workload.name, workload.size) * batch / rate(techs)


# ---- a trial, stage by stage ------------------------------------------------------------------------------------

# The plan's stages of a trial, in the order the trial meets them, and what the record's stages
# (bench.measure.stages) fold into each when a previous check measured them.
TRIAL_STAGES = ("fixed", "one-off", "warm-up", "window", "phase pass", "busy pass", "memory passes", "quality run")
_RECORDED = {"one_off": "one-off", "warmup": "warm-up", "window": "window", "window_retries": "window",
             "phases": "phase pass", "memory": "memory passes", "quality_train": "quality run",
             "evaluation": "quality run", "continuation": "quality run"}  # every other recorded stage: "fixed"


def compiles(techs: TechniqueSet) -> bool:
    return any(spec.resolve().phase == Phase.COMPILE for spec in techs.specs)


def trial_stages(workload: WorkloadSpec, techs: TechniqueSet, budget: Budget, mode: str, costs: Costs,
                 cold: bool) -> dict[str, float]:
    """One trial's wall time by stage (an estimate): the set's measured stages where a previous check has them
    (speed mode), else the fixed cost, the one-off, and each pass's steps at the set's step time."""
    one_off = ((costs.compile_cold_s if cold else costs.compile_warm_s) if compiles(techs)
               else costs.eager_one_off_s)
    measured = costs.stages_s.get(techs.label)
    if measured and mode == "speed":
        return {**measured, "one-off": one_off}
    s = costs.step(workload, techs)
    out = {"fixed": costs.fixed_s, "one-off": one_off}
    if mode in ("speed", "both"):
        # The first warm-up step is the one-off plus a steady step; warm-up covers the parity steps in speed mode.
        warmup = max(budget.warmup_steps, budget.parity_steps if mode == "speed" else 0, 1)
        window = min(max(budget.min_steps * s, budget.min_seconds), max(budget.max_seconds, s))
        out["warm-up"] = warmup * s
        out["window"] = math.ceil(window / s) * s
        out["phase pass"] = PHASE_STEPS * s
        if costs.device == "cuda":
            out["busy pass"] = BUSY_PASS_STEPS * s + costs.busy_setup_s
        if budget.memory:
            out["memory passes"] = MEMORY_STEPS * s
    if mode in ("quality", "both"):
        out["quality run"] = quality_s(workload, s, budget)
    return out


def quality_s(workload: WorkloadSpec, step: float, budget: Budget) -> float:
    """The quality run at ``step`` seconds a step: its training (up to the safety cap) and its evaluations (forward
    passes over the held-out set: about a third of a training step's work per batch)."""
    p = workloads.get(workload.name).size_params(workload.size)
    steps = budget.train_steps or p["quality_steps"]
    evals = (budget.eval_points or p["eval_points"]) + 1
    held_out = p.get("eval_windows") or p.get("n_eval") or p["batch_size"]
    return min(steps * step, budget.max_train_seconds) + evals * step * held_out / p["batch_size"] / 3


def trial_s(workload: WorkloadSpec, techs: TechniqueSet, budget: Budget, mode: str, costs: Costs,
            cold: bool) -> float:
    """One trial's wall time (an estimate): the sum of its stages."""
    return sum(trial_stages(workload, techs, budget, mode, costs, cold).values())


def fixed_cost_s(rec: TrialRecord) -> float | None:
    """A speed trial's wall time beside its timed window, its first step and the passes' steps (warm-up after the
    first, phase pass, memory passes) at the window's median step: what ``H200_FIXED_S`` is the median of."""
    s, b, ph = rec.speed, rec.build, rec.phases
    if s is None or b is None or rec.wall_s is None or s.step_time_s.median is None:
        return None
    passes = (s.warmup_steps - 1 + (ph.steps if ph else 0) + MEMORY_STEPS) * s.step_time_s.median
    return rec.wall_s - s.window_s - (b.first_step_s or 0.0) - passes


# ---- the costs a previous check measured ------------------------------------------------------------------------


def machine_key(env: Mapping[str, Any]) -> str:
    """The machine and software a check ran on, for finding an earlier check of the same (no host name: a lent
    machine's name changes from lease to lease)."""
    gpu = env.get("gpu") or {}
    if str(env.get("device", "")).startswith("cuda") and gpu:
        hw = f"{gpu.get('count') or 1} x {gpu.get('name')}"
    else:
        hw = f"{env.get('cpu_model') or 'unknown CPU'} ({env.get('cpu_affinity') or env.get('cpu_logical')} cores)"
    return f"{hw}, torch {env.get('torch')}"


def this_machine(device: str) -> str:
    """``machine_key`` of this machine for a check on ``device`` (its GPUs from ``bench.measure.cuda_caps``)."""
    env: dict[str, Any] = {"device": device, "torch": torch.__version__, "cpu_model": cpu_model(),
                           "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                           "cpu_logical": os.cpu_count()}
    if device == "cuda" and cuda_caps.available():
        env["gpu"] = {"count": cuda_caps.device_count(), "name": cuda_caps.name(0)}
    return machine_key(env)


def earlier_checks(out: Path) -> list[Path]:
    """The check's output directory and the runs moved aside beside it (``.prev-<time>``), the newest first."""
    return [out, *sorted(out.parent.glob(out.name + ".prev-*"), reverse=True)]


def measured_costs(out: Path, base: Costs, machine: str) -> Costs:
    """``base`` with what the last check on ``machine`` measured (``earlier_checks``): its sets' median stages and
    steps, compile's one-off cold and warm, its references' seconds and its GPU tests' time; ``base`` itself when no
    check there ran on this machine or recorded stage times."""
    for d in earlier_checks(out):
        try:
            env = json.loads((d / "env.json").read_text())
            records = reader.read_records(d / "results.jsonl")
        except (OSError, ValueError):
            continue
        if machine_key(env) != machine:
            continue
        timed = [r for r in records if r.status == "ok" and r.stages and r.speed and r.mode == "speed"]
        if timed:
            return _from_records(base, d, timed)
    return base


def _median(values: Iterable[float]) -> float | None:
    found = [v for v in values if v is not None]
    return float(statistics.median(found)) if found else None


def _from_records(base: Costs, d: Path, records: Sequence[TrialRecord]) -> Costs:
    by_set: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in records:
        by_set[r.technique_label].append(r)
    stages_s, step = {}, {}
    for label, recs in by_set.items():
        folded = [_fold(r.stages or {}) for r in recs]
        stages_s[label] = {k: _median(f.get(k, 0.0) for f in folded) or 0.0 for k in TRIAL_STAGES[:1] + TRIAL_STAGES[2:]
                           if any(k in f for f in folded)}
        step[label] = _median(r.speed.step_time_s.median for r in recs) or 0.0
    one_off: dict[str, list[float]] = defaultdict(list)
    for r in records:
        cache_state = (r.caches or {}).get("inductor", "eager")
        one_off[cache_state].append((r.stages or {}).get("one_off", 0.0))
    cold, warm, eager = (_median(one_off.get(k, ())) for k in ("cold", "warm", "eager"))
    keys = []
    for f in (d / "references").glob("*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if data.get("format") == 2 and isinstance(data.get("seconds"), int | float):
            keys.append(float(data["seconds"]))
    tests = None
    try:
        tests = json.loads((d / "gpu-check.json").read_text()).get("script", {}).get("GPU tests")
    except (OSError, ValueError, AttributeError):
        pass
    # A set it did not measure: the model's steps, but the fixed cost it measured (a trial's start, imports, build
    # and record hardly depend on the set)
    fixed = _median(_fold(r.stages or {}).get("fixed", 0.0) for r in records)
    derived = [f"the last gpu_check on this machine ({d}): {len(records)} trials' stage times, by set; a set it "
               f"did not measure: its fixed cost, {fixed:.1f} s a trial, and the modelled steps"]
    derived.append(f"compilation's one-off {cold if cold is not None else base.compile_cold_s:.1f} s cold "
                   f"({'measured' if cold is not None else 'no cold trial: ' + base.name}), "
                   f"{warm if warm is not None else (cold or base.compile_warm_s):.1f} s warm "
                   f"({'measured' if warm is not None else 'no warm trial: priced as cold'})")
    derived.append(f"references: {len(keys)} of its own, median {_median(keys):.1f} s each" if keys else
                   f"references: none of its own, {base.name}")
    if tests is not None:
        derived.append(f"GPU tests {tests:.0f} s: its gpu-check.json")
    derived += [line for line in base.derived if line.startswith("estimates")]
    return replace(
        base, name=f"the last gpu_check on this machine's ({d.name})", stages_s=stages_s, step_s=step,
        fixed_s=fixed if fixed is not None else base.fixed_s,
        compile_cold_s=cold if cold is not None else base.compile_cold_s,
        compile_warm_s=warm if warm is not None else (cold if cold is not None else base.compile_warm_s),
        eager_one_off_s=eager if eager is not None else base.eager_one_off_s,
        reference_key_s=_median(keys), tests_s=float(tests) if tests is not None else base.tests_s,
        derived=tuple(derived))


def _fold(stages: Mapping[str, float]) -> dict[str, float]:
    """A record's stages folded into the plan's (``_RECORDED``; the rest is the fixed cost)."""
    out: dict[str, float] = defaultdict(float)
    for name, seconds in stages.items():
        out[_RECORDED.get(name, "fixed")] += max(float(seconds), 0.0)
    return dict(out)


# ---- the check --------------------------------------------------------------------------------------------------

# The rehearsal (gpu_check.sh --rehearse): the check's sets and design on the CPU, on the smallest workload, with a
# budget that keeps the whole rehearsal within about 3 minutes on 2 cores; every trial still runs every stage.
REHEARSAL: dict[str, Any] = {
    "workloads": ["mlp:tiny"],
    "budget": {"warmup_steps": 2, "min_steps": 5, "min_seconds": 0.1, "max_seconds": 2.0, "parity_steps": 4,
               "contention_retries": 0, "timeout_s": 120.0, "max_train_seconds": 60.0},
}


def check_config(device: str = "cuda", rehearse: bool = False) -> SweepConfig:
    """The sweep gpu_check.sh runs: the gpu preset's budgets, the core sets in priority order, at --repeats auto
    (the rehearsal's: the same on the CPU, on ``REHEARSAL``'s workload and budget)."""
    return build_config("gpu", {**GPU_CHECK, "repeats": "auto", "device": device, **(REHEARSAL if rehearse else {})})


def sweep_toml(cfg: SweepConfig) -> dict[str, Any]:
    """The check's sweep as a config file's fields (``--config``): what the script passes the sweep."""
    return {"preset": cfg.name, "workloads": [w.label for w in cfg.workloads],
            "techniques": [t.label for t in cfg.techniques], "mode": cfg.mode, "repeats": "auto",
            "order": cfg.order, "budget": dataclasses.asdict(cfg.budget)}


@dataclass(frozen=True)
class Part:
    """One part of the check: what runs, its estimate by stage, and its trials."""

    name: str
    stages: Mapping[str, float]
    trials: int = 0

    @property
    def seconds(self) -> float:
        return sum(self.stages.values())


@dataclass(frozen=True)
class CheckPlan:
    """What gpu_check.sh runs, part by part in order, priced with ``costs``, against a slot of ``budget_s``."""

    cfg: SweepConfig
    costs: Costs
    budget_s: float
    before: tuple[Part, ...]  # the GPU tests, the sweep's start, the references
    groups: tuple[Part, ...]  # the planned trials not yet done, group by group as they run
    after: tuple[Part, ...]  # the report
    margin: float = MARGIN

    @property
    def parts(self) -> tuple[Part, ...]:
        return (*self.before, *self.groups, *self.after)

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def with_margin_s(self) -> float:
        return self.total_s * (1 + self.margin)

    def reached(self) -> list[bool]:
        """Per group: whether it ends within the slot with the margin (the parts before it and the report too)."""
        fixed = sum(p.seconds for p in (*self.before, *self.after))
        done, out = 0.0, []
        for g in self.groups:
            done += g.seconds
            out.append((fixed + done) * (1 + self.margin) <= self.budget_s)
        return out

    @property
    def fits(self) -> bool:
        return all(self.reached())

    @property
    def decide_within_s(self) -> float:
        """The sequential phase's time: what the slot leaves with the margin, once every group fits; else none."""
        return max(0.0, self.budget_s / (1 + self.margin) - self.total_s) if self.fits else 0.0

    def sweep_s(self, through: int) -> float:
        """Seconds from the sweep's start to the end of group ``through`` (0-based), without the margin."""
        start = sum(p.seconds for p in self.before if p.name != "GPU tests")
        return start + sum(g.seconds for g in self.groups[:through + 1])


def _references(trials: Sequence[Trial], cfg: SweepConfig, costs: Costs, cached: set[str]) -> Part | None:
    """The references the trials need and the cache lacks: one process, every missing key."""
    keys: list[ReferenceKey] = list(dict.fromkeys(
        k for k in (reference_key(t, cfg.budget) for t in trials) if k is not None and k.name not in cached))
    if not keys or not cfg.budget.parity_steps:
        return None
    baseline = TechniqueSet(())
    per_key = [costs.reference_key_s if costs.reference_key_s is not None else
               REFERENCE_RUNS * (costs.reference_build_s + k.steps * costs.step(WorkloadSpec(k.workload, k.size),
                                                                                baseline))
               + costs.step(WorkloadSpec(k.workload, k.size), baseline) for k in keys]
    return Part(f"references ({len(keys)} seeds)", {"process": costs.reference_process_s,
                                                    "first use": costs.reference_first_s, "runs": sum(per_key)})


def check_plan(budget_s: float = CHECK_BUDGET_S, costs: Costs = H200, cfg: SweepConfig | None = None,
               tests_s: float | None = None, done: Iterable[str] = (), cached: Iterable[str] = (),
               margin: float = MARGIN) -> CheckPlan:
    """The check's plan in a slot of ``budget_s`` seconds: the GPU tests (``tests_s``, default the costs'; 0 when the
    slot given is what is left after them), the sweep's start, the references not in ``cached`` (their names), the
    planned trials not in ``done`` (their ids) group by group in run order, and the report."""
    cfg = cfg or check_config()
    done, cached = set(done), set(cached)
    trials = [Trial(trial_id(w, t, cfg.seed + r, r), w, t, cfg.seed + r, r, position=i)
              for i, (r, w, t) in enumerate(run_order(cfg))]
    pending = [t for t in trials if t.trial_id not in done]
    warm = {t.techniques for t in trials if t.trial_id in done}  # a set's cache is filled by its first trial
    groups = priority_groups(cfg) if cfg.order == "priority" else [list(dict.fromkeys(t.techniques for t in trials))]
    parts = []
    for group in groups:
        mine = [t for t in pending if t.techniques in group]
        if not mine:
            continue
        stages: dict[str, float] = defaultdict(float)
        for t in mine:
            for name, seconds in trial_stages(t.workload, t.techniques, cfg.budget, cfg.mode, costs,
                                              cold=t.techniques not in warm).items():
                stages[name] += seconds
            warm.add(t.techniques)
        names = " and ".join(s.label for s in group) if cfg.order == "priority" else "the planned trials"
        parts.append(Part(names, dict(stages), len(mine)))
    tests = costs.tests_s if tests_s is None else tests_s
    before = [Part("GPU tests", {"tests": tests})] if tests else []
    before.append(Part("sweep start", {"start": costs.startup_s}))
    refs = _references(pending, cfg, costs, cached)
    if refs:
        before.append(refs)
    return CheckPlan(cfg, costs, budget_s, tuple(before), tuple(parts), (Part("report", {"report": costs.report_s}),),
                     margin)


def plan_for(out: Path | None, budget_s: float, device: str = "cuda", rehearse: bool = False,
             tests_s: float | None = None) -> CheckPlan:
    """The check's plan for its output directory ``out``: what is already done and cached there left out, priced
    from the last check on this machine (``measured_costs``) or the base costs (the H200's, or the CPU guess)."""
    cfg = check_config(device, rehearse)
    base = H200 if device == "cuda" else CPU_GUESS
    done: set[str] = set()
    cached: set[str] = set()
    costs = base
    if out is not None:
        try:
            done = {r.trial_id for r in reader.read_records(out / "results.jsonl")}
        except (OSError, ValueError):
            done = set()
        cached = {f.stem for f in (out / "references").glob("*.json")} if (out / "references").is_dir() else set()
        costs = measured_costs(out, base, this_machine(device))
    return check_plan(budget_s, costs, cfg, tests_s, done, cached)


# ---- the plan in words, as shell, as a table ----------------------------------------------------------------------


def _stages_text(stages: Mapping[str, float]) -> str:
    shown = [(k, v) for k, v in stages.items() if v >= 0.5]
    return " + ".join(f"{k} {v:.0f}" for k, v in shown) if len(shown) > 1 else ""


def describe(plan: CheckPlan) -> list[str]:
    """The plan in words: what runs, where the costs come from, each part's estimate by stage, and how far the slot
    reaches with the margin."""
    cfg = plan.cfg
    lines = [f"gpu_check plan: {', '.join(w.label for w in cfg.workloads)} on {cfg.device}, sets "
             f"{', '.join(t.label for t in cfg.techniques)} in {cfg.order} order ({cfg.mode} mode, {cfg.repeats} "
             "repeats, then speed-only pairs while a verdict is open)",
             f"costs: {plan.costs.name}"]
    lines += [f"  {line}" for line in plan.costs.derived]
    reached = dict(zip((g.name for g in plan.groups), plan.reached(), strict=True))
    for p in plan.parts:
        trials = f" ({p.trials} trials)" if p.trials else ""
        by_stage = _stages_text(p.stages)
        where = "" if p.name not in reached else ("; within the slot" if reached[p.name] else
                                                  "; probably cut by the cap (a second run resumes it)")
        lines.append(f"  {p.name}{trials}: {p.seconds:.0f} s" + (f" = {by_stage}" if by_stage else "") + where)
    verdict = (f"all fit, {plan.decide_within_s:.0f} s left for the sequential phase" if plan.fits else
               "the cap will stop the sweep: the report of what finished is written and says what was cut")
    lines.append(f"total {plan.total_s:.0f} s; with the {plan.margin:.0%} margin {plan.with_margin_s:.0f} s against "
                 f"the {plan.budget_s:.0f} s slot: {verdict}")
    return lines


def shell(plan: CheckPlan, config_path: str | None = None) -> str:
    """The plan as shell assignments, for gpu_check.sh to ``eval``."""
    cut_at = plan.sweep_s(0) + (plan.groups[1].seconds / 2 if len(plan.groups) > 1 else 0.0) if plan.groups else 0.0
    values = {"CHECK_WORKLOADS": ",".join(w.label for w in plan.cfg.workloads),
              "CHECK_TECHNIQUES": ",".join(t.label for t in plan.cfg.techniques),
              "CHECK_MODE": plan.cfg.mode,
              "CHECK_DECIDE_WITHIN": str(int(plan.decide_within_s)),
              "CHECK_REPORT_S": str(math.ceil(plan.costs.report_s * (1 + plan.margin))),
              "CHECK_ESTIMATE_S": str(math.ceil(plan.with_margin_s)),
              "CHECK_FITS": "1" if plan.fits else "0",
              # the rehearsal's first pass is cut here: inside the second group, once bf16 against the baseline
              # should be complete (estimated, without the margin)
              "CHECK_CUT_S": str(math.ceil(cut_at))}
    if config_path:
        values["CHECK_CONFIG"] = config_path
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


COST_COLUMNS = ["part", "trials", "estimate", "by stage (s)", "ends within 8 minutes with the margin"]


def cost_rows(plan: CheckPlan) -> list[list[str]]:
    """The plan as table rows (docs/gpu.md's generated block), then a total row."""
    reached = dict(zip((g.name for g in plan.groups), plan.reached(), strict=True))
    rows = []
    for p in plan.parts:
        fits = "" if p.name not in reached else ("yes" if reached[p.name] else "no: the cap probably cuts it")
        rows.append([p.name, str(p.trials or ""), f"{p.seconds:.0f} s", _stages_text(p.stages), fits])
    rows.append(["total", str(sum(g.trials for g in plan.groups)), f"{plan.total_s:.0f} s "
                 f"({plan.with_margin_s:.0f} s with {plan.margin:.0%} margin)", "", "yes" if plan.fits else "no"])
    return rows


# ---- the gpu preset's sizes ---------------------------------------------------------------------------------------


def size_rows() -> list[list[str]]:
    """Each GPU size of the gpu preset (and ``gpt:gpt2-124m``, the first H200 run's): parameters, batch, FLOPs per
    step, estimated step time on an H200 in fp32 and in bf16 (eager), and its quality run in fp32 (estimates, not
    measurements). A convolutional model's times are lower bounds ("at least"): small convolutions run far below
    the transformer's rate the estimate assumes."""
    rows = []
    fp32, bf16 = TechniqueSet(()), TechniqueSet.parse("bf16")
    for label in [*PRESETS["gpu"]["workloads"], "gpt:gpt2-124m"]:
        w = WorkloadSpec.parse(label)
        p = workloads.get(w.name).size_params(w.size)
        flops = flops_per_sample(w.name, w.size) * p["batch_size"]
        quality = quality_s(w, step_s(w, fp32), Budget(train_steps=0, max_train_seconds=1e9, timeout_s=2e9))
        structure = workloads.get(w.name).structure(w.size)
        bound = "at least " if structure is not None and structure.convolutional else ""
        rows.append([w.label, f"{n_params(w.name, w.size) / 1e6:.0f}M", str(p["batch_size"]),
                     f"{flops / T:.1f} TFLOP", f"{bound}{step_s(w, fp32) * 1e3:.0f} ms",
                     f"{bound}{step_s(w, bf16) * 1e3:.0f} ms", f"{p['quality_steps']} steps, {bound}{quality:.0f} s"])
    return rows


SIZE_COLUMNS = ["size", "parameters", "batch", "FLOPs per step", "step, fp32 (estimate)", "step, bf16 (estimate)",
                "quality run, fp32 (estimate)"]


def preset_s(costs: Costs = H200) -> tuple[float, float]:
    """The whole gpu preset on an H200 (every configuration assumed to run, an upper bound where the planner skips
    some): its planned trials' seconds, and the sequential phase's default budget (half that)."""
    cfg = build_config("gpu", {"device": "cuda"})
    sets = list(dict.fromkeys([TechniqueSet(()), *cfg.techniques]))
    planned = sum(trial_s(w, t, cfg.budget, cfg.mode, costs, cold=r == 0)
                  for r in range(cfg.repeats) for w in cfg.workloads for t in sets)
    return planned, planned / 2
