"""Inside the child process: build one trial, apply its techniques, train, measure, and write one record.

``python -m bench.trial SPEC.json RECORD.json``. The runner starts one such process per trial so memory peaks are
clean and a crash takes down one trial, not the sweep. Order of work (each section says why it sits where it does):

1. reference run (eager fp32, same seed and batches): the first losses for parity and the FLOPs of one step;
   done first and freed, so it does not pollute the trial's memory peaks;
2. build the trial's model with its techniques applied in phase order, and its optimizer;
3. warm-up steps (the first one timed on its own: compile time lands there), then peak trackers are reset;
4. the timed window: a device sync only at its edges, data-wait timed apart, other processes' CPU time measured;
5. the accuracy phase: training goes on to the step budget, evaluated at a few points (eval time excluded);
6. memory: the timed window's peak RSS (glibc's default malloc, which keeps freed blocks), then a clean RSS pass
   with malloc set to return freed memory at once (it slows steps, and stays set, so it comes last), then one
   more step under the tensor tracker (which slows steps too).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench import workloads
from bench.config import Budget, TechniqueSet, TechniqueSpec
from bench.loop import TrainLoop, build_optimizer
from bench.measure.energy import EnergyMeter
from bench.measure.flops import count_flops, mfu
from bench.measure.memory import (
    PeakRss,
    TensorMemoryTracker,
    cuda_peak_bytes,
    cuda_peak_reset,
    return_freed_memory_to_os,
    trim_heap,
)
from bench.measure.timing import CpuContention, StepTimer, summarize
from bench.results import TrialRecord, sanitize
from techniques._distributed import model_state_bytes, zero_formula_bytes
from techniques.base import Context, Kind, Technique, TrainConfig

log = logging.getLogger(__name__)

PARITY_TOLERANCE = {Kind.EXACT: 1e-3, Kind.NUMERIC: 5e-2}  # max relative difference of the first losses
CONTENTION_WARN = 0.10  # other processes used more than 10% of the cores during the timed window


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
    peaks: dict[str, float] = field(default_factory=dict)  # measured matmul peak FLOP/s by dtype name
    world_size: int = 1
    threads: int = 0

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        return cls(**json.loads(text))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


def set_kind(techs: list[Technique]) -> Kind:
    kinds = {t.kind for t in techs}
    if Kind.ALGORITHMIC in kinds:
        return Kind.ALGORITHMIC
    if Kind.NUMERIC in kinds:
        return Kind.NUMERIC
    return Kind.EXACT


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _evaluate(built: workloads.BuiltWorkload, model: torch.nn.Module, loop: TrainLoop) -> dict[str, float]:
    # A compiled module is evaluated through its eager original (same parameters): switching it to eval mode
    # would trigger a second compilation that says nothing about training speed.
    eager = getattr(model, "_orig_mod", model)
    eager.eval()
    try:
        with torch.no_grad(), loop.forward_context():
            return {k: float(v) for k, v in built.evaluate(eager).items()}
    finally:
        eager.train()


def reference_run(spec: TrialSpec, device: torch.device, steps: int, batch_size: int) -> tuple[list[float], int]:
    """Eager fp32 baseline with the trial's seed and batches: its first losses and the FLOPs of one step."""
    wl = workloads.get(spec.workload)
    built = wl.build(spec.size, spec.seed, device)
    ctx = Context(device=device, workload=spec.workload, seed=spec.seed)
    opt = build_optimizer(built.model, [], ctx, built.lr)
    loop = TrainLoop(built.model, opt, built.loss_fn, [], ctx)
    batches = built.batches(batch_size, spec.seed)
    losses = [float(loop.step(next(batches))) for _ in range(steps)]
    batch = next(batches)
    flops = count_flops(lambda: loop.step(batch))
    return losses, flops


