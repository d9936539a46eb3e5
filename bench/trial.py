"""Inside the child process: one trial as typed stages, each a small function returning a frozen dataclass.

``python -m bench.trial SPEC.json RECORD.json``. The runner starts one such process per trial so memory peaks are
clean and a crash takes down one trial, not the sweep. Two questions, two measurements that never share a budget:

1. ``reference``: the eager fp32 reference of this workload, seed and batch (losses, parameter-distance
   trajectory, FLOPs per step), computed in a process of its own and cached (``bench.reference``);
2. ``build``: the model with the techniques applied in phase order, its optimizer, loop and batches;
3. ``quality_run`` (modes quality, both): how fast the model learns. From the freshly built model, train the
   workload size's sample budget, evaluated at the same sample counts as every other set (evaluation untimed). The
   first step is timed on its own: what it costs beyond a steady step (compilation) is a one-off cost, kept out of
   the training clock and reported apart. A wall-clock cap is only a safety net: a run it cuts is marked as such.
   With ``train_until_s`` (a continuation, ``bench.run.continuation``) the run then trains on past the budget, at the
   same evaluation cadence, until its training clock reaches that time (the equal-time comparison);
4. ``speed_window`` (modes speed, both): how fast a step is. Warm-up, then a timed window with a device sync only
   at its edges; FLOPs and MFU on the window's own clock;
5. ``parity``: the first optimizer steps of whichever stage ran first against the reference: losses and the
   parameter-distance trajectory; the tolerances calibrated on the reference's harmless run, the answer ok,
   mismatch or inconclusive (``bench.reference.judge``);
6. ``memory``: the window's peaks, then a clean RSS pass (malloc set to return freed memory; it slows steps and
   stays set, so it comes last), then one step under the tensor tracker.

The quality run comes first so it starts from the freshly built weights and its first step is the process's
first; the speed window does not care what the weights are.
"""

from __future__ import annotations

# ruff: noqa: E402 (the clock is read before the imports below, which are a stage of the trial's own)
import time

FIRST_LINE = (time.time(), time.perf_counter())  # the trial process's first line: where its imports start

import atexit
import collections
import contextlib
import dataclasses
import datetime as dt
import functools
import gc
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench import reference as reference_mod
from bench import workloads
from bench.analyze.bottleneck import diagnose
from bench.core.data import CACHE_EVENTS
from bench.core.files import write_atomic
from bench.core.structure import describe
from bench.loop import (
    TrainLoop,
    build_optimizer,
    lr_warmup_steps,
    overrides,
    plain_loop,
    recipe,
    single_owner,
)
from bench.measure import energy as energy_mod
from bench.measure.energy import EnergyMeter
from bench.measure.env import datasheet_peak
from bench.measure.flops import count_flops
from bench.measure.memory import (
    PeakRss,
    TensorMemoryTracker,
    cuda_peak_bytes,
    cuda_peak_reset,
    return_freed_memory_to_os,
    trim_heap,
)
from bench.measure.phases import PhaseClock, device_busy_pass, summarize_phases
from bench.measure.stages import StageClock, split_measured
from bench.measure.timing import (
    ContentionResult,
    CpuContention,
    StepTimer,
    WindowResult,
    host_barrier,
    summarize,
)
from bench.measure.trace import DeviceBusy
from bench.plan import plugins, user_models
from bench.plan.config import Budget, TechniqueSet, TechniqueSpec
from bench.plan.planner import ReferenceKey
from bench.records.results import (
    CONTENDED_ABOVE,
    BuildInfo,
    Contention,
    ContinuationResult,
    EnergyResult,
    MemoryResult,
    ParityResult,
    PhaseResult,
    QualityResult,
    SpeedResult,
    StepStats,
    TrialRecord,
    memory_exhausted,
    sanitize,
)
from bench.reference import ReferenceResult, Trajectory
from techniques._distributed import model_state_bytes, zero_formula_bytes
from techniques.base import (
    Context,
    Kind,
    Phase,
    Probe,
    Technique,
    TrainConfig,
    batch_shards,
    set_compute_dtype,
    set_kind,
    set_zero_stage,
)

log = logging.getLogger(__name__)

CONTENTION_WARN = CONTENDED_ABOVE  # other processes used more than 10% of the cores during the timed window
CONTENTION_PAUSE_S = 2.0  # before a contended window is measured again: let a short burst of other work pass
CLEAN_RSS_STEPS = 2
MAX_CONTINUATION_FACTOR = 4  # a continuation trains at most this multiple of the budget's samples in all


@dataclass
class TrialSpec:
    """What the runner hands to the child process (as JSON)."""

    sweep_id: str
    trial_id: str
    workload: str
    size: str
    techniques: list[str]  # technique spec labels, e.g. ["bf16", "grad_accum:steps=4"]
    seed: int
    repeat: int
    device: str
    budget: dict[str, Any]
    peaks: dict[str, float] = field(default_factory=dict)  # calibrated matmul peak FLOP/s by dtype, this thread count
    peak_source: str | None = None  # which calibration the peaks come from
    device_peaks: dict[str, dict[str, float]] = field(default_factory=dict)  # several CUDA ranks: each device's peaks
    world_size: int = 1
    threads: int = 0
    mode: str = "both"  # speed | quality | both
    position: int = 0  # index in the sweep's run order
    reference_dir: str | None = None  # cache of parity references (None: a temporary one)
    plugins: list[dict[str, Any]] = field(default_factory=list)  # users' models and techniques to load first
    train_until_s: float | None = None  # quality: after the budget, train on to this training clock (equal time)

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        # Without users' code or a continuation the spec stays as older checkouts read it (``sweep --ab REV`` runs
        # their trial code).
        optional = ("plugins", "train_until_s", "device_peaks")
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if k not in optional or v})


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class Session:
    """The live objects of one built trial: what the stages train and measure. Not part of the record."""

    spec: TrialSpec
    budget: Budget
    built: workloads.BuiltWorkload
    techs: list[Technique]
    ctx: Context
    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loop: TrainLoop
    batches: Iterator[Any]
    kind: Kind
    probe: ParityProbe | None = None
    steps_done: int = 0
    first_step_s: float | None = None  # the process's first training step, timed alone
    one_off_s: float | None = None  # its excess over a steady step of the stage that ran it
    probe_s: float = 0.0  # the techniques' probes before training (tune)
    full_batch: dict[str, Any] = field(default_factory=dict)  # "batch": the workload's first batch, before techniques
    n_params: int = 0  # the whole model's, counted before techniques shard it or cut it into stages
    trained_params: int = 0  # after the techniques' model surgery (leaner architecture, extra heads)
    curve_extra: dict[str, list[float | None]] = field(default_factory=dict)  # the workload's curve_metrics
    clock: StageClock = field(default_factory=StageClock)  # the trial's stage times (``bench.measure.stages``)
    # GPU-only measurements that failed here, by name, with why (the record's ``unavailable``): the trial goes on
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def batch_shards(self) -> int:
        """Slices of the global batch across the ranks (the world size under data parallelism, else 1)."""
        return batch_shards(self.techs, self.spec.world_size)


# ---- stage: build -----------------------------------------------------------------------------------------------


