"""Pipeline parallelism: the GPT's blocks split into consecutive stages, one per rank, run by torch's pipeline engine.

Method card
- What: rank ``s`` of ``p`` keeps only stage ``s`` of the model: an even share of the blocks (the first stages take
  one more when ``n_layer`` does not divide), the token and position embeddings on stage 0, the final LayerNorm and
  the head on the last stage. Every rank sees the same global batch; the schedule cuts it into ``microbatches``
  equal micro-batches (``m``), stage 0 feeds their inputs, activations travel forward and their gradients backward
  between neighbouring stages point to point, and the last stage computes the loss of each micro-batch against the
  targets. ``torch.distributed.pipelining`` does all of it (``PipelineStage`` with static shapes,
  ``ScheduleGPipe``: all forwards then all backwards, or ``Schedule1F1B``: after a warm-up one forward, one
  backward, so at most ``p`` micro-batches' activations are alive on a stage instead of ``m``). Gradients are the
  mean over micro-batches, so the math is one process's at the same global batch (parity checks it).
- Tied head: the GPT's head shares ``wte.weight``. With the two ends on different ranks the tensor cannot be
  shared, so this does what Megatron-LM does for tied embeddings: the last stage keeps its own copy (the same
  initial values), and after each step's backward the two gradients are all-reduced (summed) between the first and
  the last stage, so both copies take the same optimizer step and stay equal. That all-reduce, and broadcasting
  the step's loss from the last stage (every rank returns the same loss), are the only collectives of our own.
- Memory: the surgery is done in place on the workload's model: a rank's unowned blocks, embeddings or head are
  dropped, so ``session.built.model`` does not keep them alive; per-rank parameters, gradients and AdamW state are
  one stage's (plus the tied copy on the last stage), and activations of in-flight micro-batches come on top.
- Bubble: each stage idles while the pipeline fills and drains, ``(p - 1) / (m + p - 1)`` of the step for equal
  stages (GPipe paper, sec. 2.2; the same for 1F1B, which saves memory, not time). ``results`` reports, per stage,
  the measured idle fraction (1 - time in the stage's forward, backward and loss / the schedule's wall time per
  step; median over the steps after the first) beside that formula, and ``communication``: the bytes this rank
  sends per step (activations forward and their gradients backward, summed from the shapes it actually sent, plus
  the tied gradient's all-reduce) and the parameter bytes each rank holds.
- Evaluation runs the stages' forward under ``no_grad`` on the whole evaluation batch, activations sent point to
  point, and the last stage broadcasts the logits so every rank's ``evaluate`` sees the full model's output.
- When it helps: models too large for one device's memory, across devices joined by a slower link than tensor
  parallelism needs (only activations at stage edges travel). More micro-batches shrink the bubble but each
  micro-batch gets smaller (less efficient kernels). On one CPU host with gloo the ranks split the same cores and
  every boundary is a socket copy: expect it to be slower than one process there.
- Caveats: the GPT workload's structure only (``wte``, ``wpe``, ``drop``, ``blocks``, ``ln_f``, ``head``); other
  models are refused. ``n_layer`` must be at least the number of ranks (found when the model is built: the plan
  does not know a workload's size), the batch must split into ``microbatches``, and 1F1B needs ``microbatches >=
  ranks``. Not combined with techniques that change the per-micro-batch forward or backward (autocast
  ``bf16``/``fp16``, loss or backward owners, ``grad_accum``: pp has its own micro-batches) nor with ``compile``
  (it would compile the whole model before the split), data-parallel sharding (a 2-D mesh is not implemented),
  ``tp``, ``local_sgd``, ``fedavg``. Dropout > 0 would draw other random numbers than one process (the GPT's
  default is 0). Parity's parameter distance counts each stage's parameters once over the ranks (they are marked
  ``held_by_one_rank``; the tied copy is counted on stage 0).
- Measured (2 gloo ranks, 2-core AMD EPYC, gpt:tiny, m = 4, 3 seeds; docs/parallelism.md): gpipe 0.53x
  [0.42, 0.67] slower and 1f1b 0.55x (no verdict: one window contended, 2 pairs left) of one process's samples/s,
  exact (parity ok), 948 KiB of model state per rank; the measured bubble 0.40-0.49 (stage 0) and 0.31-0.42
  (stage 1) against the formula's 0.20: micro-batches of 4 sequences take well under a millisecond, so the sends
  and the schedule's Python count as idle time.
- Sources: Huang et al., "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
  arXiv:1811.06965 (2019); Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP
  2019, and the flushed 1F1B schedule (PipeDream-Flush) in Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473 (2021), sec. 2.2; torch.distributed.pipelining docs
  (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from techniques import _reading as rd
from techniques._distributed import CommCounter, local_bytes, needs_world
from techniques.base import Bottleneck, Context, Kind, Phase, Technique, TrainConfig, register
from techniques.base import get as get_technique

SUPPORTED_WORKLOADS = frozenset({"gpt"})  # models with the GPT's structure (bench/workloads/gpt_chars.py)
GPT_PARTS = ("wte", "wpe", "drop", "blocks", "ln_f", "head")
_LOOP_HOOKS = ("micro_batch_context", "forward_context", "loss", "backward")  # what forward_backward replaces


def bubble_formula(stages: int, microbatches: int) -> float:
    """The idle fraction of each stage in a flushed pipeline of equal stages: ``(p - 1) / (m + p - 1)``
    (GPipe, sec. 2.2; 1F1B keeps it and bounds the activations in flight instead)."""
    return (stages - 1) / (microbatches + stages - 1)


def stage_layers(n_layer: int, stages: int) -> list[range]:
    """The blocks of each stage: consecutive, as even as possible, the first stages one more when it does not
    divide (the last stage also runs the head)."""
    base, extra = divmod(n_layer, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def structure_problem(model: nn.Module) -> str | None:
    """Why ``model`` is not split here (not the GPT's structure), or None."""
    missing = [name for name in GPT_PARTS if not isinstance(getattr(model, name, None), nn.Module)]
    if missing:
        return (f"pp splits a GPT (bench/workloads/gpt_chars.py: {', '.join(GPT_PARTS)}); "
                f"{type(model).__name__} has no {', '.join(missing)}")
    if not isinstance(model.blocks, nn.ModuleList):
        return f"pp needs the GPT's blocks as an nn.ModuleList, got {type(model.blocks).__name__}"
    return None


def pipeline_problem(model: nn.Module, stages: int) -> str | None:
    """Why ``model`` cannot be split into ``stages`` pipeline stages, or None."""
    reason = structure_problem(model)
    if reason:
        return reason
    n_layer = len(model.blocks)
    if n_layer < stages:
        return f"the model has {n_layer} blocks, fewer than the {stages} pipeline stages: run with --nproc {n_layer}"
    return None


def batch_problem(batch_size: int, microbatches: int) -> str | None:
    """Why a batch of ``batch_size`` samples does not split into ``microbatches`` equal ones, or None."""
    if batch_size % microbatches:
        return (f"the batch of {batch_size} samples does not split into {microbatches} equal micro-batches "
                "(pp:microbatches=N with N dividing the batch)")
    return None


class Stage(nn.Module):
    """One pipeline stage of a GPT: its share of the blocks, with the embeddings on the first stage and the final
    LayerNorm and head on the last. The submodules are the GPT's own (the same objects, nothing copied)."""

    def __init__(self, gpt: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.d_model, self.vocab_size = gpt.wte.embedding_dim, gpt.wte.num_embeddings
        if first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # token ids (B, T) -> embeddings, as GPT.forward
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def split_in_place(gpt: nn.Module, rank: int, stages: int) -> tuple[Stage, bool]:
    """Cut ``gpt`` down to stage ``rank`` of ``stages``, in place: the parts this rank does not own are dropped from
    the GPT itself, so nothing keeps them alive. Returns the stage and whether the head was tied to ``wte``."""
    layers = stage_layers(len(gpt.blocks), stages)[rank]
    first, last = rank == 0, rank == stages - 1
    tied = gpt.head.weight is gpt.wte.weight
    if last and not first and tied:  # Megatron's tied embedding: the last stage trains a copy, gradients summed
        gpt.head.weight = nn.Parameter(gpt.wte.weight.detach())  # the same storage until wte is dropped below
    stage = Stage(gpt, layers, first, last)
    gpt.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
    if not first:
        gpt.wte = gpt.wpe = gpt.drop = None
    if not last:
        gpt.ln_f = gpt.head = None
    gc.collect()
    copy = stage.head.weight if last and not first and tied else None
    for p in stage.parameters():
        if p is not copy:  # the tied copy is stage 0's wte again: counted there once
            p.held_by_one_rank = True  # parity's parameter distance sums it over the ranks (bench/reference.py)
    return stage, tied


class PipelineForward(nn.Module):
    """What evaluation runs on every rank: the full model's logits, from the stages' forward on the whole batch
    (activations sent point to point, the logits broadcast from the last stage)."""

    def __init__(self, stage: Stage, rank: int, stages: int) -> None:
        super().__init__()
        self.stage, self.rank, self.stages = stage, rank, stages

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        shape = tuple(idx.shape)
        if self.stage.first:
            h = self.stage(idx)
        else:
            h = torch.empty((*shape, self.stage.d_model), device=idx.device)
            dist.recv(h, src=self.rank - 1)
            h = self.stage(h)
        h = h.float().contiguous()
        if self.stage.last:
            logits = h
        else:
            dist.send(h, dst=self.rank + 1)
            logits = torch.empty((*shape, self.stage.vocab_size), device=idx.device)
        dist.broadcast(logits, src=self.stages - 1)
        return logits


@dataclass
class _Step:
    """What one rank saw in one training step."""

    wall_s: float = 0.0
    compute_s: float = 0.0
    sent_bytes: int = 0  # activations forward + their gradients backward
    trace: list[tuple[str, int]] | None = None  # ("F" | "B", micro-batch) in the order this stage ran them


@register
class PP(Technique):
    name = "pp"
    summary = "pipeline parallelism: GPT blocks split into stages (torch.distributed.pipelining, GPipe or 1F1B)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    slot = "pipeline"
    multi_process = True
    splits_batch = False  # every rank trains the whole global batch
    conflicts = frozenset({"ddp", "zero1", "zero2", "zero3", "deepspeed", "offload", "grad_accum", "compile", "tp",
                           "local_sgd", "fedavg"})

    @dataclass(frozen=True)
    class Options:
        schedule: Literal["gpipe", "1f1b"] = "1f1b"
        microbatches: int = 4

        def __post_init__(self) -> None:
            if self.schedule not in ("gpipe", "1f1b"):
                raise ValueError(f"schedule must be gpipe or 1f1b, got {self.schedule!r}")
            if self.microbatches < 1:
                raise ValueError(f"microbatches must be >= 1, got {self.microbatches}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.stage: Stage | None = None
        self.tied = False
        self._tied_group: Any = None
        self._schedules: dict[tuple[Any, ...], Any] = {}
        self._step: _Step = _Step()
        self.steps: list[_Step] = []
        self.rank, self.world = 0, 1
        self.comm = CommCounter()

    # ---- planning ----------------------------------------------------------------------------------------------

    def check(self, ctx: Context) -> str | None:
        reason = needs_world(ctx, self.name)
        if reason:
            return reason
        if ctx.workload and ctx.workload not in SUPPORTED_WORKLOADS:
            return (f"pp splits the GPT workload's model ({', '.join(GPT_PARTS)}); workload '{ctx.workload}' has "
                    "another structure")
        m, p = self.options.microbatches, ctx.world_size
        if self.options.schedule == "1f1b" and m < p:
            return f"1f1b needs at least as many micro-batches as stages: microbatches={m} < {p} ranks"
        for name in ctx.technique_names:
            if name == self.name:
                continue
            try:
                cls = get_technique(name)
            except ValueError:
                continue
            hooks = [h for h in _LOOP_HOOKS if getattr(cls, h) is not getattr(Technique, h)]
            if hooks:
                return (f"pp runs every forward and backward in its pipeline schedule; {name} changes them "
                        f"({', '.join(hooks)}), which the schedule would skip")
        return None

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        reason = batch_problem(cfg.batch_size, self.options.microbatches)
        if reason:
            raise ValueError(f"pp: {reason}")
        return cfg

    # ---- building ----------------------------------------------------------------------------------------------

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        self.rank, self.world, self._ctx = ctx.rank, ctx.world_size, ctx
        reason = pipeline_problem(model, self.world)
        if reason:
            raise ValueError(f"pp: {reason}")
        self.stage, self.tied = split_in_place(model, self.rank, self.world)
        if self.tied and self.world > 2:  # every rank takes part in creating a group, members or not
            self._tied_group = dist.new_group([0, self.world - 1])
        return self.stage

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return PipelineForward(self._own_stage(model), self.rank, self.world)

    def _own_stage(self, model: nn.Module) -> Stage:
        if not isinstance(model, Stage):
            raise TypeError(f"pp expects its own Stage module, got {type(model).__name__} (a technique after pp "
                            "wrapped it)")
        return model

    # ---- the step ----------------------------------------------------------------------------------------------

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], ctx: Context) -> torch.Tensor:
        stage = self._own_stage(model)
        m = self.options.microbatches
        reason = batch_problem(x.shape[0], m)
        if reason:
            raise ValueError(f"pp: {reason}")
        schedule = self._schedule_for(stage, x, loss_fn, ctx.device)
        self.comm.samples(x.shape[0], ctx)
        self._step = step = _Step(trace=[])
        losses: list[torch.Tensor] = []
        started = time.perf_counter()
        if stage.first:
            schedule.step(x, return_outputs=False)
        elif stage.last:
            schedule.step(target=y, losses=losses, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
        step.wall_s = time.perf_counter() - started
        self.steps.append(step)
        if self.tied and (stage.first or stage.last):
            weight = stage.wte.weight if stage.first else stage.head.weight
            self.comm.add(weight.grad, ctx)
            dist.all_reduce(weight.grad, group=self._tied_group)
        loss = torch.stack(losses).mean().detach() if stage.last else torch.zeros((), device=ctx.device)
        self.comm.add(loss, ctx)
        dist.broadcast(loss, src=self.world - 1)
        return loss

    def _schedule_for(self, stage: Stage, x: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                      device: torch.device) -> Any:
        """The stage and schedule for this input shape (built once per shape, with static shapes: no metadata
        pass that would run an extra forward)."""
        key = (tuple(x.shape), x.dtype)
        if key in self._schedules:
            return self._schedules[key]
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        m = self.options.microbatches
        b, t = x.shape[0] // m, x.shape[1]
        dtype = next(stage.parameters()).dtype
        meta = torch.device("meta")
        act = torch.empty((b, t, stage.d_model), dtype=dtype, device=meta, requires_grad=True)
        inputs = torch.empty((b, t), dtype=x.dtype, device=meta) if stage.first else act
        outputs = (torch.empty((b, t, stage.vocab_size), dtype=dtype, device=meta, requires_grad=True)
                   if stage.last else act)
        pipe = PipelineStage(stage, self.rank, self.world, device, input_args=inputs, output_args=outputs)
        self._time(pipe)
        kind = ScheduleGPipe if self.options.schedule == "gpipe" else Schedule1F1B
        schedule = kind(pipe, n_microbatches=m, loss_fn=self._timed(loss_fn), scale_grads=True)
        self._schedules[key] = schedule
        return schedule

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._step.compute_s += time.perf_counter() - started

        return run

    def _time(self, pipe: Any) -> None:
        """Time the stage's compute and count what it sends: its forward and backward of each micro-batch (the
        schedule waits for receives outside them), instance attributes over the engine's methods."""
        forward, backward = pipe.forward_one_chunk, pipe.backward_one_chunk
        timed_forward, timed_backward = self._timed(forward), self._timed(backward)

        def forward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            out = timed_forward(chunk, *args, **kwargs)
            self._step.trace.append(("F", chunk))
            if not pipe.is_last:
                self._step.sent_bytes += _nbytes(out)
                self.comm.add(_tensors(out), self._ctx)
            return out

        def backward_one_chunk(chunk: int, *args: Any, **kwargs: Any) -> Any:
            out = timed_backward(chunk, *args, **kwargs)
            self._step.trace.append(("B", chunk))
            if not pipe.is_first:
                self._step.sent_bytes += _nbytes(pipe.bwd_cache.get(chunk, ()))
                self.comm.add(_tensors(pipe.bwd_cache.get(chunk, ())), self._ctx)
            return out

        pipe.forward_one_chunk, pipe.backward_one_chunk = forward_one_chunk, backward_one_chunk

    # ---- what it found -----------------------------------------------------------------------------------------

    @property
    def last_trace(self) -> list[tuple[str, int]]:
        """The forward ("F") and backward ("B") of each micro-batch, in the order this stage ran them last step."""
        return list(self.steps[-1].trace or []) if self.steps else []

    def measured_bubble(self) -> float | None:
        """This stage's idle fraction of the schedule's wall time per step: the median over the steps after the
        first (which sets up the process group's connections)."""
        steps = self.steps[1:] or self.steps
        fractions = [1 - s.compute_s / s.wall_s for s in steps if s.wall_s > 0]
        return statistics.median(fractions) if fractions else None

    def communication(self) -> dict[str, Any]:
        """Bytes this rank sends per step and the parameter bytes it holds."""
        stage = self.stage
        tied = 0
        if self.tied and stage is not None and (stage.first or stage.last):
            w = stage.wte.weight if stage.first else stage.head.weight
            tied = w.numel() * w.element_size()
        params = local_bytes(stage.parameters()) if stage is not None else 0
        sent = self.steps[-1].sent_bytes if self.steps else None
        return {"sent_bytes_per_step": sent, "tied_grad_allreduce_bytes": tied, "param_bytes": params}

    def results(self, ctx: Context) -> dict[str, Any] | None:
        """Per stage: measured bubble, bytes sent, parameter bytes (gathered from every rank: every rank calls
        this at the same point, as the trial does)."""
        if self.stage is None:
            return None
        mine = {"stage": self.rank, "layers": len(self.stage.blocks), "bubble": self.measured_bubble(),
                **self.communication()}
        ranks: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized() and self.world > 1:
            ranks = [None] * self.world
            dist.all_gather_object(ranks, mine)
        p, m = self.world, self.options.microbatches
        measured = [r["bubble"] for r in ranks]
        return {
            "schedule": self.options.schedule,
            "stages": p,
            "microbatches": m,
            "layers_per_stage": [r["layers"] for r in ranks],
            "tied_head": ("copy on the last stage, gradient all-reduced with stage 0's wte" if self.tied
                          else "untied"),
            "bubble": {
                "formula": bubble_formula(p, m),
                "formula_text": "(p - 1) / (m + p - 1)",
                "measured_per_stage": measured,
                "measured_mean": statistics.fmean(measured) if all(v is not None for v in measured) else None,
                "steps": max(len(self.steps) - 1, 0),
                "how": "1 - (stage forward + backward + loss time) / schedule wall time, median over steps",
            },
            "communication": self.comm.results(),  # this rank's sends, the tied all-reduce, the loss broadcast
            "per_stage": {
                "sent_bytes_per_step_per_stage": [r["sent_bytes_per_step"] for r in ranks],
                "tied_grad_allreduce_bytes_per_stage": [r["tied_grad_allreduce_bytes"] for r in ranks],
                "param_bytes_per_stage": [r["param_bytes"] for r in ranks],
                "how": "activations sent forward and their gradients backward, summed from the tensors sent",
            },
        }

    # ---- reading ------------------------------------------------------------------------------------------

    explains = {Bottleneck.COMPUTE: (  # the schedule is one region: compute, sends, idle
        "pipeline: {share}% of the step is the pipeline schedule (stage compute, point-to-point sends and the bubble: "
        "see pp's measured bubble); more micro-batches shrink the bubble (pp:microbatches)")}
    sent_by = "stage 0"  # its communication count is the first stage's sends

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """Schedule, micro-batches and stages; each stage's measured bubble against (p - 1) / (m + p - 1); stage 0's
        bytes per sample."""
        first = found[0]
        bubble = first.get("bubble") or {}
        stages = range(first.get("stages") or 0)
        measured = "; ".join(f"stage {s} {rd.values([((f.get('bubble') or {}).get('measured_per_stage') or [None] * (s + 1))[s] for f in found])}"
                             for s in stages)
        sent = rd.values([((f.get("communication") or {}).get("quality_run") or {}).get("bytes_per_sample") for f in found])
        return (f"{first['schedule']}, {first['microbatches']} micro-batches over {first['stages']} stages (blocks "
                f"{first.get('layers_per_stage')}): measured bubble {measured}, against (p - 1) / (m + p - 1) = "
                f"{rd.g(bubble.get('formula'))}; stage 0 sends {sent} bytes per sample")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))