def run(spec: TrialSpec, own_process: bool = False) -> TrialRecord:
    """Run the trial; any error becomes a record with a status and reason instead of an exception.

    ``own_process``: this process exists for this trial alone (``main``), so the clean RSS pass may change
    process-wide malloc settings for good; called in-process (tests), that pass is skipped with a reason.
    """
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    base: dict[str, Any] = dict(
        sweep_id=spec.sweep_id,
        trial_id=spec.trial_id,
        workload={"name": spec.workload, "size": spec.size},
        techniques=[],
        technique_label=TechniqueSet(tuple(TechniqueSpec.parse(t) for t in spec.techniques)).label,
        seed=spec.seed,
        repeat=spec.repeat,
        world_size=spec.world_size,
        device=spec.device,
        timestamp_utc=started,
    )
    sections: dict[str, Any] = {}
    try:
        _measure(spec, base, sections, own_process)
        status, reason = "ok", None
    except Diverged as exc:
        status, reason = "diverged", str(exc)
    except torch.OutOfMemoryError as exc:
        status, reason = "oom", f"out of memory: {str(exc).splitlines()[0]}"
    except Exception as exc:  # a trial fails softly: the sweep goes on and the record says why
        if "out of memory" in str(exc).lower():
            status = "oom"
        else:
            status = "failed"
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        log.error("trial %s failed:\n%s", spec.trial_id, traceback.format_exc())
        sections["error"] = traceback.format_exc(limit=8)[-4000:]
    error = sections.pop("error", None)
    if error:
        sections.setdefault("timing", {})["traceback"] = error
    return TrialRecord(status=status, reason=reason, **base, **sanitize(sections))


