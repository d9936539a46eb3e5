"""The GPU preset's arithmetic: what a step of each GPU size costs, what a trial and a sweep cost, and whether
``scripts/gpu_check.sh`` fits its slot. Every figure this module gives is an estimate, not a measurement.

Where the figures come from:

- FLOPs per step: the harness's own counter (``bench.measure.flops.count_flops``, FlopCounterMode) on one training
  step (forward, loss, backward) of the size's model built on the meta device at batch 1, times the batch. SDPA is
  counted through the math kernel there (meta tensors); the CUDA trials of the first H200 run counted 3% more on
  ``gpt:gpt2-124m``, since torch's formula for the flash kernel's backward counts its recomputation.
- Throughput: what the first H200 run measured on ``gpt:gpt2-124m`` at batch 8 (reports/example-h200-first,
  2026-12-04: achieved FLOP/s, the median over each set's trials), by the set's compute dtype and whether it
  compiles. A larger batch keeps the GPU busier (an independent bare loop reached 420 TFLOP/s at batch 32 with bf16,
  compile and fused AdamW: bare-loop.jsonl), so step times estimated from batch 8's rates are upper bounds for a
  transformer; convolutions over 28x28 images run far below a transformer's rate, so for the cnn they are lower
  bounds.
- A trial's costs beside its steps: today's, from the same run (``TODAY``: the median over its trials of the wall
  time outside the timed window, the first step and the passes' steps; compile's one-off on an empty cache, paid in
  every repeat), and issue 40's target for the trial-cost work (``TARGET``: 3 s, and compile's cache shared from the
  second repeat on).

tests/test_gpu_check.py derives the H200 figures again from the committed records and holds ``scripts/gpu_check.sh``'s
plan to its budget.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from bench import workloads
from bench.core.errors import ConfigError
from bench.measure.flops import count_flops
from bench.plan.config import (
    GPU_CHECK,
    PRESETS,
    Budget,
    SweepConfig,
    TechniqueSet,
    WorkloadSpec,
    build_config,
)
from bench.records.results import TrialRecord
from bench.workloads import cnn_fashion, gpt_chars, llama_chars
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
# The warm cache's share of the cold compile: DESIGN's CPU figures (cold 8-10 s, warm 1-1.6 s), the upper end. No
# GPU measurement: an estimate until a GPU run with a shared cache records both.
WARM_COMPILE_FRACTION = 0.16
VOCAB = 224  # the corpus's characters on the H200 (Python 3.12.3); another CPython differs by a few
PHASE_STEPS = 10  # bench.trial.PHASE_STEPS (the phase pass), checked by the tests
MEMORY_STEPS = 4  # the memory passes: one step into place, bench.trial.CLEAN_RSS_STEPS (2), one tracked step
STARTUP_S = 10.0  # a sweep's start: imports, the fingerprint, peak calibration (about 0.7 s of matmuls on the H200)
REPORT_S = 30.0  # summary, report.md, report.html and figures at the end (an estimate)
PYTEST_S = 90.0  # the GPU-marked tests' cap in gpu_check.sh (the first H200 run: 31.7 s for 15 tests)
CHECK_BUDGET_S = 480.0  # gpu_check.sh's slot: 8 minutes, so a 15-minute slot can run it twice


@dataclass(frozen=True)
class TrialCosts:
    """What a trial costs beside its steps, in seconds."""

    name: str
    fixed_s: float  # process start, imports, build, data, CUDA's start, the record, teardown
    compile_cold_s: float  # compile's one-off with an empty cache (repeat 0)
    compile_warm_s: float  # ... in later repeats (the cache shared across repeats, or not: then the cold cost)


TODAY = TrialCosts("today (the first H200 run)", H200_FIXED_S, H200_COMPILE_COLD_S, H200_COMPILE_COLD_S)
TARGET = TrialCosts("issue 40's target (3 s beside the steps, the compiled code's cache shared)", 3.0, H200_COMPILE_COLD_S,
                    WARM_COMPILE_FRACTION * H200_COMPILE_COLD_S)


# ---- FLOPs per sample, counted on the meta device ---------------------------------------------------------------


def _gpt(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    cfg = gpt_chars.GPTConfig(vocab_size=VOCAB, seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                              d_model=p["d_model"])
    return gpt_chars.GPT(cfg), (1, p["seq_len"])


def _llama(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    return llama_chars.Llama(llama_chars.config_of({**p, "vocab_size": VOCAB})), (1, p["seq_len"])


def _cnn(p: dict) -> tuple[nn.Module, tuple[int, ...]]:
    return cnn_fashion.ResNet(list(p["widths"]), p["blocks_per_stage"], p["stem_stride"]), (1, 1, 28, 28)


# The workloads whose models this module can build without their data: the GPU sizes' families.
_MODELS: dict[str, Callable[[dict], tuple[nn.Module, tuple[int, ...]]]] = {"gpt": _gpt, "llama": _llama, "cnn": _cnn}


@cache
def flops_per_sample(workload: str, size: str) -> int:
    """Model FLOPs of one training step at batch 1 (forward, loss and backward), counted on a meta build."""
    if workload not in _MODELS:
        raise ConfigError(f"no FLOP estimate for workload {workload!r} (estimated: {', '.join(_MODELS)})")
    p = workloads.get(workload).size_params(size)
    with torch.device("meta"):
        model, shape = _MODELS[workload](p)
        if len(shape) == 2:  # token ids in, a character at each position out
            x = torch.zeros(shape, dtype=torch.long)
            y = torch.zeros(shape, dtype=torch.long)

            def step() -> None:
                gpt_chars.lm_loss(model(x), y).backward()
        else:
            x, y = torch.zeros(shape), torch.zeros(shape[0], dtype=torch.long)

            def step() -> None:
                F.cross_entropy(model(x), y).backward()

        return count_flops(step)


def n_params(workload: str, size: str) -> int:
    """The parameters of a size's model (a meta build: nothing allocated)."""
    with torch.device("meta"):
        model, _ = _MODELS[workload](workloads.get(workload).size_params(size))
    return sum(p.numel() for p in model.parameters())