def build(spec: TrialSpec, budget: Budget, device: torch.device) -> Session:
    """The workload's model with the techniques applied in phase order, its optimizer, loop and batches.

    Techniques that tune the run (``tune``: LR range test, batch-size search) probe fresh copies of the workload
    first; their wall time is the trial's ``probe_s``, a one-off cost.
    """
    wl = workloads.get(spec.workload)
    techs = sorted((TechniqueSpec.parse(t).resolve() for t in spec.techniques), key=lambda t: t.phase)
    built = wl.build(spec.size, spec.seed, device)
    cfg, ctx, probe_s = configure(wl, spec.size, built, techs, budget, spec.seed, device, spec.world_size,
                                  Path(spec.reference_dir) if spec.reference_dir else None)
    model = built.model
    n_params = trained_params = sum(p.numel() for p in model.parameters())
    for tech in techs:
        model = tech.transform_model(model, ctx)
        if tech.phase == Phase.SURGERY:  # later phases shard or cut the model: not a different model
            trained_params = sum(p.numel() for p in model.parameters())
    optimizer = build_optimizer(model, techs, ctx, cfg.lr, cfg.weight_decay, built)
    full: dict[str, Any] = {}
    source = single_owner(techs, "batches")
    loaded = source.batches(built.pipeline, cfg.batch_size, spec.seed, ctx) if source is not None else None
    batches = _noting_first(loaded if loaded is not None else built.batches(cfg.batch_size, spec.seed), full)
    for tech in techs:
        batches = tech.wrap_data(batches, ctx)
    loop = TrainLoop(model, optimizer, built.loss_fn, techs, ctx, cfg.micro_batches, built.tokens_per_sample,
                     lr_warmup_steps(built, cfg.batch_size), built.forward_targets, built.schedule)
    return Session(spec, budget, built, techs, ctx, cfg, model, optimizer, loop, batches, set_kind(techs),
                   probe_s=probe_s, full_batch=full, n_params=n_params, trained_params=trained_params)


def _noting_first(batches: Iterator[Any], into: dict[str, Any]) -> Iterator[Any]:
    """The workload's batches, the first one kept (cloned: small) as the full batch FLOPs are counted against."""
    first = next(batches)
    into["batch"] = tuple(t.clone() for t in first)
    yield first
    yield from batches


def configure(wl: workloads.Workload, size: str, built: workloads.BuiltWorkload, techs: list[Technique],
              budget: Budget, seed: int, device: torch.device, world_size: int = 1, cache_dir: Path | None = None
              ) -> tuple[TrainConfig, Context, float]:
    """The TrainConfig the techniques settle on (``configure``, then ``tune``'s probes), the context they share,
    and the probes' wall time."""
    cfg = TrainConfig(batch_size=built.batch_size, lr=built.lr)
    for tech in techs:
        cfg = tech.configure(cfg)
    structure = built.structure if built.structure is not None else describe(built.model)
    ctx = Context(device=device, workload=wl.name, seed=seed, rank=_rank(), world_size=world_size,
                  has_batchnorm=has_batchnorm(built.model), structure=structure,
                  technique_names=tuple(t.name for t in techs), metric=built.metric,
                  higher_is_better=built.higher_is_better, sequence_length=built.tokens_per_sample,
                  cache_dir=cache_dir, has_preferences=built.preference is not None, preference=built.preference,
                  forward_targets=built.forward_targets)
    _plan_into(ctx, budget, built, cfg)
    cfg, probe_s = _tune(techs, cfg, ctx, Probe(functools.partial(_fresh, wl, size, seed, device), device, seed,
                                                make_loop=plain_loop))
    _plan_into(ctx, budget, built, cfg)
    ctx.state.update(lr=cfg.lr, local_batch_size=cfg.batch_size // batch_shards(techs, world_size) // cfg.micro_batches)
    return cfg, ctx, probe_s


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _fresh(wl: workloads.Workload, size: str, seed: int, device: torch.device, other_seed: int | None = None
           ) -> workloads.BuiltWorkload:
    return wl.build(size, seed if other_seed is None else other_seed, device)


def _tune(techs: list[Technique], cfg: TrainConfig, ctx: Context, probe: Probe) -> tuple[TrainConfig, float]:
    """Each tuning technique's probes, in the set's order, on fresh copies of the workload, and their time less
    what went into work cached for the whole sweep; the global RNG is restored afterwards so the trial's own run
    does not depend on how much the probes drew."""
    tuners = [t for t in techs if overrides(t, "tune")]
    if not tuners:
        return cfg, 0.0
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[ctx.device] if ctx.is_cuda else []):
        for tech in tuners:
            cfg = tech.tune(cfg, probe, ctx)
    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    return cfg, max(time.perf_counter() - started - probe.shared_s, 0.0)


def _plan_into(ctx: Context, budget: Budget, built: workloads.BuiltWorkload, cfg: TrainConfig) -> None:
    """Tell the techniques the quality run's plan (0 steps when the workload has no quality budget)."""
    plan = quality_plan(budget, built, cfg)
    ctx.total_steps, ctx.total_samples = plan.steps, plan.budget_samples


def build_info(session: Session) -> BuildInfo:
    return BuildInfo(
        n_params=session.n_params,
        batch_size=session.cfg.batch_size,
        micro_batches=session.cfg.micro_batches,
        tokens_per_sample=session.built.tokens_per_sample,
        threads=torch.get_num_threads(),
        first_step_s=session.first_step_s,
        one_off_s=session.one_off_s,
        probe_s=session.probe_s,
        trained_params=session.trained_params if session.trained_params != session.n_params else None,
        resources=resources(session.spec.world_size, session.device),
        recipe=recipe_of(session),
    )


def resources(ranks: int, device: torch.device) -> dict[str, int]:
    """What the trial ran on: its ranks, each rank's torch threads, the cores they may keep busy (ranks x threads)
    and the accelerators (one per rank on CUDA, none on the CPU), so a comparison can hold them equal or say it
    does not."""
    threads = torch.get_num_threads()
    return {"ranks": ranks, "threads": threads, "cores": ranks * threads,
            "devices": ranks if device.type == "cuda" else 0}


def recipe_of(session: Session) -> dict[str, Any]:
    """The optimizer the trial stepped (``bench.loop.recipe``) and whose LR schedule ran: the workload's own (a
    user's build returned one), replaced by a technique that owns the LR, or none."""
    schedule = None
    if session.built.schedule is not None:
        owners = [t.name for t in session.techs if t.owns_lr]
        schedule = f"replaced by {', '.join(owners)}" if owners else "the workload's"
    return {"optimizer": recipe(session.optimizer), "schedule": schedule,
            "own_optimizer": session.built.optimizer is not None}


# ---- stage: reference -------------------------------------------------------------------------------------------


def reference_key(session: Session) -> ReferenceKey:
    return ReferenceKey(session.spec.workload, session.spec.size, session.spec.seed, session.cfg.batch_size,
                        session.budget.parity_steps)


def reference(session: Session) -> ReferenceResult:
    """The cached reference of this trial's key; computed now, in a child process, when the cache lacks it (the
    runner computes a sweep's references before its first trial, so this is for direct use of ``run``)."""
    key = reference_key(session)
    spec = session.spec
    cache = Path(spec.reference_dir) if spec.reference_dir else _private_reference_dir()
    found = reference_mod.load(cache, key)
    if found is None and _rank() == 0:
        reference_mod.ensure([key], cache, session.device.type, plugins=spec.plugins)
    if _world() > 1:
        dist.barrier()
    found = found or reference_mod.load(cache, key)
    if found is None:
        raise RuntimeError(f"no parity reference {key.name} in {cache}")
    dataset = session.built.dataset.get("sha256")
    if found.dataset and dataset and found.dataset != dataset:
        raise RuntimeError(f"the parity reference {reference_mod.path_of(cache, key)} was computed on other data "
                           f"(sha256 {found.dataset[:12]}, this trial's {dataset[:12]}): delete it to recompute")
    if found.lr_warmup_steps != session.loop.lr_warmup:
        raise RuntimeError(f"the parity reference {reference_mod.path_of(cache, key)} warmed its LR up over "
                           f"{found.lr_warmup_steps} steps, this trial over {session.loop.lr_warmup}: delete it to "
                           "recompute")
    return found