def _measure(spec: TrialSpec, base: dict[str, Any], out: dict[str, Any], own_process: bool) -> None:
    budget = Budget(**spec.budget)
    device = _rank_device(spec.device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    wl = workloads.get(spec.workload)
    techs = [TechniqueSpec.parse(t).resolve() for t in spec.techniques]
    techs.sort(key=lambda t: t.phase)  # stable: same-phase techniques keep the user's order
    base["techniques"] = [t.describe() for t in techs]
    kind = set_kind(techs)

    # 1. reference run: parity losses and FLOPs per step, then freed.
    built = wl.build(spec.size, spec.seed, device)
    cfg = TrainConfig(batch_size=built.batch_size, lr=built.lr)
    for tech in techs:
        cfg = tech.configure(cfg)
    parity_steps = budget.parity_steps if techs and kind != Kind.ALGORITHMIC else 0
    ref_losses, flops_per_step = reference_run(spec, device, parity_steps, cfg.batch_size)
    gc.collect()

    base["workload"].update(dataset=built.dataset, params=built.params, metric=built.metric,
                            higher_is_better=built.higher_is_better, batch_size=cfg.batch_size,
                            tokens_per_sample=built.tokens_per_sample,
                            n_params=sum(p.numel() for p in built.model.parameters()))

    # 2. the trial's model, techniques applied in phase order.
    ctx = Context(device=device, workload=spec.workload, seed=spec.seed, rank=_rank(), world_size=spec.world_size,
                  has_blocks=wl.has_blocks, has_batchnorm=wl.has_batchnorm,
                  technique_names=tuple(t.name for t in techs))
    ctx.state.update(lr=cfg.lr, local_batch_size=cfg.batch_size // spec.world_size // cfg.micro_batches)
    model = built.model
    for tech in techs:
        model = tech.transform_model(model, ctx)
    optimizer = build_optimizer(model, techs, ctx, cfg.lr, cfg.weight_decay)
    batches = built.batches(cfg.batch_size, spec.seed)
    for tech in techs:
        batches = tech.wrap_data(batches, ctx)
    loop = TrainLoop(model, optimizer, built.loss_fn, techs, ctx, cfg.micro_batches)

    curve: list[list[float | int | None]] = []
    losses: list[torch.Tensor] = []
    train_time = 0.0  # training wall time, evaluation excluded

    def evaluate(step: int) -> float:
        metrics = _evaluate(built, model, loop)
        last = float(losses[-1]) if losses else None
        curve.append([round(train_time, 6), step, last, metrics[built.metric]])
        return metrics[built.metric]

    evaluate(0)

    # 3. warm-up: the first step alone includes compilation and lazy initialisation.
    first_step_s = None
    warmup_times: list[float] = []
    for i in range(max(budget.warmup_steps, 1)):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(loop.step(next(batches)))
        _sync(device)
        elapsed = time.perf_counter() - t0
        train_time += elapsed
        warmup_times.append(elapsed)
        if i == 0:
            first_step_s = elapsed
    _check_finite(losses)
    gc.collect()
    rss = PeakRss()
    rss.reset()
    cuda_peak_reset(device)

    # 4. the timed window.
    # Under torchrun the other ranks are this rank's siblings (the launcher's children): the trial, not contention.
    timer, energy = StepTimer(device), EnergyMeter(device)
    contention = CpuContention(include_siblings=spec.world_size > 1)
    contention.start()
    energy.start()
    timer.start()
    window_start = time.perf_counter()
    steps = 0
    planned = _planned_window_steps(budget, warmup_times) if spec.world_size > 1 else None
    while True:
        t_fetch = time.perf_counter()
        batch = next(batches)
        timer.data_wait(time.perf_counter() - t_fetch)
        losses.append(loop.step(batch))
        timer.step_done()
        steps += 1
        elapsed = time.perf_counter() - window_start
        if planned is not None:
            if steps >= planned:
                break
        elif (steps >= budget.min_steps and elapsed >= budget.min_seconds) or elapsed >= budget.max_seconds:
            break
    window = timer.stop()
    energy_result = energy.stop()
    busy = contention.stop()
    train_time += window.total_s
    peak_rss = rss.peak_bytes()
    cuda_peaks = cuda_peak_bytes(device)
    _check_finite(losses)

    step_stats = summarize(window.step_times_s)
    samples_per_s = window.n_steps * cfg.batch_size / window.total_s  # global batch: every rank's samples
    out["timing"] = {
        "steps": window.n_steps,
        "window_s": window.total_s,
        "step_time_s": step_stats,
        "samples_per_s": samples_per_s,
        "tokens_per_s": samples_per_s * built.tokens_per_sample if built.tokens_per_sample else None,
        "first_step_s": first_step_s,
        "warmup_steps": max(budget.warmup_steps, 1),
        "data_wait_frac": window.data_wait_s / window.total_s if window.total_s else None,
        "contention": dataclasses.asdict(busy),
        "contended": busy.fraction > CONTENTION_WARN,
        "micro_batches": cfg.micro_batches,
        "samples_per_s_per_device": samples_per_s / spec.world_size,
        "threads": torch.get_num_threads(),
    }
    peak_flops = spec.peaks.get(str(ctx.compute_dtype).removeprefix("torch."))
    achieved = flops_per_step / step_stats["median"] if flops_per_step and step_stats["median"] else None
    out["compute"] = {
        "flops_per_step": flops_per_step,
        "flops_source": "FlopCounterMode on the eager fp32 reference step (model FLOPs)",
        "achieved_flops": achieved,
        "compute_dtype": str(ctx.compute_dtype).removeprefix("torch."),
        "peak_flops": peak_flops,
        # Ranks on one CPU host share its cores (the calibrated peak is the host's); on GPUs each rank has one.
        "mfu": mfu(flops_per_step, step_stats["median"],
                   peak_flops * (spec.world_size if device.type == "cuda" else 1) if peak_flops else None),
    }
    out["energy"] = dataclasses.asdict(energy_result)

    # 5. accuracy phase: train on to the budget, evaluating at evenly spaced steps.
    evaluate(len(losses))
    total_steps = max(budget.train_steps, len(losses))
    eval_at = _eval_steps(len(losses), total_steps, budget.eval_points)
    cut = None
    while len(losses) < total_steps:
        if _agree(train_time >= budget.max_train_seconds):
            cut = f"stopped at step {len(losses)} of {total_steps}: max_train_seconds={budget.max_train_seconds} reached"
            break
        _sync(device)
        t0 = time.perf_counter()
        losses.append(loop.step(next(batches)))
        _sync(device)
        train_time += time.perf_counter() - t0
        if len(losses) in eval_at:
            _check_finite(losses)
            evaluate(len(losses))
            stop = _agree(any(tech.on_eval({built.metric: curve[-1][3]}, ctx) for tech in techs))
            if stop:
                cut = f"stopped at step {len(losses)} by a technique's on_eval"
                break
    _check_finite(losses)
    if curve[-1][1] != len(losses):
        evaluate(len(losses))
    target = built.target
    reached = [p for p in curve if target is not None and p[3] is not None and
               (p[3] >= target if built.higher_is_better else p[3] <= target)]
    out["accuracy"] = {
        "metric": built.metric,
        "higher_is_better": built.higher_is_better,
        "final": curve[-1][3],
        "steps_trained": len(losses),
        "train_time_s": train_time,
        "budget_cut": cut,
        "target": target,
        "time_to_target_s": reached[0][0] if reached else None,
        "steps_to_target": reached[0][1] if reached else None,
        "curve": curve,
        "curve_columns": ["train_time_s", "step", "train_loss", built.metric],
    }

    # Parity: the first losses against the eager fp32 reference.
    if parity_steps:
        mine = [float(x) for x in _mean_over_ranks(torch.stack(losses[:parity_steps]))]
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mine, ref_losses, strict=True))
        tol = PARITY_TOLERANCE[kind]
        note = None
        if cfg.micro_batches > 1 and wl.has_batchnorm:
            note = "expected mismatch: BatchNorm computes statistics per micro-batch, so accumulation is not exact"
        out["parity"] = {"kind": kind.value, "steps": parity_steps, "max_rel_loss_diff": diff, "tolerance": tol,
                         "ok": diff <= tol, "losses": mine, "reference_losses": ref_losses, "note": note}
    else:
        out["parity"] = {"kind": kind.value, "reference": not techs}

    # 6. memory: RSS/CUDA peaks from the timed window, a clean RSS pass, tensor breakdown from one tracked step.
    if not budget.memory:
        clean_rss = {"skipped": "memory passes off (budget.memory = false)"}
    elif not own_process:
        clean_rss = {"skipped": "not in a trial process of its own: the malloc settings would outlive the trial"}
    else:
        clean_rss = _clean_rss_pass(loop, batches, device)
    out["memory"] = {
        "peak_rss_bytes": peak_rss,
        "clean_rss": clean_rss,
        "peak_bytes": cuda_peaks["allocated"] if cuda_peaks else None,
        "peak_reserved_bytes": cuda_peaks["reserved"] if cuda_peaks else None,
        "peak_source": "torch.cuda.max_memory_allocated" if cuda_peaks else "tensor tracker (RSS beside it)",
        "breakdown": None,
    }
    if spec.world_size > 1:
        out["memory"].update(_per_rank_memory(model, optimizer, techs, peak_rss, clean_rss, cuda_peaks,
                                              spec.world_size))
    elif budget.memory and ctx.state.get("compiled"):
        out["memory"]["breakdown_skipped"] = "the tensor tracker cannot see inside torch.compile graphs"
    elif budget.memory:
        tracker = TensorMemoryTracker(model, optimizer)
        with tracker:
            loop.step(next(batches))
        result = tracker.result()
        breakdown = dataclasses.asdict(result)
        out["memory"]["breakdown"] = breakdown
        if out["memory"]["peak_bytes"] is None:
            out["memory"]["peak_bytes"] = breakdown["peak_bytes"]
    for tech in techs:
        tech.finalize(model, ctx)


