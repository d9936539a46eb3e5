"""The training step: the one hot path. Hooks are resolved once, at construction, not looked up per step.

One call of ``TrainLoop.step`` is one optimizer step:

    zero_grad
    either, when a technique owns forward_backward (pipeline parallelism: its schedule interleaves micro-batches):
      loss = forward_backward(model, x, y, loss_fn)  (the whole step's forwards and backwards; labelled "forward")
    or, for each micro-batch:
      with micro-batch contexts (only with several micro-batches; e.g. DDP's no_sync before the last one):
        with forward contexts (autocast, ...):  out = model(x); loss = loss_fn(logits_of(out), y); loss hooks
                                                 (a model that computes its own loss: out = model(x, **{name: y});
                                                 loss = loss_fn(out, y), which picks the loss it returned)
        backward(loss / micro_batches)           (the backward owner, e.g. fp16's loss scaler, or loss.backward())
    optimizer step                               (the step owner, e.g. the loss scaler, or optimizer.step())
    after-step hooks of every subscriber         (LR schedules), then the workload's own LR schedule, then
                                                 ctx.step += 1

A workload size may warm its learning rate up (``lr_warmup``: GPT-2-class models spike without one): during the
loop's first ``lr_warmup`` optimizer steps every parameter group's LR is multiplied by (step + 1) / lr_warmup for
that step only, and restored before the after-step hooks, so a technique's own schedule (``after_step``) composes
with it. The count is the loop's own optimizer steps, not ``ctx.step`` (which a speed-only trial moves past the
quality plan), so the parity reference and every stage of a trial warm up alike from their first step.

The loop counts what it trained: ``tokens`` (real tokens, so a shortened sequence counts as short) and
``shapes`` (optimizer steps per distinct input shape, so FLOPs can follow the shapes actually trained).
The returned loss is a detached tensor (no ``.item()``: that would sync the device every step).

Its regions are labelled (``h2d``, ``forward``, ``backward``, ``optimizer``) for a phase pass
(``bench.measure.phases``): ``time_phases(clock)`` attaches a clock; without one each label is a shared no-op
context (a function call per region; tests/benchmarks/test_overhead.py times the loop against a bare one).
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from bench.measure.flops import count_flops
from bench.measure.phases import PhaseClock, no_region
from techniques.base import Context, Technique, logits_of


def overrides(tech: Technique, hook: str) -> bool:
    """Whether ``tech`` implements ``hook`` (the base class's is a no-op)."""
    return getattr(type(tech), hook) is not getattr(Technique, hook)


class TrainLoop:
    """Runs optimizer steps of ``model`` with the hooks of ``techniques`` in the documented order."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
        techniques: Sequence[Technique],
        ctx: Context,
        micro_batches: int = 1,
        tokens_per_sample: int = 0,
        lr_warmup: int = 0,
        forward_targets: str | None = None,
        schedule: Callable[[torch.optim.Optimizer], Any] | None = None,
    ) -> None:
        self.model = model
        # A model that computes its own loss takes the targets by this keyword (nanoGPT's ``targets``, Hugging
        # Face's ``labels``), and ``loss_fn`` reads the loss off its whole output.
        self.forward_targets = forward_targets
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.ctx = ctx
        self.micro_batches = micro_batches
        self.lr_warmup = lr_warmup
        self.optimizer_steps = 0  # what the LR warm-up counts
        self.device = ctx.device
        self.techniques = tuple(techniques)
        self._context_techs = [t for t in techniques if overrides(t, "forward_context")]
        self._micro_techs = [t for t in techniques if overrides(t, "micro_batch_context")]
        self._loss_techs = [t for t in techniques if overrides(t, "loss")]
        self._backward_owner = single_owner(techniques, "backward")
        self._step_owner = single_owner(techniques, "optimizer_step")
        self._fb_owner = single_owner(techniques, "forward_backward")
        if self._fb_owner is not None:
            _refuse_skipped_hooks(self._fb_owner, techniques, micro_batches)
        self._after_techs = [t for t in techniques if overrides(t, "after_step")]
        self.sequences = tokens_per_sample > 0  # inputs are (batch, sequence) token ids
        self.tokens = 0
        self.shapes: collections.Counter[tuple[int, ...]] = collections.Counter()
        self._region = no_region
        for tech in techniques:
            tech.attach(optimizer, ctx)
        # The workload's own LR schedule (a user's build), made after the techniques attached: one that owns the
        # LR (``Technique.owns_lr``: lr_schedule) replaces it, and the trial records that it did.
        owned = any(t.owns_lr for t in techniques)
        self.scheduler = schedule(optimizer) if schedule is not None and not owned else None

    def forward(self, x: Any, y: Any) -> tuple[Any, torch.Tensor]:
        """(the model's output, the loss) of one micro-batch, as the workload's loss is computed."""
        if self.forward_targets:
            out = self.model(x, **{self.forward_targets: y})
            return out, self.loss_fn(out, y)
        out = self.model(x)
        return out, self.loss_fn(logits_of(out), y)

    def forward_context(self) -> contextlib.AbstractContextManager[Any]:
        """The techniques' forward contexts entered together (also used around evaluation)."""
        if not self._context_techs:
            return contextlib.nullcontext()
        if len(self._context_techs) == 1:
            return self._context_techs[0].forward_context(self.ctx)
        stack = contextlib.ExitStack()
        for tech in self._context_techs:
            stack.enter_context(tech.forward_context(self.ctx))
        return stack

    def _micro_batch_context(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        if self.micro_batches == 1 or not self._micro_techs:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for tech in self._micro_techs:
            stack.enter_context(tech.micro_batch_context(self.model, last, self.ctx))
        return stack

    def time_phases(self, clock: PhaseClock | None) -> None:
        """Time the step's labelled regions on ``clock`` from now on (None: stop timing them)."""
        self._region = clock.region if clock is not None else no_region

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        region = self._region
        x, y = batch
        shape = tuple(x.shape)
        self.shapes[shape] += 1
        self.ctx.batch_tokens = shape[0] * shape[1] if self.sequences else 0
        self.tokens += self.ctx.batch_tokens
        with region("h2d"):
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
        with region("optimizer"):
            self.optimizer.zero_grad(set_to_none=True)
        n = self.micro_batches
        if n > 1 and (x.shape[0] % n or y.shape[0] != x.shape[0]):
            # chunk() would return fewer, unequal pieces: the last micro-batch (DDP's all-reduce) might never run
            # and the 1/n loss scale would be wrong, silently.
            raise ValueError(f"a batch of {x.shape[0]} samples does not split into {n} equal micro-batches")
        if self._fb_owner is not None:  # forward and backward interleave in the owner's schedule: one region
            with region("forward"):
                total = self._fb_owner.forward_backward(self.model, x, y, self.loss_fn, self.ctx)
            n = 1
        else:
            # Inline, not a helper: the last micro-batch's output and loss stay alive through the optimizer step, as
            # in a plain training loop, so the memory measured is the memory users' loops hold.
            pieces = zip(x.chunk(n), y.chunk(n), strict=True) if n > 1 else ((x, y),)
            total = None
            for i, (xm, ym) in enumerate(pieces):
                with self._micro_batch_context(last=i == n - 1):
                    with region("forward"), self.forward_context():
                        out, loss = self.forward(xm, ym)
                        for tech in self._loss_techs:
                            loss = tech.loss(out, (xm, ym), loss, self.ctx)
                    with region("backward"):
                        scaled = loss / n if n > 1 else loss
                        if self._backward_owner is None or not self._backward_owner.backward(scaled, self.ctx):
                            scaled.backward()
                detached = loss.detach()
                total = detached if total is None else total + detached
        with region("optimizer"):
            restore = self._warm_up_lr() if self.optimizer_steps < self.lr_warmup else None
            if self._step_owner is None or not self._step_owner.optimizer_step(self.optimizer, self.ctx):
                self.optimizer.step()
            if restore is not None:
                for group, lr in zip(self.optimizer.param_groups, restore, strict=True):
                    group["lr"] = lr
            for tech in self._after_techs:
                tech.after_step(self.optimizer, self.ctx)
            if self.scheduler is not None:
                self.scheduler.step()
        self.optimizer_steps += 1
        self.ctx.step += 1
        assert total is not None
        return total / n if n > 1 else total

    def _warm_up_lr(self) -> list[Any]:
        """Scale every group's LR by this step's warm-up factor; the LRs to restore after the step."""
        factor = (self.optimizer_steps + 1) / self.lr_warmup
        saved = [group["lr"] for group in self.optimizer.param_groups]
        for group, lr in zip(self.optimizer.param_groups, saved, strict=True):
            group["lr"] = lr * factor  # a new value: an LR held as a tensor is not changed in place
        return saved

    def count_flops(self, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
        """Model FLOPs of one step on the model as trained now (a set with ``own_flops``: a leaner or pruned model,
        extra heads, a teacher's forward): forward, loss hooks and backward (through the backward owner, if any) on
        ``batch``. Counted on the eager module evaluation runs (compile's original: FlopCounterMode does not see
        through compiled graphs), with checkpointed blocks run plainly (model FLOPs exclude recomputation, as in
        PaLM's MFU). The optimizer does not step (FlopCounterMode counts no optimizer FLOPs in the reference either)
        and the gradients are dropped again."""
        if self._fb_owner is not None:
            raise ValueError(f"{self._fb_owner.name} runs the step's forwards and backwards itself: its FLOPs cannot "
                             "be counted on the loop's model")
        x, y = (t.to(self.device) for t in batch)
        model = self.model
        for tech in self.techniques:
            model = tech.eval_model(model, self.ctx)

        def one() -> None:
            with self.forward_context():
                out = model(x, **{self.forward_targets: y}) if self.forward_targets else model(x)
                loss = self.loss_fn(out if self.forward_targets else logits_of(out), y)
                for tech in self._loss_techs:
                    loss = tech.loss(out, (x, y), loss, self.ctx)
            if self._backward_owner is None or not self._backward_owner.backward(loss, self.ctx):
                loss.backward()

        flops = count_flops(one)
        self.optimizer.zero_grad(set_to_none=True)
        return flops


_PER_MICRO_BATCH_HOOKS = ("micro_batch_context", "forward_context", "loss", "backward")


def _refuse_skipped_hooks(owner: Technique, techniques: Sequence[Technique], micro_batches: int) -> None:
    """A ``forward_backward`` owner runs every forward and backward itself, so the loop's per-micro-batch hooks and
    its own micro-batches never run: a set that relies on them is refused, not silently changed."""
    skipped = [f"{t.name}.{hook}()" for t in techniques for hook in _PER_MICRO_BATCH_HOOKS if overrides(t, hook)]
    if skipped or micro_batches > 1:
        what = ", ".join(skipped) if skipped else f"{micro_batches} loop micro-batches"
        raise ValueError(f"{owner.name} runs the forward and backward itself (forward_backward); {what} would "
                         "never run: combine it without them")


def single_owner(techniques: Sequence[Technique], hook: str) -> Technique | None:
    owners = [t for t in techniques if overrides(t, hook)]
    if len(owners) > 1:
        names = ", ".join(t.name for t in owners)
        raise ValueError(f"several techniques want to own {hook}(): {names}; combine at most one of them")
    return owners[0] if owners else None


def default_optimizer(lr: float, weight_decay: float = 0.0) -> Callable[..., torch.optim.Optimizer]:
    """AdamW, the reference optimizer of every workload (torch's default foreach implementation)."""

    def make(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    return make


def workload_optimizer(built: Any, lr: float, weight_decay: float = 0.0) -> Callable[..., torch.optim.Optimizer]:
    """The optimizer a workload trains with: its own (a user's build may return an optimizer factory: its parameter
    groups, betas, weight decay), every group's LR scaled by ``lr`` / the workload's LR so that a technique that
    picks the LR (lr_finder) and the parity reference's perturbed LR move it as they move the default's; else the
    default AdamW at ``lr``."""
    own = getattr(built, "optimizer", None)
    if own is None:
        return default_optimizer(lr, weight_decay)
    scale = lr / built.lr

    def make(params: Any) -> torch.optim.Optimizer:
        optimizer = own(list(params))
        if scale != 1.0:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * scale
        return optimizer

    return make


def plain_loop(built: Any, lr: float, device: torch.device, micro_batches: int = 1, lr_warmup: int = 0
               ) -> TrainLoop:
    """A loop with no techniques on a built workload's model (a ``bench.workloads.BuiltWorkload``), with the
    workload's optimizer and LR schedule (the default AdamW unless its build returned its own): what references,
    probes and FLOP counts run. ``lr_warmup``: the parity reference passes the workload's (``lr_warmup_steps``);
    probes and FLOP counts train at the given LR."""
    optimizer = workload_optimizer(built, lr)(built.model.parameters())
    return TrainLoop(built.model, optimizer, built.loss_fn, [], Context(device=device), micro_batches,
                     built.tokens_per_sample, lr_warmup, getattr(built, "forward_targets", None),
                     getattr(built, "schedule", None))


def lr_warmup_steps(built: Any, batch_size: int) -> int:
    """The optimizer steps of a built workload's LR warm-up at a global batch of ``batch_size``: the size's
    ``lr_warmup_steps`` (stated at its own batch) over the same samples, so a set that changes the batch warms up
    over as much data (0: no warm-up)."""
    steps = getattr(built, "lr_warmup_steps", 0)
    if not steps:
        return 0
    return max(1, math.ceil(steps * built.batch_size / batch_size))


def build_optimizer(
    model: nn.Module, techniques: Sequence[Technique], ctx: Context, lr: float, weight_decay: float = 0.0,
    built: Any = None,
) -> torch.optim.Optimizer:
    """The optimizer of the model's trainable parameters (a frozen one, ``requires_grad=False``, never enters it:
    no state, no update), built by the one technique that builds it or else the workload's (``workload_optimizer``:
    a user's own factory, or the default AdamW)."""
    default = workload_optimizer(built, lr, weight_decay) if built is not None else default_optimizer(lr, weight_decay)
    trainable = [p for p in model.parameters() if p.requires_grad]
    chosen = None
    for tech in techniques:
        opt = tech.build_optimizer(trainable, default, ctx)
        if opt is not None:
            if chosen is not None:
                raise ValueError(f"two techniques build the optimizer ({chosen[0]}, {tech.name})")
            chosen = (tech.name, opt)
    return chosen[1] if chosen else default(trainable)


def recipe(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What an optimizer does, for the record: its class (a sharded wrapper's inner one beside it) and each parameter
    group's hyper-parameters and size, so a set whose optimizer is not the reference's can be told apart."""
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer's local optimizer
    name = type(optimizer).__name__ + (f"({type(inner).__name__})" if isinstance(inner, torch.optim.Optimizer) else "")
    groups = []
    for group in optimizer.param_groups:
        entry = {k: _plain(group[k]) for k in ("lr", "betas", "eps", "weight_decay", "momentum") if k in group}
        entry["params"] = sum(p.numel() for p in group["params"])
        groups.append(entry)
    return {"class": name, "groups": groups}


def _plain(value: Any) -> Any:
    """A hyper-parameter as JSON holds it (an LR held as a tensor, betas as a list), rounded to 6 significant
    digits: the record compares recipes, not rounding."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return float(f"{value:.6g}") if isinstance(value, float) else value
