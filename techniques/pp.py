"""Pipeline parallelism: a model's blocks split into consecutive stages, one per rank, run by torch's pipeline engine.

Method card
- What: rank ``s`` of ``p`` keeps stage ``s`` only: an even share of the blocks, the embeddings on stage 0, the final
  norm and head on the last. The global batch is cut into ``microbatches`` micro-batches (``m``); activations travel
  forward and their gradients backward between neighbouring stages, point to point. ``torch.distributed.pipelining``
  runs it: ``ScheduleGPipe`` (all forwards, then all backwards) or ``Schedule1F1B`` (after a warm-up, one forward
  then one backward, so at most ``p`` micro-batches' activations are alive on a stage instead of ``m``). Gradients
  are the mean over micro-batches, so the math is one process's at the same batch (parity checks it). A tied head
  gets its own copy on the last stage, its gradient all-reduced with the embedding's each step, as Megatron-LM does.
  Before the split the stages run in sequence on a probe and must give ``model(x)`` within 1e-4 of its largest value:
  a forward that does more than its description says is refused with one line. Kind exact.
- When it should pay: a model too large for one device's memory, across devices joined by a slower link than tensor
  parallelism needs: only the activations at stage edges travel. Each stage idles while the pipeline fills and
  drains, ``(p - 1) / (m + p - 1)`` of the step for equal stages (GPipe, sec. 2.2; the same for 1F1B, which saves
  memory, not time); more micro-batches shrink that bubble but make each kernel smaller. ``results`` reports each
  stage's measured idle fraction beside the formula, and the bytes each rank sends. On one CPU host with gloo the
  ranks share the cores and every boundary is a socket copy: expect it slower than one process. Not run on a GPU
  yet, its CUDA-event stage clock included.
- Options and caveats: ``schedule`` (1f1b), ``microbatches`` (4; 1F1B needs at least as many as ranks; the batch must
  split into them). Token models only. Refused for a model without described blocks, token embedding or head, whose
  blocks need more than the hidden state (Hugging Face Llama's rotary inputs), or with fewer blocks than ranks; with
  techniques that change the forward or backward (``bf16``, ``fp16``, ``grad_accum``, loss owners), ``compile``,
  ``ddp``, ``zero1``-``zero3``, ``deepspeed``, ``offload``, ``tp``, ``local_sgd``, ``fedavg``, ``mtp`` and
  ``efficient_arch``. Dropout above 0 would draw other random numbers than one process.
- Sources: Huang et al., "GPipe", arXiv:1811.06965; Narayanan et al., "PipeDream", SOSP 2019, and the flushed 1F1B
  schedule in Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
  arXiv:2104.04473, sec. 2.2; torch.distributed.pipelining docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-pp (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-parallelism/gpt`: gpt:tiny pp:schedule=gpipe 0.53x [0.42, 0.67] slower, memory 0.98x [0.97, 0.98] less (RSS); gpt:tiny pp:schedule=1f1b 0.55x [0.07, 4.46] (no verdict: 2 pairs: a verdict needs 3), memory 0.97x [0.97, 0.98] less (RSS).
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from bench.core.structure import ModelStructure
from techniques import _reading as rd
from techniques._distributed import CommCounter, local_bytes, needs_world
from techniques.base import (
    Bottleneck,
    Context,
    Kind,
    Phase,
    Technique,
    TrainConfig,
    model_structure,
    own_loss_problem,
    register,
)
from techniques.base import get as get_technique

_LOOP_HOOKS = ("micro_batch_context", "forward_context", "loss", "backward")  # what forward_backward replaces
PROBE_SHAPE = (2, 8)  # token ids the decomposition is checked on (batch, at most this many positions)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}  # max |stages - model| / max |model|; 2e-2 for 16-bit
HIDDEN_ALONE = "runs the blocks on the hidden state alone"  # the plan puts "pp: " before a reason


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


def description_problem(s: ModelStructure, stages: int) -> str | None:
    """Why a model so described cannot be cut into ``stages`` pipeline stages, or None (the plan's reason: the
    technique's name is put before it)."""
    lacking = s.lacks("blocks", "embedding", "head")
    if lacking:
        return lacking
    if s.block_inputs:
        return (f"{HIDDEN_ALONE}; this model's blocks need more inputs ({', '.join(s.block_inputs)}), which its "
                "forward computes and passes in")
    if s.n_blocks and s.n_blocks < stages:
        return f"the model has {s.n_blocks} blocks, fewer than the {stages} pipeline stages: run with --nproc {s.n_blocks}"
    return None


def batch_problem(batch_size: int, microbatches: int) -> str | None:
    """Why a batch of ``batch_size`` samples does not split into ``microbatches`` equal ones, or None."""
    if batch_size % microbatches:
        return (f"the batch of {batch_size} samples does not split into {microbatches} equal micro-batches "
                "(pp:microbatches=N with N dividing the batch)")
    return None


def _hidden(out: Any) -> torch.Tensor:
    """A block's hidden state: its output, or the first item of the tuple some blocks return."""
    return out[0] if isinstance(out, tuple | list) else out


class Stage(nn.Module):
    """One pipeline stage, cut from the model as its description says: stage 0 embeds the token ids (the token
    embedding, plus the position embedding of positions 0..T-1, then the ``pre_blocks`` modules), every stage runs
    its share of the blocks on the hidden state alone, the last one the final norm and the head. The submodules are
    the model's own (the same objects, nothing copied)."""

    def __init__(self, model: nn.Module, s: ModelStructure, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.embedding = model.get_submodule(s.embedding) if first else None
        self.positions = model.get_submodule(s.position_embedding) if first and s.position_embedding else None
        self.pre = nn.ModuleList(model.get_submodule(p) for p in s.pre_blocks) if first else nn.ModuleList()
        blocks = model.get_submodule(s.blocks)
        self.blocks = nn.ModuleList(blocks[i] for i in layers)
        self.final_norm = model.get_submodule(s.final_norm) if last and s.final_norm else None
        self.head = model.get_submodule(s.head) if last else None
        self.hidden_shape: tuple[int, ...] = ()  # a hidden state's and the output's shape past (batch, positions),
        self.output_shape: tuple[int, ...] = ()  # found on the probe (``check_decomposition``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # token ids (B, T) -> the hidden state the first block takes
            x = self.embedding(x) if self.positions is None else \
                self.embedding(x) + self.positions(torch.arange(x.shape[1], device=x.device))
            for module in self.pre:
                x = module(x)
        for block in self.blocks:
            x = _hidden(block(x))
        if self.last:
            x = self.head(x if self.final_norm is None else self.final_norm(x))
        return x


def _outputs(value: Any) -> torch.Tensor:
    """The model's output tensor (a tensor, the first of a tuple, or an object's ``logits``)."""
    if isinstance(value, tuple | list):
        value = value[0]
    value = getattr(value, "logits", value)
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"pp needs a model whose output is a tensor (its logits); this one returns "
                         f"{type(value).__name__}")
    return value


def probe_input(model: nn.Module, s: ModelStructure, sequence_length: int, device: torch.device) -> torch.Tensor:
    """Token ids drawn from the described embedding's vocabulary with a fixed generator (the same on every rank)."""
    vocab = model.get_submodule(s.embedding).num_embeddings
    T = min(sequence_length or PROBE_SHAPE[1], PROBE_SHAPE[1])
    return torch.randint(0, vocab, (PROBE_SHAPE[0], T), generator=torch.Generator().manual_seed(0)).to(device)


def check_decomposition(model: nn.Module, s: ModelStructure, x: torch.Tensor) -> tuple[tuple[int, ...],
                                                                                        tuple[int, ...]]:
    """Run the stages the description defines one after the other, in one process, on ``x`` and require the
    result to equal ``model(x)`` (eval mode, no gradients): the split is the model only where its forward does
    nothing the description does not say. Returns the hidden state's and the output's shape past (batch,
    positions); raises ValueError with one line naming what differs."""
    whole = Stage(model, s, range(len(model.get_submodule(s.blocks))), first=True, last=True)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            expected = _outputs(model(x))
            try:
                h = Stage(model, s, range(0), first=True, last=False)(x)
            except Exception as exc:
                raise ValueError(f"pp: the model's embedding as described fails on a probe of token ids "
                                 f"({_said(exc)})") from None
            hidden = tuple(h.shape[2:])
            for block in whole.blocks:
                try:
                    h = _hidden(block(h))
                except Exception as exc:
                    raise ValueError(f"pp: {HIDDEN_ALONE}; this model's blocks need more inputs (called with the hidden "
                                     f"state alone, {type(block).__name__} raised {_said(exc)})") from None
                if not isinstance(h, torch.Tensor) or tuple(h.shape[2:]) != hidden:
                    raise ValueError(f"pp: {HIDDEN_ALONE}; this model's {type(block).__name__} does not return one of the "
                                     f"shape it takes ({hidden})")
            got = _outputs(whole.head(h if whole.final_norm is None else whole.final_norm(h)))
    finally:
        for m, training in modes:
            m.training = training
    if got.shape != expected.shape:
        raise ValueError(f"pp: the stages in sequence give an output of shape {tuple(got.shape)}, the model "
                         f"{tuple(expected.shape)}: its description's embedding, blocks, final norm and head are not "
                         "all its forward does")
    diff = float((got.double() - expected.double()).abs().max()) / max(float(expected.abs().max()), 1e-30)
    tol = TOLERANCE.get(expected.dtype, 2e-2)
    if diff > tol:
        raise ValueError(f"pp: the stages in sequence (embedding{', position embedding' if s.position_embedding else ''}"
                         f"{', ' + ', '.join(s.pre_blocks) if s.pre_blocks else ''}, blocks on the hidden state alone, "
                         f"{'final norm, ' if s.final_norm else ''}head) differ from the model's forward on a probe "
                         f"(largest difference {diff:.1e} of its largest value; tolerance {tol:g}): its forward does "
                         "more than its description says (a step before the first block, or inputs its blocks take)")
    return hidden, tuple(expected.shape[2:])


def _said(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"


def _set(model: nn.Module, path: str, module: nn.Module | None) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def split_in_place(model: nn.Module, s: ModelStructure, rank: int, stages: int) -> tuple[Stage, bool]:
    """Cut ``model`` down to stage ``rank`` of ``stages``, in place: the parts this rank does not own are dropped from
    the model itself, so nothing keeps them alive. Returns the stage and whether the head was tied to the
    embedding."""
    layers = stage_layers(len(model.get_submodule(s.blocks)), stages)[rank]
    first, last = rank == 0, rank == stages - 1
    head = model.get_submodule(s.head)
    tied = head.weight is model.get_submodule(s.embedding).weight
    if last and not first and tied:  # Megatron's tied embedding: the last stage trains a copy, gradients summed
        head.weight = nn.Parameter(head.weight.detach())  # the same storage until the embedding is dropped below
    stage = Stage(model, s, layers, first, last)
    _set(model, s.blocks, nn.ModuleList(stage.blocks))
    if not first:
        for path in filter(None, (s.embedding, s.position_embedding, *s.pre_blocks)):
            _set(model, path, None)
    if not last:
        for path in filter(None, (s.final_norm, s.head)):
            _set(model, path, None)
    gc.collect()
    copy = stage.head.weight if last and not first and tied else None
    for p in stage.parameters():
        if p is not copy:  # the tied copy is stage 0's embedding again: counted there once
            p.held_by_one_rank = True  # parity's parameter distance sums it over the ranks (bench/reference.py)
    return stage, tied


class PipelineForward(nn.Module):
    """What evaluation runs on every rank: the full model's logits, from the stages' forward on the whole batch
    (activations sent point to point, the logits broadcast from the last stage)."""

    def __init__(self, stage: Stage, rank: int, stages: int) -> None:
        super().__init__()
        self.stage, self.rank, self.stages = stage, rank, stages

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        shape = tuple(idx.shape[:2])
        if self.stage.first:
            h = self.stage(idx)
        else:
            h = torch.empty((*shape, *self.stage.hidden_shape), device=idx.device)
            dist.recv(h, src=self.rank - 1)
            h = self.stage(h)
        h = h.float().contiguous()
        if self.stage.last:
            logits = h
        else:
            dist.send(h, dst=self.rank + 1)
            logits = torch.empty((*shape, *self.stage.output_shape), device=idx.device)
        dist.broadcast(logits, src=self.stages - 1)
        return logits


class StageClock:
    """Marks on one stage's timeline, read as seconds between two of them.

    On the CPU a mark is the host clock: execution is synchronous there, so the host's time is the stage's. On CUDA the
    host only queues kernels, so a host clock around a chunk would time its launches; a mark is a CUDA event recorded
    on the current stream instead, completed when the device gets there (after the chunk's input arrived and the
    work queued before it ran), the way ``StepTimer`` times steps. Reading waits for the later mark, so it happens
    outside the step (``_Step.settle``): no sync inside the schedule, which would stall the pipeline it measures.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def done(mark: Any) -> bool:
        """The device has passed this mark (always, for a host clock)."""
        return isinstance(mark, float) or bool(mark.query())

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        if isinstance(start, float):
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1000.0  # milliseconds


@dataclass
class _Step:
    """What one rank saw in one training step. Its times are marks until ``settle`` reads them."""

    wall_s: float = 0.0
    compute_s: float = 0.0
    sent_bytes: int = 0  # activations forward + their gradients backward
    trace: list[tuple[str, int]] | None = None  # ("F" | "B", micro-batch) in the order this stage ran them
    spans: list[tuple[Any, Any]] = field(default_factory=list)  # (start, end) marks of compute not yet read
    wall: tuple[Any, Any] | None = None  # the schedule's marks, not yet read

    def settle(self, wait: bool) -> bool:
        """Read the marks into ``compute_s`` and ``wall_s`` once the device has passed the last one (``wait``: block
        until it has); True when nothing is left to read."""
        if self.wall is None and not self.spans:
            return True
        last = self.wall[1] if self.wall is not None else self.spans[-1][1]
        if not wait and not StageClock.done(last):
            return False
        self.compute_s += sum(StageClock.seconds(a, b) for a, b in self.spans)
        if self.wall is not None:
            self.wall_s = StageClock.seconds(*self.wall)
        self.spans, self.wall = [], None
        return True


@register
class PP(Technique):
    name = "pp"
    summary = "pipeline parallelism: a model's blocks split into stages (torch.distributed.pipelining, GPipe or 1F1B)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
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
        self._unsettled: list[_Step] = []  # steps whose marks the device may not have passed yet
        self.clock = StageClock(torch.device("cpu"))
        self.rank, self.world = 0, 1
        self.comm = CommCounter()

    # ---- planning ----------------------------------------------------------------------------------------------

    def check(self, ctx: Context) -> str | None:
        reason = needs_world(ctx, self.name)
        if reason:
            return reason
        if ctx.structure is not None:  # None: no model named (a device-level listing), nothing to refuse yet
            reason = description_problem(ctx.structure, ctx.world_size)
            if reason:
                return reason
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
        own = own_loss_problem(ctx, "runs the model in stages and computes the loss from the last stage's logits")
        if own:
            return own
        return None

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        reason = batch_problem(cfg.batch_size, self.options.microbatches)
        if reason:
            raise ValueError(f"pp: {reason}")
        return cfg

    # ---- building ----------------------------------------------------------------------------------------------

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        self.rank, self.world, self._ctx = ctx.rank, ctx.world_size, ctx
        self.clock = StageClock(ctx.device)
        s = model_structure(model, ctx)
        reason = description_problem(s, self.world)
        if reason:
            raise ValueError(reason if reason.startswith("pp") else f"pp: {reason}")
        n_blocks = len(model.get_submodule(s.blocks))
        if n_blocks < self.world:
            raise ValueError(f"pp: the model has {n_blocks} blocks, fewer than the {self.world} pipeline stages: run "
                             f"with --nproc {n_blocks}")
        hidden, output = check_decomposition(model, s, probe_input(model, s, ctx.sequence_length, ctx.device))
        self.stage, self.tied = split_in_place(model, s, self.rank, self.world)
        self.stage.hidden_shape, self.stage.output_shape = hidden, output
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
        self._settle(wait=False)  # earlier steps the device has finished: their events are read and dropped
        self._step = step = _Step(trace=[])
        losses: list[torch.Tensor] = []
        started = self.clock.mark()
        if stage.first:
            schedule.step(x, return_outputs=False)
        elif stage.last:
            schedule.step(target=y, losses=losses, return_outputs=False)
        else:
            schedule.step(return_outputs=False)
        step.wall = (started, self.clock.mark())
        self.steps.append(step)
        self._unsettled.append(step)
        if self.tied and (stage.first or stage.last):
            weight = stage.embedding.weight if stage.first else stage.head.weight
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
        act = torch.empty((b, t, *stage.hidden_shape), dtype=dtype, device=meta, requires_grad=True)
        inputs = torch.empty((b, t), dtype=x.dtype, device=meta) if stage.first else act
        outputs = (torch.empty((b, t, *stage.output_shape), dtype=dtype, device=meta, requires_grad=True)
                   if stage.last else act)
        pipe = PipelineStage(stage, self.rank, self.world, device, input_args=inputs, output_args=outputs)
        self._time(pipe)
        kind = ScheduleGPipe if self.options.schedule == "gpipe" else Schedule1F1B
        schedule = kind(pipe, n_microbatches=m, loss_fn=self._timed(loss_fn), scale_grads=True)
        self._schedules[key] = schedule
        return schedule

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = self.clock.mark()
            try:
                return fn(*args, **kwargs)
            finally:
                self._step.spans.append((started, self.clock.mark()))

        return run

    def _settle(self, wait: bool) -> None:
        """Read the steps' marks in order, up to the first the device has not passed (``wait``: all of them)."""
        while self._unsettled and self._unsettled[0].settle(wait):
            self._unsettled.pop(0)

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
        self._settle(wait=True)
        steps = self.steps[1:] or self.steps
        fractions = [1 - s.compute_s / s.wall_s for s in steps if s.wall_s > 0]
        return statistics.median(fractions) if fractions else None

    def communication(self) -> dict[str, Any]:
        """Bytes this rank sends per step and the parameter bytes it holds."""
        stage = self.stage
        tied = 0
        if self.tied and stage is not None and (stage.first or stage.last):
            w = stage.embedding.weight if stage.first else stage.head.weight
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
            "tied_head": ("copy on the last stage, gradient all-reduced with stage 0's embedding" if self.tied
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