CLEAN_RSS_STEPS = 2


def _clean_rss_pass(loop: TrainLoop, batches: Any, device: torch.device) -> dict[str, Any]:
    """RSS at rest and its peak over a few steps with glibc returning freed memory at once.

    Between steps, RSS under glibc's defaults still holds what earlier steps freed, so it cannot say what a rank
    keeps at rest. Here RSS follows live memory, so the at-rest value shows the model state (plus the runtime) and
    the peak a step's transient on top. (Peaks move less: glibc reuses what it kept; measured on the 2-rank sweep,
    the timed window's peaks were 0-4% above these.) Every rank runs it (collectives inside).
    """
    why = return_freed_memory_to_os()
    if why is not None:
        return {"skipped": why}
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


# ---- multi-process trials (torchrun) ------------------------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rank_device(name: str) -> torch.device:
    if name.startswith("cuda") and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(name)


def _init_distributed(spec: TrialSpec) -> None:
    device = _rank_device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != spec.world_size:
        raise RuntimeError(f"torchrun started {dist.get_world_size()} processes, the trial expects {spec.world_size}")


def _agree(flag: bool) -> bool:
    """True on every rank when it is true on any (ranks must take the same number of steps, or they hang)."""
    if _rank_world() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _rank_world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _mean_over_ranks(values: torch.Tensor) -> torch.Tensor:
    if _rank_world() == 1:
        return values
    gathered = [None] * _rank_world()
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


