"""Sweep expansion: workloads x technique sets x repeats -> an ordered list of trials.

Impossible combinations stay in the plan as trials with a ``skip_reason`` so the sweep records them (and the
report says why) instead of silently dropping them. Repeats are interleaved across configurations (repeat 0 of
everything, then repeat 1, ...) so slow drift of the machine hits all configurations alike, and within a repeat the
order of the configurations is shuffled with ``random.Random(f"{seed}:{repeat}")`` (the sweep's recorded seed), so
no set always runs first or right after another; each record keeps its ``position`` in the run order.

``order = "priority"`` (``--order priority``, gpu_check.sh's) runs the sets in the order given instead: the baseline
beside the first set (which of the two runs first alternating by repeat), then each further set through all its
repeats, so a sweep cut short (a time-capped GPU slot) has its first comparisons complete rather than every
comparison a pair short.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
from dataclasses import dataclass

import torch

from bench import workloads
from bench.measure import cuda_caps
from bench.plan.config import Budget, ConfigError, SweepConfig, TechniqueSet, WorkloadSpec
from techniques.base import Context, Technique, TrainConfig, batch_shards

log = logging.getLogger(__name__)

OPTIONAL_PACKAGES = ("deepspeed", "transformers", "torchao", "pynvml")


@dataclass(frozen=True)
class Trial:
    """One workload x one technique set x one seed, run in its own process."""

    trial_id: str
    workload: WorkloadSpec
    techniques: TechniqueSet
    seed: int
    repeat: int
    world_size: int = 1
    skip_reason: str | None = None
    position: int = 0  # index in the run order
    mode: str | None = None  # what this trial measures, when not the sweep's mode (speed-only sequential pairs)
    added_by: str | None = None  # None: planned; "sequential": a speed-only pair added while a verdict was open
    train_until_s: float | None = None  # quality: train on past the budget to this clock (bench.run.continuation)
    continues: str | None = None  # the trial id whose quality run this one continues (bench.run.continuation)


def resolve_device(name: str) -> torch.device:
    # Asked of NVML or a child process (bench.measure.cuda_caps): the runner launches trials and must not hold a
    # CUDA context of its own on the devices they train on.
    if name == "auto":
        return torch.device("cuda" if cuda_caps.available() else "cpu")
    if name == "cuda" and not cuda_caps.available():
        from bench.plan.config import ConfigError

        raise ConfigError(f"--device cuda was asked for, but torch sees no CUDA device ({cuda_caps.get().reason}; "
                          "use --device cpu or auto)")
    return torch.device(name)


def check_nproc(device: torch.device, nproc: int) -> None:
    """Refuse ``--nproc`` beyond the CUDA devices this node's processes can see: rank ``LOCAL_RANK`` takes
    ``cuda:LOCAL_RANK``, so a fifth rank on a 4-GPU node would fail inside every multi-process trial (or two ranks
    share a device, which NCCL refuses). On the CPU gloo runs any number of ranks. Raises ConfigError before anything
    is written or launched; the count comes from ``bench.measure.cuda_caps``, which creates no CUDA context here."""
    if device.type != "cuda" or nproc <= 1:
        return
    visible = cuda_caps.device_count()
    if nproc > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        raise ConfigError(f"--nproc {nproc} needs {nproc} CUDA devices on each node, but torch sees {visible}{where}: "
                          f"use --nproc {visible} or fewer, or --device cpu to run the ranks with gloo")


def available_packages() -> frozenset[str]:
    return frozenset(p for p in OPTIONAL_PACKAGES if importlib.util.find_spec(p) is not None)


def trial_id(workload: WorkloadSpec, techs: TechniqueSet, seed: int, repeat: int, world_size: int = 1) -> str:
    world = f"/np{world_size}" if world_size > 1 else ""
    return f"{workload.label}/{techs.label}{world}/seed{seed}/r{repeat}"


def incompatibility(techs: TechniqueSet, workload: WorkloadSpec, device: torch.device, world_size: int) -> str | None:
    """Why this technique set cannot run on this workload here, or None."""
    wl = workloads.get(workload.name)
    reason = wl.check()
    if reason:
        return reason
    instances = [spec.resolve() for spec in techs.specs]
    slots: dict[str, str] = {}
    for tech in instances:
        if tech.slot is not None:
            if tech.slot in slots:
                return f"{slots[tech.slot]} and {tech.name} both own the '{tech.slot}' slot; use one of them"
            slots[tech.slot] = tech.name
        clash = tech.conflicts & set(techs.names)
        if clash:
            return f"{tech.name} cannot be combined with {', '.join(sorted(clash))}"
    ctx = Context(  # the model's parts as the workload declares them (a user's: as its check found them)
        device=device,
        workload=workload.name,
        world_size=world_size,
        has_batchnorm=wl.batchnorm(workload.size),
        has_preferences=wl.has_preferences,
        structure=wl.structure(workload.size),
        forward_targets=wl.forward_targets(workload.size),
        available_packages=available_packages(),
        technique_names=techs.names,
    )
    for tech in instances:
        reason = tech.check(ctx)
        if reason:
            return f"{tech.name}: {reason}"
    builders = [t.name for t in instances if type(t).build_optimizer is not Technique.build_optimizer]
    if len(builders) > 1:
        return f"{' and '.join(builders)} each build the optimizer; a set can use one of them"
    own = [t.name for t in instances if t.own_flops]
    pipeline = [t.name for t in instances if type(t).forward_backward is not Technique.forward_backward]
    if own and pipeline:  # the step's FLOPs are counted on the loop's model, which is one stage under a pipeline
        return (f"{', '.join(own)} changes the model's FLOPs, which cannot be counted through {pipeline[0]}'s "
                "schedule; combine them separately")
    return _batch_split_problem(instances, wl.size_params(workload.size), world_size)


def _batch_split_problem(instances: list[Technique], params: dict, world_size: int) -> str | None:
    """Why the workload's batch cannot be split across ranks and micro-batches in equal parts, or None.

    Found here, the set is skipped with its reason once, not failed inside every trial (the loop refuses an
    uneven split too: fewer micro-batches than planned would scale the gradient wrongly, silently).
    """
    if "batch_size" not in params:
        return None
    cfg = TrainConfig(batch_size=int(params["batch_size"]), lr=float(params.get("lr", 1e-3)))
    for tech in sorted(instances, key=lambda t: t.phase):
        try:
            cfg = tech.configure(cfg)
        except ValueError as exc:
            return str(exc)
    shards = batch_shards(instances, world_size)
    if cfg.batch_size % shards:
        return f"the batch of {cfg.batch_size} samples does not split evenly over {shards} processes"
    local = cfg.batch_size // shards
    if local % cfg.micro_batches:
        where = f"the per-process batch of {local} samples" if shards > 1 else f"the batch of {local} samples"
        return f"{where} does not split into {cfg.micro_batches} equal micro-batches"
    return None


def applicability(source: str, device: torch.device, nproc: int = 2, blocks: str | None = None
                  ) -> tuple[WorkloadSpec, dict[str, str | None]]:
    """``bench list --model SOURCE``: the user's model at its default size, checked as a sweep checks it (built and
    stepped once in a child process), and for every registered technique alone why it cannot run on that model here
    (None: it can). Multi-process techniques are asked with ``nproc`` ranks."""
    import techniques
    from bench.plan import user_models as user

    plugin = user.parse_model(source, blocks)
    wl = user.register_model(plugin, device.type)
    spec = WorkloadSpec.parse(wl.name)
    out = {}
    for name in sorted(techniques.registry()):
        techs = TechniqueSet.parse(name)
        out[name] = incompatibility(techs, spec, device, world_size_for(techs, nproc))
    return spec, out


def world_size_for(techs: TechniqueSet, world_size: int) -> int:
    """Sets with a multi-process technique (data-parallel, sharding, model-parallel) run on every process; the
    others (the baseline included) run in one process, so they are the single-process reference the distributed
    sets are compared with."""
    distributed = any(spec.resolve().multi_process for spec in techs.specs)
    return world_size if distributed else 1


def plan(cfg: SweepConfig, device: torch.device) -> list[Trial]:
    """The sweep's trials in run order (this shard's, with ``cfg.shard``). A baseline set is added when the config
    has none (speedups need it)."""
    trials = full_plan(cfg, device)
    return shard(trials, cfg.workloads, *cfg.shard) if cfg.shard else trials


def shard(trials: list[Trial], workloads_in_order: tuple[WorkloadSpec, ...], index: int, count: int) -> list[Trial]:
    """Shard ``index`` of ``count``: the trials of every ``count``-th workload, starting at ``index``.

    The unit is a whole workload, not every n-th trial: reports keep machines apart, so a set whose baseline or
    other repeats ran on another machine would have nothing to be compared with. A workload's trials keep their
    place (``position``) in the whole plan's run order.
    """
    mine = {w for i, w in enumerate(workloads_in_order) if i % count == index}
    return [t for t in trials if t.workload in mine]


def full_plan(cfg: SweepConfig, device: torch.device) -> list[Trial]:
    """Every trial of the sweep, whatever the shard, in run order."""
    if TechniqueSet(()) not in cfg.techniques:
        log.info("adding the baseline technique set: speedups are measured against it")
    sets = technique_sets(cfg)
    worlds = {t: world_size_for(t, cfg.world_size) for t in sets}
    reasons = {(w, t): incompatibility(t, w, device, worlds[t]) for w in cfg.workloads for t in sets}
    trials = []
    for repeat, workload, techs in run_order(cfg):
        seed = cfg.seed + repeat
        trials.append(Trial(
            trial_id=trial_id(workload, techs, seed, repeat, worlds[techs]),
            workload=workload,
            techniques=techs,
            seed=seed,
            repeat=repeat,
            world_size=worlds[techs],
            skip_reason=reasons[(workload, techs)],
            position=len(trials),
        ))
    return trials


def technique_sets(cfg: SweepConfig) -> list[TechniqueSet]:
    """The sweep's sets, the baseline first when the config names none (speedups need it)."""
    sets = list(cfg.techniques)
    if TechniqueSet(()) not in sets:
        sets.insert(0, TechniqueSet(()))
    return sets