# ---- a step, a trial, a sweep -----------------------------------------------------------------------------------


def rate(techs: TechniqueSet) -> float:
    """The H200 throughput an estimate assumes for a set: by its compute dtype and whether it compiles."""
    instances = [spec.resolve() for spec in techs.specs]
    dtype = set_compute_dtype(instances)
    compiled = any(t.phase == Phase.COMPILE for t in instances)
    dtype = "bfloat16" if dtype == "float16" else dtype
    return H200_FLOPS.get((dtype, compiled)) or H200_FLOPS[(dtype, False)]


def step_s(workload: WorkloadSpec, techs: TechniqueSet, batch_size: int | None = None) -> float:
    """Seconds per optimizer step on an H200 (an estimate: FLOPs over the measured rate)."""
    batch = batch_size or workloads.get(workload.name).size_params(workload.size)["batch_size"]
    return flops_per_sample(workload.name, workload.size) * batch / rate(techs)


def trial_s(workload: WorkloadSpec, techs: TechniqueSet, budget: Budget, mode: str, costs: TrialCosts,
            cold: bool) -> float:
    """One trial's wall time (an estimate): fixed costs, compile's one-off, the speed window and the passes' steps
    around it (mode speed or both), the quality run and its evaluations (mode quality or both)."""
    s = step_s(workload, techs)
    total = costs.fixed_s
    if any(spec.resolve().phase == Phase.COMPILE for spec in techs.specs):
        total += costs.compile_cold_s if cold else costs.compile_warm_s
    if mode in ("speed", "both"):
        window = min(max(budget.min_steps * s, budget.min_seconds), max(budget.max_seconds, s))
        passes = max(budget.warmup_steps, budget.parity_steps) + PHASE_STEPS + (MEMORY_STEPS if budget.memory else 0)
        total += math.ceil(window / s) * s + passes * s
    if mode in ("quality", "both"):
        p = workloads.get(workload.name).size_params(workload.size)
        steps = budget.train_steps or p["quality_steps"]
        evals = (budget.eval_points or p["eval_points"]) + 1
        eval_s = _eval_s(p, s)  # forward passes over the held-out set: about a third of a training step's work
        total += min(steps * s, budget.max_train_seconds) + evals * eval_s
    return total


def _eval_s(p: dict, step: float) -> float:
    held_out = p.get("eval_windows") or p.get("n_eval") or p["batch_size"]
    return step * held_out / p["batch_size"] / 3


@dataclass(frozen=True)
class SweepEstimate:
    """A sweep's wall time on an H200, by part (seconds; estimates)."""

    costs: TrialCosts
    trials: int
    planned_s: float  # the planned trials (repeats x workloads x sets)
    references_s: float  # the parity references: one process per workload and seed
    startup_s: float
    report_s: float
    sequential_s: float  # the time the sequential phase may spend (``decide_within``)

    @property
    def total_s(self) -> float:
        return self.startup_s + self.references_s + self.planned_s + self.sequential_s + self.report_s


def sweep_estimate(cfg: SweepConfig, costs: TrialCosts, decide_within: float | None = None) -> SweepEstimate:
    """Every configuration assumed to run (an upper bound where the planner skips some: a set a workload cannot
    take, refused on the device). The sequential phase: ``decide_within`` or the config's, else half the planned
    trials' time (the runner's default), and none in a fixed design."""
    baseline = TechniqueSet(())
    sets = list(dict.fromkeys([baseline, *cfg.techniques]))
    planned = sum(trial_s(w, t, cfg.budget, cfg.mode, costs, cold=r == 0)
                  for r in range(cfg.repeats) for w in cfg.workloads for t in sets)
    references = 0.0
    if cfg.budget.parity_steps:
        references = sum(costs.fixed_s + cfg.budget.parity_steps * step_s(w, baseline)
                         for w in cfg.workloads) * cfg.repeats
    within = decide_within if decide_within is not None else cfg.decide_within
    sequential = (within if within is not None else planned / 2) if cfg.sequential else 0.0
    return SweepEstimate(costs, cfg.repeats * len(cfg.workloads) * len(sets), planned, references, STARTUP_S,
                         REPORT_S, sequential)