@functools.cache
def _private_reference_dir() -> Path:
    """A reference cache of this process's own (direct calls of ``run``), removed at exit: a shared one could
    outlive a change of the code that computes references."""
    path = Path(tempfile.mkdtemp(prefix="trainbench-references-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# ---- parity -----------------------------------------------------------------------------------------------------


class ParityProbe:
    """Losses and the parameter-distance trajectory of a session's first ``steps`` optimizer steps."""

    def __init__(self, model: nn.Module, steps: int) -> None:
        self.steps = steps
        self.trajectory = Trajectory(model)
        self.losses: list[torch.Tensor] = []
        self.distances: list[float] = []

    @property
    def active(self) -> bool:
        return len(self.distances) < self.steps

    def after_step(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach())
        self.distances.append(self.trajectory.distance())
        if not self.active:
            self.trajectory.close()  # frees the snapshot of the initial weights


def parity(session: Session, ref: ReferenceResult) -> ParityResult | None:
    """The first steps against the reference, with the set kind's loss tolerance calibrated on the reference's
    harmless run and the answer ok, mismatch or inconclusive (``bench.reference.judge``)."""
    probe = session.probe
    if probe is None or probe.active:
        return None
    losses = [float(x) for x in _mean_over_ranks(torch.stack(probe.losses))]
    note = None
    if session.cfg.micro_batches > 1 and session.ctx.has_batchnorm:
        note = "BatchNorm computes statistics per micro-batch, so accumulation is not exact"
    return reference_mod.judge(session.kind.value, losses, list(probe.distances), ref, note)


# ---- stage: quality run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QualityPlan:
    budget_samples: int
    steps: int
    eval_steps: tuple[int, ...]


def quality_plan(budget: Budget, built: workloads.BuiltWorkload, cfg: TrainConfig) -> QualityPlan:
    """The sample budget (the size's documented budget, or --steps, at the workload's global batch) and the steps
    at which every set evaluates. A workload without a quality budget plans 0 steps."""
    ref_steps = budget.train_steps or built.quality_steps
    samples = max(ref_steps, 0) * built.batch_size
    steps = math.ceil(samples / cfg.batch_size)
    points = budget.eval_points or built.eval_points
    evals = sorted({math.ceil(steps * i / points) for i in range(1, points + 1)} | {steps})
    return QualityPlan(samples, steps, tuple(evals))


def quality_run(session: Session) -> QualityResult:
    """Train the sample budget from the freshly built model; evaluate at the planned steps, untimed.

    The training clock is synchronised at segment edges only (the first step, the parity probe's steps, each
    evaluation), so queued GPU work between them is not serialised. The first step's excess over a steady step is
    the one-off cost: the curve's times leave it out (``build.one_off_s`` has it). With ``spec.train_until_s`` the
    run trains on past the budget afterwards (``_train_on``); the budget's part is trained exactly as without it.
    """
    budget, built = session.budget, session.built
    plan = quality_plan(budget, built, session.cfg)
    if plan.steps <= 0:
        raise ValueError(f"workload {session.spec.workload}:{session.spec.size} has no quality budget: give --steps")
    tokens_before = session.loop.tokens
    curve: list[list[Any]] = []
    clock, pending, cut, stopped = 0.0, [], None, None
    evals = set(plan.eval_steps)
    contention = CpuContention(include_siblings=session.spec.world_size > 1)
    contention.start()

    def evaluate(step: int) -> None:
        curve.append(_eval_row(session, step, clock, pending))

    evaluate(0)
    _sync(session.device)
    seg_start = time.perf_counter()
    for step in range(1, plan.steps + 1):
        loss = session.loop.step(next(session.batches))
        pending.append(loss.detach())
        session.steps_done += 1
        probing = session.probe is not None and session.probe.active
        if step == 1 or probing or step in evals:
            _sync(session.device)
            now = time.perf_counter()
            clock += now - seg_start
            if session.first_step_s is None:
                session.first_step_s = now - seg_start
            if probing:
                session.probe.after_step(loss)
            if step in evals:
                _check_finite(loss, session.steps_done)
                evaluate(step)
                if step < plan.steps and _agree(clock > budget.max_train_seconds):
                    cut = (f"stopped at step {step} of {plan.steps}: the training clock passed "
                           f"max_train_seconds={budget.max_train_seconds:g} (a safety cap, not a budget)")
                    break
                if step == plan.steps:  # the budget ends here: nothing left to stop
                    continue
                asked = [t.name for t in session.techs if t.on_eval({built.metric: curve[-1][-1]}, session.ctx)]
                if _agree(bool(asked)):
                    stopped = f"{', '.join(asked) or 'another rank'} stopped the run at step {step} of {plan.steps}"
                    break
            _sync(session.device)
            seg_start = time.perf_counter()
    steps = curve[-1][1]
    session.one_off_s = one_off = _one_off(session.first_step_s, clock, steps)
    # the loop counts this rank's tokens: every rank's, under data parallelism
    tokens = (session.loop.tokens - tokens_before) * session.batch_shards if built.tokens_per_sample else None
    n_budget = len(curve)
    continuation = None
    if session.spec.train_until_s is not None:
        continuation = _train_on(session, plan, curve, clock, one_off, cut or stopped)
    busy = contention.stop()
    for point in curve[1:]:
        point[2] = max(point[2] - one_off, 0.0)
    return _quality_result(session, plan, curve, n_budget, one_off, cut, stopped, busy, tokens, continuation)


def uncontended_quality_run(session: Session) -> QualityResult:
    """The quality run, trained again from a fresh build while other processes used the cores (as a contended
    timed window is measured again): its clock is what equal-time and time-to-target read. After the budget's
    retries a run that stayed contended is marked ``contended``, and the analysis leaves its clock out."""
    retried: list[float] = []
    started = time.perf_counter()
    while True:
        result = quality_run(session)
        fraction = result.contention.fraction if result.contention is not None else 0.0
        contended = _agree(fraction > CONTENTION_WARN)
        # another run must fit in half the trial's timeout, or the retry would lose the whole trial to it
        spent = time.perf_counter() - started
        no_time = _agree(spent * (len(retried) + 2) / (len(retried) + 1) + CONTENTION_PAUSE_S
                         > 0.5 * session.budget.timeout_s)
        if not contended or len(retried) >= session.budget.contention_retries or no_time:
            return dataclasses.replace(result, contended=contended, contention_retries=retried)
        retried.append(round(fraction, 4))
        log.info("quality run contended (%.0f%% of the CPUs used by others): training it again from a fresh build "
                 "in %g s", 100 * fraction, CONTENTION_PAUSE_S)
        time.sleep(CONTENTION_PAUSE_S)
        _rebuild(session)


def _rebuild(session: Session) -> None:
    """``session`` built afresh in place (the same object, so whoever holds it finalizes the new techniques): the
    old techniques release what they hold, then the model, optimizer, loop and batches are built again from the
    seed, with a new parity probe."""
    for tech in session.techs:
        tech.finalize(session.model, session.ctx)
    fresh = build(session.spec, session.budget, session.device)
    if session.probe is not None:
        fresh.probe = ParityProbe(fresh.model, session.probe.steps)
    fresh.clock = session.clock
    for f in dataclasses.fields(Session):
        setattr(session, f.name, getattr(fresh, f.name))
    del fresh
    frozen = gc.get_freeze_count() > 0  # the objects of the first build were frozen with the imports (``run``):
    gc.unfreeze()  # a frozen cycle is never collected, so thaw them for this collection and freeze what is left
    gc.collect()
    if frozen:
        gc.freeze()


def _eval_row(session: Session, step: int, clock: float, pending: list[torch.Tensor]) -> list[Any]:
    """One row of the eval curve (samples, steps, clock, mean training loss since the last row, metric); empties
    ``pending``, the losses since the last row. The workload's ``curve_metrics`` go to ``session.curve_extra``."""
    loss = float(_mean_over_ranks(torch.stack(pending).float().mean())) if pending else None
    pending.clear()
    metrics = _evaluate(session)
    for key in session.built.curve_metrics:
        session.curve_extra.setdefault(key, []).append(metrics.get(key))
    return [step * session.cfg.batch_size, step, clock, loss, metrics[session.built.metric]]


def _continuation_evals(plan: QualityPlan, max_steps: int) -> list[int]:
    """The steps past the budget to evaluate at: the budget's own evaluation steps repeated after it (the same
    sample cadence), up to ``max_steps``, which is one of them."""
    laps = math.ceil(max_steps / plan.steps)
    steps = {lap * plan.steps + e for lap in range(1, laps + 1) for e in plan.eval_steps}
    return sorted({s for s in steps if s < max_steps} | {max_steps})


def _train_on(session: Session, plan: QualityPlan, curve: list[list[Any]], clock: float, one_off: float,
              ended: str | None) -> ContinuationResult:
    """After the budget: train on, evaluating at the budget's cadence, until the training clock (one-off excluded,
    as the curve's) reaches ``spec.train_until_s``; appends to ``curve``. Not run when the budget's run was cut or
    stopped, or a technique says it cannot be continued (``Technique.continuation_blocker``); ended early by the
    safety caps (``MAX_CONTINUATION_FACTOR`` x the budget's samples, ``max_train_seconds``), a technique's stop,
    divergence or the workload's batches running out, each with its reason."""
    until, budget, batch = session.spec.train_until_s, session.budget, session.cfg.batch_size

    def result(reached: bool, why: str | None) -> ContinuationResult:
        beyond = max(curve[-1][1] - plan.steps, 0)
        return ContinuationResult(until_s=until, reached=reached, samples_beyond_budget=beyond * batch,
                                  steps_beyond_budget=beyond, train_time_s=max(clock - one_off, 0.0), why_not=why,
                                  max_samples_factor=MAX_CONTINUATION_FACTOR)

    if ended:
        return result(False, f"the run ended before its budget: {ended}")
    blockers = [why for t in session.techs if (why := t.continuation_blocker(session.ctx))]
    if blockers:
        return result(False, "; ".join(blockers))
    if _agree(clock - one_off >= until):
        return result(True, None)  # the budget alone reached the clock: this run was not the faster one
    max_steps = math.ceil(MAX_CONTINUATION_FACTOR * plan.budget_samples / batch)
    metric, pending, step, loss = session.built.metric, [], plan.steps, None
    _sync(session.device)
    seg_start = time.perf_counter()
    try:
        for target in _continuation_evals(plan, max_steps):
            while step < target:
                loss = session.loop.step(next(session.batches))
                pending.append(loss.detach())
                session.steps_done += 1
                step += 1
            _sync(session.device)
            clock += time.perf_counter() - seg_start
            _check_finite(loss, session.steps_done)
            curve.append(_eval_row(session, step, clock, pending))
            if _agree(clock - one_off >= until):
                return result(True, None)
            if _agree(clock > budget.max_train_seconds):
                return result(False, f"the training clock passed max_train_seconds={budget.max_train_seconds:g} "
                                     f"at step {step} (a safety cap)")
            asked = [t.name for t in session.techs if t.on_eval({metric: curve[-1][-1]}, session.ctx)]
            if _agree(bool(asked)):
                return result(False, f"{', '.join(asked) or 'another rank'} stopped the run at step {step}")
            _sync(session.device)
            seg_start = time.perf_counter()
    except StopIteration:
        return result(False, f"the workload's batches ran out at step {step}")
    except Diverged as exc:
        return result(False, f"diverged past the budget: {exc}")
    return result(False, f"the safety cap of {MAX_CONTINUATION_FACTOR}x the budget's samples ({step} steps)")


def _one_off(first_step_s: float | None, clock: float, steps: int) -> float:
    """The first step's excess over the mean of the others (0 with a single step)."""
    if first_step_s is None or steps < 2:
        return 0.0
    steady = (clock - first_step_s) / (steps - 1)
    return max(first_step_s - steady, 0.0)


def _quality_result(session: Session, plan: QualityPlan, curve: list[list[Any]], n_budget: int, one_off: float,
                    cut: str | None, stopped: str | None, busy: Any, tokens: int | None,
                    continuation: ContinuationResult | None = None) -> QualityResult:
    """The record's quality section: every field but ``curve`` and ``continuation`` from the budget's rows (the
    first ``n_budget``), so a continuation's record describes its budget as the trial it continues does."""
    built = session.built
    within = curve[:n_budget]
    steps = within[-1][1]
    target = built.target
    hit = next((p for p in within[1:] if target is not None and p[4] is not None and
                (p[4] >= target if built.higher_is_better else p[4] <= target)), None)
    return QualityResult(
        metric=built.metric, higher_is_better=built.higher_is_better, target=target, margin=built.margin,
        budget_samples=plan.budget_samples, budget_steps=plan.steps,
        samples_trained=steps * session.cfg.batch_size, steps_trained=steps,
        train_time_s=within[-1][2], cut=cut, stopped_by=stopped,
        curve_columns=["samples", "steps", "train_time_s", "train_loss", built.metric], curve=curve,
        final=None if cut else within[-1][4],
        samples_to_target=hit[0] if hit else None, steps_to_target=hit[1] if hit else None,
        time_to_target_s=hit[2] if hit else None,
        time_to_target_with_one_off_s=hit[2] + one_off + session.probe_s if hit else None,
        contention=Contention(**dataclasses.asdict(busy)),
        tokens_trained=tokens,
        continuation=continuation,
        curve_extra={k: list(v) for k, v in session.curve_extra.items()} or None,
    )


def _evaluate(session: Session) -> dict[str, float]:
    module = session.model
    for tech in session.techs:
        module = tech.eval_model(module, session.ctx)
    module.eval()
    try:
        with torch.no_grad(), session.loop.forward_context():
            return {k: float(v) for k, v in session.built.evaluate(module).items()}
    finally:
        module.train()


# ---- stage: speed window ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowPeaks:
    """Peaks over the timed window, kept for the memory stage."""

    rss_bytes: int
    cuda: dict[str, int] | None


def speed_window(session: Session, ref: ReferenceResult) -> tuple[SpeedResult, WindowPeaks, EnergyResult]:
    """Warm-up (covering the parity steps when this stage runs first), then the timed window."""
    budget, spec, device = session.budget, session.spec, session.device
    # A step's speed in steady state, past the quality run's plan, whether the quality run came first or not:
    # techniques that change the step over the plan (a sequence-length warm-up) are then at their final shapes,
    # so mode=speed and mode=both time the same step.
    session.ctx.step = max(session.ctx.step, session.ctx.total_steps)
    # The free heap that whatever ran before left resident (imports, the quality run, and in a forked trial the
    # fork server's own) goes back to the OS before the warm-up, so the window's peak RSS counts what training
    # touches and reads the same however the process started: without it, cnn:tiny's read higher forked than fresh
    # in every trial (reports/example-cpu-isolation: ab-fork-fresh-feb9042 without it, ab-fork-fresh with it).
    trim_heap()
    with session.clock.stage("warmup"):
        warmup_times = _warm_up(session)
    gc.collect()
    rss = PeakRss()
    rss.reset()
    cuda_peak_reset(device)

    planned = _planned_window_steps(budget, warmup_times) if spec.world_size > 1 else None  # before the clock
    # A window in which other processes used the cores measured them too: pause, measure it again (every rank
    # agrees, so all take the same steps), and keep the last; what was retried, and a window that stayed
    # contended, are recorded, and the analysis keeps contended windows out of speed verdicts.
    retried: list[float] = []
    while True:
        tokens_before, shapes_before = session.loop.tokens, collections.Counter(session.loop.shapes)
        window, energy_result, busy, loss, steps = _timed_window(session, planned)
        tokens, shapes = session.loop.tokens - tokens_before, session.loop.shapes - shapes_before
        session.steps_done += steps
        contended = _agree(busy.fraction > CONTENTION_WARN)
        if not contended or len(retried) >= budget.contention_retries:
            break
        retried.append(round(busy.fraction, 4))
        log.info("timed window contended (%.0f%% of the CPUs used by others): measuring it again in %g s",
                 100 * busy.fraction, CONTENTION_PAUSE_S)
        time.sleep(CONTENTION_PAUSE_S)
    peaks = WindowPeaks(rss.peak_bytes(), cuda_peak_bytes(device))
    _unavailable_in_window(session, window, energy_result)
    _check_finite(loss, session.steps_done)
    step_stats = StepStats(**summarize(window.step_times_s))
    if session.one_off_s is None and step_stats.median is not None:  # the first step was a warm-up step
        session.one_off_s = max(session.first_step_s - step_stats.median, 0.0)

    samples_per_s = window.n_steps * session.cfg.batch_size / window.total_s  # global batch: every rank's samples
    dtype = set_compute_dtype(session.techs)
    peak, by_device, peak_source = trial_peak(spec, dtype)
    ranks = spec.world_size
    with session.clock.stage("flops"):
        flops_per_step, shape_steps = window_flops(session, ref.flops_per_step, shapes)
    achieved = flops_per_step * window.n_steps / window.total_s if flops_per_step else None
    sheet = datasheet_peak(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None
    result = SpeedResult(
        warmup_steps=len(warmup_times),
        steps=window.n_steps,
        window_s=window.total_s,
        step_time_s=step_stats,
        samples_per_s=samples_per_s,
        samples_per_s_per_device=samples_per_s / spec.world_size,
        tokens_per_s=tokens * session.batch_shards / window.total_s if session.built.tokens_per_sample else None,
        data_wait_frac=window.data_wait_s / window.total_s if window.total_s else None,
        contention=Contention(**dataclasses.asdict(busy)),
        contended=contended,
        contention_retries=retried,
        flops_per_step=flops_per_step,
        achieved_flops=achieved,
        compute_dtype=dtype,
        peak_flops=peak,
        peak_source=peak_source,
        mfu=achieved / peak if achieved and peak else None,
        mfu_by_device={d: achieved / ranks / p for d, p in by_device.items()} if achieved and by_device else None,
        datasheet_peak_flops=sheet * ranks if sheet else None,
        mfu_datasheet=achieved / (sheet * ranks) if achieved and sheet else None,
        shapes=shape_steps,
    )
    return result, peaks, _energy_over_ranks(EnergyResult(**dataclasses.asdict(energy_result)), device)


def _unavailable_in_window(session: Session, window: WindowResult, energy: energy_mod.EnergyResult) -> None:
    """What the window kept (the last, after contention retries) could not measure: CUDA events that failed (its
    step times are then the host's) and an energy counter that was there but could not be read (joules None with
    a source)."""
    if window.events_failed:
        session.unavailable["step_times"] = (f"{window.events_failed}: per-step times are the host's clock between "
                                             "launches; the window's total is synchronised")
    if energy.joules is None and energy.source is not None:
        session.unavailable["energy"] = energy.reason or "the energy counter could not be read"


def trial_peak(spec: TrialSpec, dtype: str) -> tuple[float | None, dict[str, float] | None, str | None]:
    """The trial's peak FLOP/s for ``dtype``, each device's when it ran on several GPUs, and where they come from.

    One process: its device's calibrated peak (on the CPU, at its thread count). Several CUDA ranks: the sum of each
    device's own calibrated peak, over this node's devices (``cuda:LOCAL_RANK``), times the nodes, whose devices are
    assumed like this node's (node 0's runner calibrated only its own). Several CPU ranks, or an env.json from before
    per-device peaks: the one-rank peak times the ranks (on the CPU each rank is calibrated at its own thread count,
    torchrun's 1, so their sum is the machine's: 1x doubled the MFU of 2-rank CPU trials).
    """
    ranks = spec.world_size
    local = int(os.environ.get("LOCAL_WORLD_SIZE", ranks))
    by_device = {d: (spec.device_peaks.get(d) or {}).get(dtype) for d in (f"cuda:{i}" for i in range(local))}
    if ranks > 1 and spec.device_peaks and all(by_device.values()):
        nodes = ranks // local
        others = f"; {nodes - 1} other node(s) assumed like this one" if nodes > 1 else ""
        return sum(by_device.values()) * nodes, by_device, f"{spec.peak_source} (summed over {local} devices{others})"
    peak = spec.peaks.get(dtype)
    return (peak * ranks, None, spec.peak_source) if peak else (None, None, None)


def window_flops(session: Session, reference_flops: int | None, shapes: collections.Counter[tuple[int, ...]]
                 ) -> tuple[int | None, dict[str, int] | None]:
    """FLOPs per optimizer step over the window's steps, and the steps per input shape when they were not all the
    workload's full batch (a sequence-length curriculum). The reference counts the full batch; any other shape is
    counted once, on a fresh eager copy of the model with a batch cut to that shape, and weighted by its steps. A set
    whose step runs other FLOPs than the workload's model (``own_flops``: a leaner or pruned model, extra heads, a
    teacher's forward) is counted on its own loop instead, at every shape, as it stands after the window."""
    if not reference_flops or not shapes:
        return reference_flops, None
    spec = session.spec
    x_full, y_full = session.full_batch["batch"]
    shards = session.batch_shards  # each rank's FLOPs are the whole model's on its slice of the batch
    local = session.cfg.batch_size // shards
    full = (local, *x_full.shape[1:])
    own = any(t.own_flops for t in session.techs)
    if set(shapes) == {full} and not own:
        return reference_flops, None
    counted = {}
    with torch.random.fork_rng(devices=[]):  # building re-seeds: the trial's own stages keep their RNG state
        if own:  # the model trained is not the workload's (leaner, pruned, extra heads): count what it runs now
            def count(x: torch.Tensor, y: torch.Tensor) -> float:
                return session.loop.count_flops((x, y))
        else:
            cpu = torch.device("cpu")  # FLOPs do not depend on the device; nothing is allocated beside the trial's
            fresh = workloads.get(spec.workload).build(spec.size, spec.seed, cpu)
            loop = plain_loop(fresh, fresh.lr, cpu)

            def count(x: torch.Tensor, y: torch.Tensor) -> float:
                return count_flops(lambda: loop.step((x, y)))
        for shape in shapes:
            if shape == full and not own:
                counted[shape] = reference_flops / shards
                continue
            counted[shape] = count(_cut(x_full, shape), _cut(y_full, shape))
    total = sum(n * counted[shape] * shards for shape, n in shapes.items())
    per_shape = {"x".join(map(str, s)): n for s, n in sorted(shapes.items())} if set(shapes) != {full} else None
    return round(total / sum(shapes.values())), per_shape


def _cut(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t`` cut to ``shape`` in its leading dimensions (a label vector keeps only the batch dimension's cut)."""
    return t[tuple(slice(0, n) for n in shape[: t.dim()])]


def _timed_window(
    session: Session, planned: int | None,
) -> tuple[WindowResult, energy_mod.EnergyResult, ContentionResult, torch.Tensor, int]:
    """One timed window: its step times, energy, the CPU time others took, the last loss and the steps taken.

    Under torchrun the other ranks are this rank's siblings (the launcher's children): the trial, not contention.
    Python's cyclic garbage collector is off inside the window (as ``timeit`` does): a full collection over the
    heap of a torch process takes milliseconds, landing on some steps of some windows (a few slow steps, not
    contention) and on none of others; the reference counts that free most objects still run.
    """
    budget = session.budget
    # Several ranks: a barrier at both edges, so rank 0's window covers every rank's steps.
    timer = StepTimer(session.device, barrier=host_barrier if _world() > 1 else None)
    energy = EnergyMeter(session.device)
    contention = CpuContention(include_siblings=session.spec.world_size > 1)
    with _gc_paused():
        contention.start()
        energy.start()
        timer.start()
        window_start = time.perf_counter()
        steps = 0
        while True:
            t_fetch = time.perf_counter()
            batch = next(session.batches)
            timer.data_wait(time.perf_counter() - t_fetch)
            loss = session.loop.step(batch)
            timer.step_done()
            steps += 1
            elapsed = time.perf_counter() - window_start
            if planned is not None:
                if steps >= planned:
                    break
            elif (steps >= budget.min_steps and elapsed >= budget.min_seconds) or elapsed >= budget.max_seconds:
                break
        window = timer.stop()
        return window, energy.stop(), contention.stop(), loss, steps


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic collector off (after a collection), as it was before on the way out."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _warm_up(session: Session) -> list[float]:
    """Untimed steps before the window, each synced and timed alone (the first of the process is its one-off)."""
    warmup = max(session.budget.warmup_steps, 1)
    if session.probe is not None and session.probe.active:
        warmup = max(warmup, session.probe.steps - session.steps_done)
    times = []
    for _ in range(warmup):
        _sync(session.device)
        t0 = time.perf_counter()
        loss = session.loop.step(next(session.batches))
        _sync(session.device)
        times.append(time.perf_counter() - t0)
        session.steps_done += 1
        if session.first_step_s is None:
            session.first_step_s = times[-1]
        if session.probe is not None and session.probe.active:
            session.probe.after_step(loss)
    _check_finite(loss, session.steps_done)
    return times


# ---- stage: phases ----------------------------------------------------------------------------------------------

PHASE_STEPS = 10  # steps of the phase pass: enough for a median and an IQR, a fraction of the window's


def phase_pass(session: Session, steps: int = PHASE_STEPS) -> PhaseResult:
    """Where a step's time goes: ``steps`` more steps, each labelled region timed (synced at its edges on a GPU),
    after the timed window and apart from it (``bench.measure.phases``)."""
    clock = PhaseClock(session.device)
    session.loop.time_phases(clock)
    try:
        for _ in range(steps):
            with clock.step():
                with clock.region("data"):
                    batch = next(session.batches)
                loss = session.loop.step(batch)
            session.steps_done += 1
    finally:
        session.loop.time_phases(None)
    _check_finite(loss, session.steps_done)
    stats = summarize_phases(clock.steps)
    busy, why = _device_busy(session)
    if why:
        session.unavailable["device_busy"] = why
    device: dict[str, Any] = {} if busy is None else {
        "device_busy": busy.fraction, "device_busy_s": busy.busy_s, "device_ops_per_step": busy.ops_per_step,
        "device_op_s": busy.mean_op_s, "device_source": busy.source}
    names = tuple(t.name for t in session.techs)
    return PhaseResult(steps=stats.steps, step_s=stats.step_s, mean_s=stats.mean_s, median_s=stats.median_s,
                       iqr_s=stats.iqr_s, share=stats.share,
                       diagnosis=diagnose(stats.share, names, session.device.type, session.spec.peaks,
                                          busy=device.get("device_busy"), op_s=device.get("device_op_s")),
                       **device)


def _device_busy(session: Session) -> tuple[DeviceBusy | None, str | None]:
    """On a GPU, how busy the device is over a few more steps (``bench.measure.phases.device_busy_pass``: the host
    phase times cannot say), or why not; on CPU execution is synchronous and the phases say it all."""
    if not _busy_pass_wanted(session.device):
        return None, None

    def step() -> None:
        session.loop.step(next(session.batches))
        session.steps_done += 1

    return device_busy_pass(step, session.device)


def _busy_pass_wanted(device: torch.device) -> bool:
    """Whether the trial runs the device-busy pass (CUDA devices; a test makes a CPU trial run it)."""
    return device.type == "cuda"


# ---- stage: memory ----------------------------------------------------------------------------------------------


def memory(session: Session, peaks: WindowPeaks, own_process: bool) -> MemoryResult:
    """The window's peaks, a clean RSS pass, and the tensor breakdown of one tracked step."""
    budget, spec = session.budget, session.spec
    if not budget.memory:
        clean_rss: dict[str, Any] = {"skipped": "memory passes off (budget.memory = false)"}
    elif not own_process:
        clean_rss = {"skipped": "not in a trial process of its own: the malloc settings would outlive the trial"}
    else:
        clean_rss = _clean_rss_pass(session)
    cuda = peaks.cuda
    fields: dict[str, Any] = dict(
        peak_rss_bytes=peaks.rss_bytes,
        clean_rss=clean_rss,
        peak_bytes=cuda["allocated"] if cuda else None,
        peak_reserved_bytes=cuda["reserved"] if cuda else None,
        peak_source="torch.cuda.max_memory_allocated" if cuda else "tensor tracker (RSS beside it)",
    )
    hidden = [t.name for t in session.techs if t.hides_tensors]
    if spec.world_size > 1:
        fields.update(_per_rank_memory(session, peaks, clean_rss))
    elif budget.memory and hidden:
        fields["breakdown_skipped"] = f"the tensor tracker cannot see inside {', '.join(hidden)}"
    elif budget.memory:
        held = {name: ts for tech in session.techs for name, ts in tech.held_parts(session.ctx).items()}
        tracker = TensorMemoryTracker(session.model, session.optimizer, held)
        batch = next(session.batches)  # fetched outside: a batch built in a loader's worker would not be counted
        with tracker:
            session.loop.step(batch)
        breakdown = dataclasses.asdict(tracker.result())
        fields["breakdown"] = breakdown
        if fields["peak_bytes"] is None:
            fields["peak_bytes"] = breakdown["peak_bytes"]
    return MemoryResult(**fields)


def _clean_rss_pass(session: Session) -> dict[str, Any]:
    """RSS at rest and its peak over a few steps with glibc returning freed memory at once.

    Between steps, RSS under glibc's defaults still holds what earlier steps freed, so it cannot say what a rank
    keeps at rest. Here RSS follows live memory, so the at-rest value shows the model state (plus the runtime) and
    the peak a step's transient on top. (Peaks move less: glibc reuses what it kept; measured on the 2-rank sweep,
    the timed window's peaks were 0-4% above these.) Every rank runs it (collectives inside).
    """
    why = return_freed_memory_to_os()
    if why is not None:
        return {"skipped": why}
    loop, batches, device = session.loop, session.batches, session.device
    loop.step(next(batches))  # one step to move the step's blocks into their own mappings
    _sync(device)
    trim_heap()
    rss = PeakRss()
    at_rest = rss.rss_bytes()
    rss.reset()
    for _ in range(CLEAN_RSS_STEPS):
        loop.step(next(batches))
    _sync(device)
    peak = rss.peak_bytes()
    rss.close()
    return {"at_rest_bytes": at_rest, "peak_bytes": peak, "steps": CLEAN_RSS_STEPS, "method": rss.method,
            "malloc": "glibc mallopt M_MMAP_THRESHOLD=64KiB, M_TRIM_THRESHOLD=0"}


def _per_rank_memory(session: Session, peaks: WindowPeaks, clean_rss: dict[str, Any]) -> dict[str, Any]:
    """Per-rank peaks and local model-state bytes, gathered to every rank, beside the ZeRO formula."""
    world = session.spec.world_size
    mine = {"peak_rss_bytes": peaks.rss_bytes, "clean_rss": clean_rss,
            "cuda_peak_bytes": peaks.cuda["allocated"] if peaks.cuda else None,
            "model_state": model_state_bytes(session.model, session.optimizer)}
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    stage = set_zero_stage(session.techs)
    n_params = sum(p.numel() for p in session.model.parameters()) if stage in (0, 1) else None
    if n_params is None:  # sharded parameters: count the global size from the local shards of every rank
        n_params = sum(r["model_state"]["params"] for r in ranks) // 4
    result: dict[str, Any] = {
        "per_rank": ranks,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
        "model_state_bytes": max(sum(v for k, v in r["model_state"].items() if k != "optimizer_scalars")
                                 for r in ranks),
        "breakdown_skipped": "multi-process trial: per-rank model-state bytes from local shards are reported instead",
    }
    clean = [r["clean_rss"].get("peak_bytes") for r in ranks]
    if all(c is not None for c in clean):
        result["clean_rss_peak_bytes"] = max(clean)
    if peaks.cuda:
        result["peak_bytes"] = max(r["cuda_peak_bytes"] for r in ranks)
    if stage is not None:
        result["zero_stage"] = stage
        result["zero_formula_bytes"] = zero_formula_bytes(stage, n_params, world)
        result["zero_note"] = next((t.memory_note for t in session.techs if t.memory_note), None)
    return result


# ---- the trial --------------------------------------------------------------------------------------------------


def run(spec: TrialSpec, own_process: bool = False, clock: StageClock | None = None) -> TrialRecord:
    """Run the trial's stages; any error becomes a record with a status and reason (stages that finished stay).

    ``own_process``: this process exists for this trial alone (``main``), so the clean RSS pass may change
    process-wide malloc settings for good; called in-process (tests), that pass is skipped with a reason.
    ``clock``: the process's stage clock, already holding its start and imports (``main``); the record's ``stages``
    are its times, the launcher adds its own and the remainder.
    """
    clock = clock or StageClock()
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    label = TechniqueSet(tuple(TechniqueSpec.parse(t) for t in spec.techniques)).label
    head: dict[str, Any] = dict(sweep_id=spec.sweep_id, trial_id=spec.trial_id,
                                workload={"name": spec.workload, "size": spec.size}, techniques=[],
                                technique_label=label, seed=spec.seed, repeat=spec.repeat,
                                world_size=spec.world_size, device=spec.device, mode=spec.mode,
                                position=spec.position, timestamp_utc=started)
    sections: dict[str, Any] = {}
    status, reason = "ok", None
    try:
        _stages(spec, head, sections, own_process, clock)
    except Diverged as exc:
        status, reason = "diverged", str(exc)
    except torch.OutOfMemoryError as exc:
        status, reason = "oom", f"out of memory: {str(exc).splitlines()[0]}"
    except Exception as exc:  # a trial fails softly: the sweep goes on and the record says why
        status = "oom" if isinstance(exc, MemoryError) or memory_exhausted(str(exc)) else "failed"
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        log.error("trial %s failed:\n%s", spec.trial_id, traceback.format_exc())
        sections["error"] = traceback.format_exc(limit=8)[-4000:]
    sections["stages"] = _stage_times(clock, sections)
    return TrialRecord(status=status, reason=reason, **head, **sanitize(sections))


def _stage_times(clock: StageClock, sections: dict[str, Any]) -> dict[str, float]:
    """The clock's stages with the measured steps cut out by the trial's own numbers (``split_measured``)."""
    quality, speed, build = sections.get("quality"), sections.get("speed"), sections.get("build")
    continued = quality.continuation if quality is not None else None
    return split_measured(
        clock.seconds, train_s=quality.train_time_s if quality is not None else None,
        continued_s=continued.train_time_s - quality.train_time_s if continued is not None else None,
        one_off_s=build.one_off_s if build is not None else None,
        one_off_in="quality" if quality is not None else "warmup",
        window_s=speed.window_s if speed is not None else None,
        probe_s=build.probe_s if build is not None else None)


def _stages(spec: TrialSpec, head: dict[str, Any], out: dict[str, Any], own_process: bool,
            clock: StageClock) -> None:
    with clock.stage("setup"):
        budget = Budget(**spec.budget)
        device = _rank_device(spec.device)
        if spec.threads:
            torch.set_num_threads(spec.threads)
        # what workloads build once per sweep (decoded datasets, a starting policy), beside the references
        workloads.use_artefact_dir(spec.reference_dir)
    with clock.stage("data"):
        workloads.get(spec.workload).load_data(spec.size)
    with clock.stage("build"):
        session = build(spec, budget, device)
    if own_process:
        # What is alive now (torch's and TorchDynamo's modules, the model) lives to the end: out of the cyclic
        # collector's view, each later gc.collect() (before the window, in the memory passes) scans only what the
        # trial made since instead of the whole heap of imports (a full collection's cost grows with it). Nothing
        # measured changes: the collector is off inside the timed window either way.
        gc.freeze()
    if CACHE_EVENTS:  # the dataset came from the sweep's cache or was decoded here (and cached for the next)
        out["caches"] = {"dataset": "read" if set(CACHE_EVENTS.values()) == {"read"} else "decoded"}
    session.clock = clock
    out["unavailable"] = session.unavailable  # filled as the GPU-only passes fail, kept if the trial fails later
    try:
        _measure(spec, head, out, own_process, budget, session)
    finally:  # also after a failure: techniques release what they hold (a loader's worker processes)
        with clock.stage("finalize"):
            for tech in session.techs:
                try:
                    tech.finalize(session.model, session.ctx)
                except Exception:  # a failed trial's own error is the one to report
                    log.exception("finalize of %s failed", tech.name)


def _describe(head: dict[str, Any], session: Session) -> None:
    """The record's head: the techniques, the kind and what the workload is. A function of its own, so that no local
    of ``_measure`` holds the first build after a contended quality run builds afresh (it did: the first model stayed
    resident through the window and the memory passes, 200 MiB more for a model holding 200 MiB)."""
    built = session.built
    head["techniques"] = [t.describe() | (plugins.technique_origin(t.name) or {}) for t in session.techs]
    head["kind"] = session.kind.value
    if built.source:
        head["workload"]["source"] = built.source
    head["workload"].update(dataset=built.dataset, params=built.params, metric=built.metric,
                            higher_is_better=built.higher_is_better, batch_size=session.cfg.batch_size,
                            tokens_per_sample=built.tokens_per_sample, target=built.target,
                            n_params=session.n_params)


def _measure(spec: TrialSpec, head: dict[str, Any], out: dict[str, Any], own_process: bool, budget: Budget,
             session: Session) -> None:
    _describe(head, session)
    out["build"] = build_info(session)
    clock = session.clock
    with clock.stage("reference"):
        ref = reference(session)
    if session.kind != Kind.ALGORITHMIC and budget.parity_steps > 0:
        session.probe = ParityProbe(session.model, budget.parity_steps)
    if spec.mode in ("quality", "both"):
        with clock.stage("quality"):  # split into training, one-off and evaluation by ``_stage_times``
            out["quality"] = uncontended_quality_run(session)
        out["build"] = build_info(session)
    if spec.mode in ("speed", "both"):
        with clock.stage("speed"):  # warm-up and FLOP counting nested; the rest is the window and its retries
            out["speed"], peaks, out["energy"] = speed_window(session, ref)
        with clock.stage("phases"):
            out["phases"] = phase_pass(session)
        out["build"] = build_info(session)
    with clock.stage("parity"):
        out["parity"] = parity(session, ref)
    if spec.mode in ("speed", "both"):
        with clock.stage("memory"):
            out["memory"] = memory(session, peaks, own_process)
    with clock.stage("finalize"):
        out["technique_results"] = {t.name: found for t in session.techs if (found := t.results(session.ctx))}


# ---- multi-process trials (torchrun) ------------------------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank_device(name: str) -> torch.device:
    """``cuda:LOCAL_RANK`` for a rank of a CUDA trial (the plan refused more ranks than devices; a batch job's node
    may still have fewer than the node that planned it), else the trial's device."""
    if name.startswith("cuda") and "LOCAL_RANK" in os.environ:
        local, visible = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
        if local >= visible:
            raise RuntimeError(f"local rank {local} has no CUDA device of its own: torch sees {visible} on this node")
        return torch.device("cuda", local)
    return torch.device(name)


def _init_distributed(spec: TrialSpec) -> None:
    device = _rank_device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # NCCL carries CUDA tensors only; the harness's own small collectives (agreeing to stop, the window's planned
    # steps, parity distances) use CPU tensors, so gloo serves those beside it.
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != spec.world_size:
        raise RuntimeError(f"torchrun started {dist.get_world_size()} processes, the trial expects {spec.world_size}")


def _agree(flag: bool) -> bool:
    """True on every rank when it is true on any (ranks must take the same number of steps, or they hang)."""
    if _world() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _energy_over_ranks(mine: EnergyResult, device: torch.device) -> EnergyResult:
    """The trial's energy from every rank's reading (``combine_energy``)."""
    if _world() == 1:
        return mine
    ranks: list[Any] = [None] * _world()
    dist.all_gather_object(ranks, (dataclasses.asdict(mine), os.environ.get("LOCAL_RANK", "0") == "0"))
    return combine_energy(ranks, device.type == "cuda")


def combine_energy(ranks: list[tuple[dict[str, Any], bool]], cuda: bool) -> EnergyResult:
    """Rank readings (EnergyResult fields, is the host's local rank 0) -> the trial's energy. On CUDA each rank read
    its own GPU, so all are summed; on CPU the ranks of one host read the same RAPL package counters, so each host
    counts once (its local rank 0's reading). One reading missing: no total, with that rank's reason."""
    counted = [e for e, first_on_host in ranks if cuda or first_on_host] or [ranks[0][0]]  # never empty under torchrun
    missing = next((e for e in counted if e["joules"] is None), None)
    if missing is not None:
        return EnergyResult(joules=None, source=None, reason=missing["reason"])
    sources = ", ".join(dict.fromkeys(str(e["source"]) for e in counted))
    how = (f"sum over {len(counted)} GPUs" if cuda else
           f"read once for the {len(ranks)} ranks of one host" if len(counted) == 1 else
           f"sum over {len(counted)} hosts")
    return EnergyResult(joules=sum(e["joules"] for e in counted), source=f"{sources} ({how})", reason=None)


def _mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if _world() == 1:
        return values
    gathered = [None] * _world()
    dist.all_gather_object(gathered, values.detach().cpu())
    return torch.stack(gathered).mean(dim=0)


def _planned_window_steps(budget: Budget, warmup_times: list[float]) -> int:
    """Rank 0 fixes the window's step count from its warm-up steps (after the first), and every rank uses it:
    deciding per rank from its own clock could leave one rank waiting in a collective for ever."""
    steady = warmup_times[1:] or warmup_times
    per_step = max(sorted(steady)[len(steady) // 2], 1e-6)
    wanted = max(budget.min_steps, math.ceil(budget.min_seconds / per_step))
    cap = max(1, math.floor(budget.max_seconds / per_step))
    planned = torch.tensor([min(wanted, max(cap, 1))])
    dist.broadcast(planned, src=0)
    return int(planned.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_finite(loss: torch.Tensor, step: int) -> None:
    if not bool(torch.isfinite(loss)):
        raise Diverged(f"loss is {float(loss)} at step {step}")


def _write_rank_error(record_path: str, rank: int, status: str, reason: str | None) -> None:
    """Beside the record: why this rank failed, and when (the runner reports the rank that failed first in time,
    since a peer's "connection closed" follows the real error)."""
    write_atomic(f"{record_path}.rank{rank}.err", json.dumps(
        {"rank": rank, "status": status, "reason": reason, "time": time.time()}))


def end_rank(code: int) -> None:
    """End this torchrun rank with ``code``; does not return.

    Only after a success do the ranks meet in a barrier (rank 0's record is on disk, no collective is in flight) and
    destroy the process group. After a failure a peer may wait in another collective, and destroy_process_group
    waits for this rank's unfinished gloo work (measured: until the peer exits), so the failing rank would hang
    instead of exiting for torchrun to end the others.

    Then the process leaves without interpreter finalization: under zero1, zero2 and zero3 the gloo process group
    outlives destroy_process_group (ZeroRedundancyOptimizer and FSDP2's DeviceMesh/DTensor caches keep it), so its
    worker and socket threads still run at exit (strace: no thread exits before exit_group), and C++ teardown beside
    live threads ends a rank in SIGABRT ("terminate called without an active exception"). atexit handlers still run.
    """
    if sys.exc_info()[1] is not None:  # an exception on its way out: show it as the interpreter would have
        traceback.print_exc()
    if code == 0:
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer died after its record: rank 0's record, if written, still stands
            log.exception("rank %s: tearing down the process group failed", os.environ.get("RANK", "0"))
            code = 1
    atexit._run_exitfuncs()  # logging's flush, inductor's worker pools and cache writes
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


LAUNCHED_AT = "TRAINBENCH_LAUNCHED_AT"  # the launcher's time.time() just before it started this process


def _process_clock(started: tuple[float, float] | None) -> StageClock:
    """The stage clock of a trial process started at ``started`` (``FIRST_LINE``): its imports so far, and the gap
    since the launcher started it when the launcher said when (``LAUNCHED_AT``)."""
    clock = StageClock(start=started[1] if started else None)
    if started is None:
        return clock
    clock.mark("imports")
    try:
        launched = float(os.environ[LAUNCHED_AT])
    except (KeyError, ValueError):  # started by hand, or by another launcher
        return clock
    clock.add("start", max(started[0] - launched, 0.0))
    return clock


def main(argv: list[str] | None = None, started: tuple[float, float] | None = None) -> int:
    """``started``: (time.time(), time.perf_counter()) at the process's first line, when this is its entry point."""
    clock = _process_clock(started)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m bench.trial SPEC.json RECORD.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("TRAINBENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    spec = TrialSpec.from_json(Path(argv[0]).read_text())
    if spec.reference_dir is None:  # every rank must look in the same place: beside the record
        spec.reference_dir = str(Path(argv[1]).resolve().parent / "references")
    if spec.world_size == 1:
        user_models.load_plugins(spec.plugins)  # users' models and techniques, as the sweep registered them
        clock.mark("setup")
        record = run(spec, own_process=True, clock=clock)
        write_atomic(argv[1], record.to_json() + "\n")  # the runner reads a whole record or none
        return 0
    # Under torchrun: rank 0 writes the record. A rank whose trial failed writes its error beside it and exits
    # non-zero, so torchrun ends the other ranks (which may be waiting in a collective) instead of hanging.
    rank = int(os.environ.get("RANK", "0"))
    code = 1  # every way out of the try but its last line is a failure
    try:
        user_models.load_plugins(spec.plugins)
        _init_distributed(spec)
        if os.environ.get("TRAINBENCH_FAULT_RANK") == str(rank):  # test hook: prove a failing rank ends the trial
            if os.environ.get("TRAINBENCH_FAULT") == "hang":  # ... or a hanging one, through the runner's timeout
                while True:
                    time.sleep(60)
            raise RuntimeError(f"injected fault on rank {rank} (TRAINBENCH_FAULT_RANK)")
        clock.mark("setup")
        record = run(spec, own_process=True, clock=clock)
        if record.status != "ok":
            _write_rank_error(argv[1], rank, record.status, record.reason)
        else:
            if rank == 0:
                write_atomic(argv[1], record.to_json() + "\n")
            code = 0
    except Exception as exc:  # init (or writing the record) failed: there is no record
        _write_rank_error(argv[1], rank, "failed", f"{type(exc).__name__}: {exc}"[:500])
    finally:
        end_rank(code)
    return code  # not reached: _end_rank exits


def leave(code: int) -> None:
    """End this trial process once its record is on disk, without the interpreter's finalization (tearing down
    torch's modules and heap, which the launcher otherwise waits for: the ``teardown`` stage). atexit handlers still
    run: logging's flush, multiprocessing's daemonic children, inductor's worker pools and cache writes."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(started=FIRST_LINE))