def priority_groups(cfg: SweepConfig) -> list[list[TechniqueSet]]:
    """The sets as ``order = "priority"`` runs them: the baseline with the first other set, then one set a group."""
    others = [t for t in technique_sets(cfg) if t != TechniqueSet(())]
    return [[TechniqueSet(()), *others[:1]], *([t] for t in others[1:])]


def run_order(cfg: SweepConfig) -> list[tuple[int, WorkloadSpec, TechniqueSet]]:
    """(repeat, workload, set) of every trial in run order (``cfg.order``; the module's docstring says why each)."""
    if cfg.order == "priority":
        order = []
        for group in priority_groups(cfg):
            for repeat in range(cfg.repeats):
                sides = group if repeat % 2 == 0 else group[::-1]  # ABBA: drift hits both sides of a pair alike
                order += [(repeat, w, t) for w in cfg.workloads for t in sides]
        return order
    sets = technique_sets(cfg)
    order = []
    for repeat in range(cfg.repeats):
        configs = [(w, t) for w in cfg.workloads for t in sets]
        random.Random(f"{cfg.seed}:{repeat}").shuffle(configs)
        order += [(repeat, w, t) for w, t in configs]
    return order


@dataclass(frozen=True)
class ReferenceKey:
    """The parity reference a trial is checked against (computed by ``bench.reference``, cached per sweep). What a reference depends on: the workload size, the seed (initial weights, batch order), the global batch
    and the number of steps."""

    workload: str
    size: str
    seed: int
    batch_size: int
    steps: int

    @property
    def name(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{self.workload}-{self.size}")
        return f"{safe}-seed{self.seed}-b{self.batch_size}-k{self.steps}"


def reference_key(trial: Trial, budget: Budget) -> ReferenceKey | None:
    """The parity reference a trial will ask for (its global batch after the techniques' ``configure``), or None
    when the workload's size does not state its batch (the trial then computes its reference itself)."""
    params = workloads.get(trial.workload.name).size_params(trial.workload.size)
    if "batch_size" not in params:
        return None
    cfg = TrainConfig(batch_size=int(params["batch_size"]), lr=float(params.get("lr", 1e-3)))
    for spec in trial.techniques.specs:
        try:
            cfg = spec.resolve().configure(cfg)
        except ValueError:  # the trial will fail and say why; no reference is needed
            return None
    return ReferenceKey(trial.workload.name, trial.workload.size, trial.seed, cfg.batch_size, budget.parity_steps)