# ---- scripts/gpu_check.sh ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckPlan:
    """What gpu_check.sh runs after its GPU tests, and the time it leaves the sequential phase."""

    cfg: SweepConfig
    budget_s: float  # the slot's
    tests_s: float  # the part of it the GPU tests may take
    estimate: SweepEstimate  # with ``decide_within`` what is left

    @property
    def decide_within_s(self) -> float:
        return self.estimate.sequential_s

    @property
    def fits(self) -> bool:
        """The planned trials, the tests and the report fit the slot with no time left for the sequential phase
        at worst (it gets what is left, and a cap stops the sweep at the slot's end in any case)."""
        return self.decide_within_s >= 0


def check_config(device: str = "cuda") -> SweepConfig:
    """The sweep gpu_check.sh runs: the gpu preset's budgets, the core sets, at --repeats auto."""
    return build_config("gpu", {**GPU_CHECK, "repeats": "auto", "device": device})


def check_plan(budget_s: float = CHECK_BUDGET_S, costs: TrialCosts = TARGET, cfg: SweepConfig | None = None,
               tests_s: float = PYTEST_S) -> CheckPlan:
    """The core sets' plan in a slot of ``budget_s`` seconds, ``tests_s`` of it for the GPU tests: the sequential
    phase gets what the estimate leaves, negative when the planned trials alone do not fit."""
    cfg = cfg or check_config()
    planned = sweep_estimate(cfg, costs, decide_within=0.0)
    left = budget_s - tests_s - planned.total_s
    return CheckPlan(cfg, budget_s, tests_s, sweep_estimate(cfg, costs, decide_within=left))


def describe(plan: CheckPlan) -> list[str]:
    """The plan in words: what runs, and the estimate by part."""
    e = plan.estimate
    return [
        f"gpu_check plan: {', '.join(w.label for w in plan.cfg.workloads)} x "
        f"{', '.join(t.label for t in plan.cfg.techniques)} ({plan.cfg.mode} mode, {plan.cfg.repeats} repeats then "
        "speed-only pairs while a verdict is open)",
        f"estimate with {e.costs.name}: tests up to {plan.tests_s:.0f} s, start {e.startup_s:.0f} s, references "
        f"{e.references_s:.0f} s, {e.trials} planned trials {e.planned_s:.0f} s, report {e.report_s:.0f} s; "
        f"left for the sequential phase {plan.decide_within_s:.0f} s of a {plan.budget_s:.0f} s slot",
    ]


def shell(plan: CheckPlan) -> str:
    """The plan as shell assignments, for gpu_check.sh to ``eval``."""
    values = {"CHECK_WORKLOADS": ",".join(w.label for w in plan.cfg.workloads),
              "CHECK_TECHNIQUES": ",".join(t.label for t in plan.cfg.techniques),
              "CHECK_MODE": plan.cfg.mode,
              "CHECK_DECIDE_WITHIN": str(max(0, int(plan.decide_within_s)))}
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items())


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
        quality = trial_s(w, fp32, Budget(train_steps=0, max_train_seconds=1e9, timeout_s=2e9), "quality",
                          TrialCosts("", 0.0, 0.0, 0.0), cold=True)
        structure = workloads.get(w.name).structure(w.size)
        bound = "at least " if structure is not None and structure.convolutional else ""
        rows.append([w.label, f"{n_params(w.name, w.size) / 1e6:.0f}M", str(p["batch_size"]),
                     f"{flops / T:.1f} TFLOP", f"{bound}{step_s(w, fp32) * 1e3:.0f} ms",
                     f"{bound}{step_s(w, bf16) * 1e3:.0f} ms", f"{p['quality_steps']} steps, {bound}{quality:.0f} s"])
    return rows


SIZE_COLUMNS = ["size", "parameters", "batch", "FLOPs per step", "step, fp32 (estimate)", "step, bf16 (estimate)",
                "quality run, fp32 (estimate)"]


def fixed_cost_s(rec: TrialRecord) -> float | None:
    """A speed trial's wall time beside its timed window, its first step and the passes' steps (warm-up after the
    first, phase pass, memory passes) at the window's median step: what ``H200_FIXED_S`` is the median of."""
    s, b, ph = rec.speed, rec.build, rec.phases
    if s is None or b is None or rec.wall_s is None or s.step_time_s.median is None:
        return None
    passes = (s.warmup_steps - 1 + (ph.steps if ph else 0) + MEMORY_STEPS) * s.step_time_s.median
    return rec.wall_s - s.window_s - (b.first_step_s or 0.0) - passes