ZERO_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


def _per_rank_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer, techs: list[Technique],
                     peak_rss: int, clean_rss: dict[str, Any], cuda_peaks: dict | None,
                     world: int) -> dict[str, Any]:
    """Per-rank peaks and local model-state bytes, gathered to every rank, beside the ZeRO formula."""
    mine = {"peak_rss_bytes": peak_rss, "clean_rss": clean_rss,
            "cuda_peak_bytes": cuda_peaks["allocated"] if cuda_peaks else None,
            "model_state": model_state_bytes(model, optimizer)}
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, mine)
    stage = next((ZERO_STAGE[t.name] for t in techs if t.name in ZERO_STAGE), None)
    deepspeed = next((t for t in techs if t.name == "deepspeed"), None)
    if deepspeed is not None:
        stage = int(deepspeed.options.stage)
    n_params = sum(p.numel() for p in model.parameters()) if stage in (0, 1) else None
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
    if cuda_peaks:
        result["peak_bytes"] = max(r["cuda_peak_bytes"] for r in ranks)
    if stage is not None:
        result["zero_stage"] = stage
        result["zero_formula_bytes"] = zero_formula_bytes(stage, n_params, world)
        if stage == 2 and deepspeed is None:
            result["zero_note"] = ("FSDP2 keeps parameters sharded between steps, so at rest zero2 holds ZeRO-3's "
                                   "16/N bytes per parameter; the full parameters exist only during the step")
    return result


def _eval_steps(start: int, total: int, points: int) -> set[int]:
    if total <= start or points <= 0:
        return set()
    return {start + math.ceil((total - start) * (i + 1) / points) for i in range(points)}


def _check_finite(losses: list[torch.Tensor]) -> None:
    last = losses[-1]
    if not bool(torch.isfinite(last)):
        raise Diverged(f"loss is {float(last)} at step {len(losses)}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m bench.trial SPEC.json RECORD.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("TRAINBENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    spec = TrialSpec.from_json(Path(argv[0]).read_text())
    if spec.world_size == 1:
        record = run(spec, own_process=True)
        Path(argv[1]).write_text(record.to_json() + "\n")
        return 0
    # Under torchrun: rank 0 writes the record. A rank whose trial failed writes its error beside it and exits
    # non-zero, so torchrun ends the other ranks (which may be waiting in a collective) instead of hanging.
    rank = int(os.environ.get("RANK", "0"))
    try:
        _init_distributed(spec)
        if os.environ.get("TRAINBENCH_FAULT_RANK") == str(rank):  # test hook: prove a failing rank ends the trial
            if os.environ.get("TRAINBENCH_FAULT") == "hang":  # ... or a hanging one, through the runner's timeout
                while True:
                    time.sleep(60)
            raise RuntimeError(f"injected fault on rank {rank} (TRAINBENCH_FAULT_RANK)")
        record = run(spec, own_process=True)
    except Exception as exc:  # init failed: there is no record yet
        Path(f"{argv[1]}.rank{rank}.err").write_text(json.dumps(
            {"rank": rank, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500]}))
        return 1
    if record.status != "ok":
        Path(f"{argv[1]}.rank{rank}.err").write_text(json.dumps(
            {"rank": rank, "status": record.status, "reason": record.reason}))
        return 1
    if rank == 0:
        Path(argv[1]).write_text(record.to_json() + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
