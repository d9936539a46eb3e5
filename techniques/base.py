"""The technique interface every acceleration technique implements, and the registry.

A technique is a small class with typed options and a fixed set of hooks, all no-ops by default. The training
loop (``bench/loop.py``) calls the hooks in one documented order; a technique overrides only what it touches:

    launch(ctx)                         -> how many processes / which backend (distributed techniques)
    configure(cfg)                      -> adjust the TrainConfig (micro-batches, ...) before anything is built
    tune(cfg, probe, ctx)               -> may probe fresh copies of the workload (LR range test, batch search)
                                           and return a changed TrainConfig; its time is the trial's one-off cost
                                           (``probe.fresh()`` builds a copy, ``probe.loop(built, lr)`` trains it:
                                           techniques sit below the loop and never import it)
    transform_model(model, ctx)         -> in phase order: surgery, precision, checkpointing, compile, sharding
    build_optimizer(params, default, ctx)
    attach(optimizer, ctx)              -> once, with the optimizer the loop steps (LR schedules start here)
    batches(pipeline, batch_size, seed, ctx) -> where batches come from (one owner; None keeps the workload's own):
                                           a DataLoader over the workload's Dataset (``loader``)
    wrap_data(batches, ctx)             -> batches are pulled one step at a time: ``ctx.step`` is the step to come
    forward_backward(model, x, y, loss_fn, ctx) -> loss  (one owner) runs the whole step's forwards and backwards
                                           itself (a pipeline schedule) instead of the loop's micro-batches below, and
                                           returns the step's mean loss, the same on every rank; the four hooks below
                                           then never run, so a set that needs them is refused
    micro_batch_context(model, last, ctx) -> context manager around each micro-batch's forward + backward
                                           (with grad_accum; e.g. DDP's no_sync for all but the last one)
    forward_context(ctx)                -> context manager entered around each forward + loss
    loss(out, batch, base_loss, ctx)    -> may replace the loss (distillation, multi-token, ...)
    backward(loss, ctx) -> bool         -> True if it ran backward itself (one owner: loss scaling)
    optimizer_step(opt, ctx) -> bool    -> True if it stepped the optimizer itself
    after_step(optimizer, ctx)          -> after every optimizer step, whoever owned it (fp16's scaler, DeepSpeed);
                                           several techniques may subscribe (an LR schedule beside early stopping)
    on_eval(metrics, ctx) -> bool       -> True asks the loop to stop (early stopping)
    eval_model(model, ctx) -> module    -> the module evaluation runs (compile: its eager original)
    finalize(model, ctx)
    results(ctx) -> dict | None         -> what the technique found (a search trace, a curve) for the record
    continuation_blocker(ctx) -> str | None -> why its quality run cannot be trained on past the planned budget
                                           (a schedule planned over the budget's steps); asked when a sweep
                                           schedules a time-budgeted continuation and again after the budget
    held_parts(ctx) -> {name: tensors}  -> what it keeps resident beside the model and optimizer (a distillation
                                           teacher), for the memory breakdown

The context says where training stands: ``step`` (optimizer steps completed), ``total_steps`` and
``total_samples`` (the quality run's plan; a speed window runs past it), ``batch_tokens`` (tokens of the batch being
trained, 0 for non-sequence workloads). The loop advances ``step`` after the ``after_step`` hooks.

Facts the harness needs about a technique are typed class attributes, never name checks in the core:
``kind`` (how quality is judged), ``compute_dtype`` (the matmul dtype it switches to: MFU's peak), ``zero_stage`` (the
ZeRO stage of a sharding technique) and ``memory_note`` (how its per-rank memory departs from the ZeRO formula),
``multi_process`` (the set runs on every process ``--nproc`` starts), ``splits_batch`` (its ranks train slices of
the global batch, or each the whole batch) and ``owns_lr`` (it sets every step's LR: a workload's own schedule is not
applied beside it).

Three facts change what a trial measures, so every technique declares them in its own class body and ``register``
refuses a class that does not (no default can be right for a technique nobody has looked at):

    own_flops: bool                     -> the step runs other FLOPs than the workload's model (a leaner or pruned
                                           model, extra heads, a teacher's forward): FLOPs per step are counted on
                                           the trial's own loop instead of the workload's model
    hides_tensors: bool                 -> the tensor-memory tracker cannot see what it runs (compiled graphs): the
                                           trial skips the memory breakdown, saying why, rather than report what
                                           the tracker did not see
    tune_options: tuple[str, ...]       -> the option strings ``bench tune`` offers its search, one candidate each
                                           ("" = the defaults); () keeps it out of the default search

``tests/test_registry.py`` measures the first two on each technique's test settings and fails one that changes the
model's FLOPs or hides its tensors without saying so.

How its findings read travels with the technique (the report, the findings, the bottleneck diagnosis and "What to
try next" loop over the registry and never name a technique):

    summarize(found) -> str             -> classmethod: the report's one-line "what it found" for one configuration
                                           (``found``: its ``results`` of each seed's trial, in seed order); the
                                           base class lists the result keys, so a technique that reports results
                                           without a summary shows them, never nothing (a registry test asks every
                                           technique with ``results`` for its own)
    caveat(found) -> str | None         -> classmethod: what makes the set's numbers mean something else than its
                                           name says (compile that captured no graph ran eager)
    setting_caveat(names) -> str | None -> classmethod: the same, read off the set's technique names alone (fp8
                                           without compile is not what fp8 is meant to cost)
    result_curve: ResultCurve | None    -> a curve in its results the report draws (the LR range test's loss vs LR)
    remedies: tuple[Remedy, ...]        -> the step bottlenecks (``Bottleneck``) it addresses and the advice's words:
                                           what to type, why, what to say when the set already has it or when this
                                           sweep measured it no faster
    explains: {Bottleneck: line}        -> the diagnosis line when the set holds it and the step is bound there (a
                                           pipeline schedule is one region; local SGD averages inside the optimizer)
    sent_by: str | None                 -> whose traffic its communication count is, when not every rank's alike

Model outputs: a model returns its logits (what ``loss_fn`` and evaluation take). A technique that makes the model
compute more in training (multi-token prediction's extra heads) has it return a ``TrainOutput`` there instead:
``logits`` (the next-token logits, what ``loss_fn`` sees) and ``extra`` (what the technique's own ``loss`` hook reads).
In eval mode such a model returns plain logits again, so evaluation, FLOP references and every other caller of the
model see the workload's own output; ``logits_of(out)`` gives the logits of either form.

Register with ``@register`` in a module ``techniques/<name>.py``: importing the package imports every public module
of it (``techniques/__init__.py``), so there is no list to add it to (a third-party technique comes from a file or an
entry point instead: docs/plugins.md). Its test file ``tests/test_<name>.py`` declares the settings the registry-wide
tests run it with (``SETTINGS``, tests/helpers.py). Per-block transforms find the blocks with
``model_blocks(model, ctx)``, never ``model.blocks``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from bench.core.structure import ModelStructure, describe
from bench.core.text import shown

if typing.TYPE_CHECKING:
    from bench.workloads.base import Preference


class Kind(enum.StrEnum):
    """How a technique relates to the baseline's math; decides how it is judged."""

    EXACT = "exact"  # same math as the baseline: losses must match (parity), judged on speed and memory
    NUMERIC = "numeric"  # close but not bit-equal (reduced precision): loss drift is recorded, not failed
    ALGORITHMIC = "algorithmic"  # changes learning dynamics: judged by time-to-target and final metric


class Phase(enum.IntEnum):
    """Order of model transforms, the way torchtitan applies them."""

    SURGERY = 0
    PRECISION = 1
    CHECKPOINTING = 2
    COMPILE = 3
    SHARDING = 4


@dataclass(frozen=True)
class Claim:
    """A published effect of a technique, shown beside what the harness measured."""

    metric: str  # "speedup" (throughput ratio) or "memory_ratio" (peak memory ratio)
    low: float
    high: float
    setting: str  # hardware / model the claim was made on
    source: str  # citation or URL
    # The claim's conditions, for the claims check to say where a measured setting does not meet them:
    needs: tuple[str, ...] = ()  # techniques its setting ran with (("bf16", "compile")): a set without one is not it
    params: float | None = None  # its model's size in parameters (8e9): a model far smaller is not its regime
    devices: int | None = None  # its GPU count (8)
    # True: stated for the technique added to a set that holds others (fp8 on top of bf16 + compile), so every set
    # holding it is also measured against the same set without it, where the sweep ran that set.
    over_rest: bool = False


class Bottleneck(enum.StrEnum):
    """What a training step is bound by, as ``bench.analyze.bottleneck`` reads it off the step's phase shares and, on a
    GPU, the device's busy time (and the memory categories the findings read off the tensor peak)."""

    INPUT = "input"  # the step waits for data
    COPY = "copy"  # host-to-device copies of the inputs
    OPTIMIZER = "optimizer"  # the optimizer step
    OVERHEAD = "overhead"  # time outside the labelled regions: Python, kernel launches
    LAUNCH = "launch"  # a GPU left idle between many short kernels: the host cannot launch them fast enough
    HOST = "host"  # a GPU left idle while the host works (Python, data, synchronisations), its kernels not short
    COMPUTE = "compute"  # the forward and backward math
    ACTIVATIONS = "activations"  # activations dominate the tensor peak


@dataclass(frozen=True)
class Remedy:
    """What a technique offers against one ``Bottleneck``, in the words the diagnosis and "What to try next" use.

    The advice reads "try {say} ({why})" for a set without it; ``again`` for a set that has it already; once this
    sweep measured a set holding it no faster than the reference, ``refuted`` ("{refuted} (the sets measured): ...",
    with ``refuted_why`` where the findings explain it) instead of a suggestion the numbers beside it refute."""

    bottleneck: Bottleneck
    say: str = ""  # how the advice names it ("loader:workers=2", "activation checkpointing"); "" = its name
    why: str = ""  # the parenthesis after the suggestion ("a DataLoader with worker processes")
    again: str | None = None  # the advice for a set that already holds it
    refuted: str | None = None  # the clause when this sweep measured it no faster ("worker processes did not pay here")
    refuted_why: str = ""  # why that may be, for the findings ("on a machine with few cores they take the cores...")
    device: str | None = None  # suggested on this device type only ("cuda"); None: on any
    if_dtype_faster: bool = False  # suggested only where its ``compute_dtype``'s calibrated peak beats fp32's


@dataclass(frozen=True)
class ResultCurve:
    """A curve a technique keeps in its ``results`` that the report draws, one panel per workload and one line per
    trial: ``results[key]`` is a list of points, ``x`` and ``y`` index into each; ``mark`` names a result value drawn
    as a dotted vertical line (the chosen learning rate)."""

    name: str  # the figure's file name (figures/NAME.png)
    title: str
    caption: str
    key: str = "curve"
    x: int = 0
    y: int = 1
    xlabel: str = ""
    ylabel: str = ""
    xlog: bool = False
    mark: str | None = None


@dataclass
class TrainConfig:
    """What the loop needs to know that techniques may change before anything is built."""

    batch_size: int  # samples per optimizer step (the global batch on one process)
    micro_batches: int = 1  # forward/backward passes per optimizer step (gradient accumulation)
    lr: float = 1e-3
    weight_decay: float = 0.0


@dataclass
class Context:
    """Everything a hook may need about the trial it runs in. Techniques may keep state in ``state``."""

    device: torch.device
    workload: str = ""
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    structure: ModelStructure | None = None  # the model's parts (``bench.core.structure``): its blocks, for per-block
    # transforms (``model_blocks``), and what model-changing techniques ask (``model_structure``); None when not
    # known (a device-level listing, a context made by hand): checks then refuse nothing for a missing part
    has_batchnorm: bool = False
    available_packages: frozenset[str] = frozenset()
    technique_names: tuple[str, ...] = ()  # every technique of the set, so modifiers can check their partners
    step: int = 0  # optimizer steps completed in this process (the loop advances it)
    total_steps: int = 0  # optimizer steps the quality run plans (the sample budget at this set's batch)
    total_samples: int = 0  # samples the quality run plans
    batch_tokens: int = 0  # tokens of the batch being trained (sequence workloads; 0 otherwise)
    sequence_length: int = 0  # the workload's tokens per sample (sequence workloads; 0 otherwise)
    metric: str = ""  # the workload's quality metric and its direction (early stopping monitors it)
    higher_is_better: bool = True
    cache_dir: Path | None = None  # where a technique may cache what it computed once per sweep (scorers, ...)
    forward_targets: str | None = None  # the model computes its own loss: the keyword of its forward that takes the
    # targets (``model(x, targets=y)``); techniques that compute a loss from the model's logits refuse such a model
    has_preferences: bool = False  # the workload has the preference structure (prompts, pairs, a gold reward, a
    # reward model) that preference methods need: known at planning from the workload class
    preference: Preference | None = None  # in a trial: that structure itself (``BuiltWorkload.preference``, the
    # ``bench.workloads.base.Preference`` interface), None elsewhere
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def blocks(self) -> str | None:
        """The dotted path of the model's blocks (``structure.blocks``), None when it has none or is not known."""
        return self.structure.blocks if self.structure is not None else None


def model_blocks(model: nn.Module, ctx: Context) -> nn.ModuleList | nn.Sequential | None:
    """The model's blocks (its structure's ``blocks``: ``model.blocks`` for most built-in workloads, found or named
    for a user's model; an nn.ModuleList, or an nn.Sequential a user named), or None when it has none. Per-block
    techniques use this, never ``model.blocks`` (a user's or a Hugging Face model keeps its blocks elsewhere)."""
    path = model_structure(model, ctx).blocks
    if path is None:
        return None
    blocks = model.get_submodule(path)
    if not isinstance(blocks, nn.ModuleList | nn.Sequential):
        raise TypeError(f"the model's blocks {path!r} are a {type(blocks).__name__}, not an nn.ModuleList")
    return blocks


def own_loss_problem(ctx: Context, needs: str) -> str | None:
    """Why a technique that needs the model's logits apart from its loss (``needs``: what it does with them) cannot
    run on a model that computes its own loss in its forward (``ctx.forward_targets``), or None."""
    if not ctx.forward_targets:
        return None
    return (f"{needs}; this model computes its own loss in its forward (forward_targets={ctx.forward_targets!r}): "
            "return loss=(logits, targets) -> loss from build instead to run it")


def model_structure(model: nn.Module, ctx: Context) -> ModelStructure:
    """The structure of ``model``: ``ctx.structure`` (the workload's, as the harness passes it), else the model's own
    description or what can be inferred from it (``bench.core.structure.describe``). Techniques that change, split or
    scale a model ask it, never a workload's name."""
    return ctx.structure if ctx.structure is not None else describe(model)


class ProbeLoop(typing.Protocol):
    """What ``Probe.loop`` returns (``bench.loop.TrainLoop`` in a trial): the parts a probing technique touches.
    Techniques sit below the loop and never import it; this is the interface they may rely on."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device

    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Train one optimizer step on ``batch`` and return its loss."""
        ...


@dataclass
class Probe:
    """What ``tune`` may use: fresh, untouched copies of the trial's workload (same size and seed), built on demand.

    ``fresh()`` returns a new ``bench.workloads.BuiltWorkload`` (model, ``batches(batch_size, seed)``, ``loss_fn``,
    ``evaluate``, ``train_data``, ``quality_steps``, ...); ``fresh(seed)`` one initialised from another seed (a
    scorer shared by every trial); ``loop(built, lr)`` a plain training loop on one of them. The trial's own model is never touched by a probe. Work computed once and
    cached for every trial (a difficulty scorer) adds its time to ``shared_s``: it is reported by the technique,
    not charged to the trial as a one-off cost.
    """

    fresh: Callable[..., Any]
    device: torch.device
    seed: int = 0
    shared_s: float = 0.0  # time a technique spent on work cached for every trial of the sweep (not this trial's)
    make_loop: Callable[..., Any] | None = None  # the harness's plain loop (``bench.loop.plain_loop``), filled in by
    # the trial: techniques sit below the loop and never import it

    def loop(self, built: Any, lr: float, micro_batches: int = 1) -> ProbeLoop:
        """A training loop with no techniques and the default optimizer on ``built`` (a workload ``fresh()``
        returned), on the probe's device: ``loop.step(batch)`` trains one optimizer step and returns its loss."""
        if self.make_loop is None:
            raise TypeError("this Probe has no make_loop: pass bench.loop.plain_loop (bench.trial does)")
        return self.make_loop(built, lr, self.device, micro_batches)


@dataclass
class TrainOutput:
    """What a model returns in training when it computes more than its logits (see the module docstring)."""

    logits: torch.Tensor  # what the workload's loss_fn takes: the next-token (or class) logits
    extra: dict[str, Any] = field(default_factory=dict)  # read by the technique's own loss hook


def logits_of(out: Any) -> Any:
    """The logits of a model output, plain or ``TrainOutput``."""
    return out.logits if isinstance(out, TrainOutput) else out


class OptionError(ValueError):
    """A technique's option string is unknown or malformed. The message lists what is valid."""


class Technique:
    """Base class: every hook is a no-op. Subclasses set the class attributes and override what they touch."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    kind: ClassVar[Kind] = Kind.EXACT
    phase: ClassVar[Phase] = Phase.SURGERY
    slot: ClassVar[str | None] = None  # one technique per slot per set ("precision", "optimizer", ...)
    conflicts: ClassVar[frozenset[str]] = frozenset()  # names this technique cannot be combined with
    claims: ClassVar[tuple[Claim, ...]] = ()
    compute_dtype: ClassVar[str | None] = None  # matmul dtype it switches to: "bfloat16", "float16", "tfloat32"
    trains: ClassVar[bool] = True  # False: its steps train nothing (best-of-n; its cost is at inference), so the
    # report gives its step no speed, MFU or memory ratio against a set that trains
    zero_stage: int | None = None  # ZeRO stage of a data-parallel/sharding technique (0 = DDP); None otherwise
    memory_note: ClassVar[str | None] = None  # how its per-rank memory departs from the ZeRO formula, if it does
    multi_process: ClassVar[bool] = False  # runs on every process torchrun starts (--nproc); sets without such a
    # technique run in one process, as the reference the multi-process sets are compared with
    owns_lr: ClassVar[bool] = False  # sets the LR of every step itself (a schedule): the workload's own LR schedule
    # (a user's build) is not applied beside it, and the report says the set replaced it
    splits_batch: ClassVar[bool] = True  # a multi-process technique's ranks each train a slice of the global
    # batch (data parallel); False: every rank trains the whole batch (tensor and pipeline parallelism)
    # How its findings read (see the module docstring): remedies, explanations, a curve to draw.
    remedies: ClassVar[tuple[Remedy, ...]] = ()
    explains: ClassVar[Mapping[Bottleneck, str]] = types.MappingProxyType({})  # "{share}": the phase's share in %
    result_curve: ClassVar[ResultCurve | None] = None
    sent_by: ClassVar[str | None] = None  # whose traffic its communication count is ("stage 0"), if not every rank's
    # Declared by every technique in its own class body (``register`` refuses a class without them; module docstring):
    own_flops: ClassVar[bool]  # the trained step runs other FLOPs than the workload's model: counted on its own loop
    hides_tensors: ClassVar[bool]  # the tensor tracker cannot see what it runs (compiled graphs)
    tune_options: ClassVar[tuple[str, ...]]  # the option strings ``bench tune`` offers its search ("" = the defaults;
    # () keeps it out of the default candidates; it can still be named in ``tune --techniques``)

    @dataclass(frozen=True)
    class Options:
        pass

    def __init__(self, options: Options | None = None) -> None:
        self.options = options if options is not None else self.Options()

    # ---- options -------------------------------------------------------------------------------------------

    @classmethod
    def parse_options(cls, raw: dict[str, str]) -> Options:
        """Build ``Options`` from string values (``grad_accum:steps=4``), converting to the declared types."""
        fields = {f.name: f for f in dataclasses.fields(cls.Options)}
        hints = typing.get_type_hints(cls.Options)
        values: dict[str, Any] = {}
        for key, text in raw.items():
            if key not in fields:
                valid = ", ".join(sorted(fields)) or "none"
                raise OptionError(f"technique '{cls.name}' has no option {shown(key)} (valid options: {valid})")
            values[key] = _convert(cls.name, key, text, hints[key])
        try:
            return cls.Options(**values)
        except (TypeError, ValueError) as exc:
            raise OptionError(f"technique '{cls.name}': {exc}") from exc

    @classmethod
    def option_help(cls) -> str:
        parts = []
        for f in dataclasses.fields(cls.Options):
            default = f.default if f.default is not dataclasses.MISSING else "required"
            parts.append(f"{f.name}={default}")
        return ", ".join(parts)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "options": dataclasses.asdict(self.options)}

    # ---- reading --------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The report's one line on what this technique found in one configuration: ``found`` holds the
        ``technique_results`` entries of its trials, one per seed, in seed order. This default lists the result
        keys (visibly: a technique that reports results without a summary of its own is seen, not skipped)."""
        keys = sorted({k for f in found if isinstance(f, dict) for k in f})
        shown_keys = ", ".join(keys[:12]) + (f" and {len(keys) - 12} more" if len(keys) > 12 else "")
        return (f"{len(found)} result(s) with keys {shown_keys or 'none'} (no summary of its own: see "
                "technique_results in the records)")

    @classmethod
    def caveat(cls, found: list[dict[str, Any]]) -> str | None:
        """What makes a set's numbers mean something else than its name says, read off this technique's results of
        the set's trials (one per ok trial, None where a trial recorded none); None when nothing does."""
        return None

    @classmethod
    def setting_caveat(cls, names: tuple[str, ...]) -> str | None:
        """What makes its numbers mean something else in a set of these technique ``names`` (its own among them):
        a setting it is not meant to run in. The report notes it beside the set and lists it as a finding."""
        return None

    @classmethod
    def remedy_for(cls, bottleneck: Bottleneck) -> Remedy | None:
        """Its remedy for ``bottleneck``, or None when it offers none."""
        return next((r for r in cls.remedies if r.bottleneck == bottleneck), None)

    # ---- planning ------------------------------------------------------------------------------------------

    def check(self, ctx: Context) -> str | None:
        """Why this technique cannot run in ``ctx``; None when it can."""
        return None

    # ---- hooks, in the order the loop calls them -----------------------------------------------------------

    def launch(self, ctx: Context) -> int | None:
        """Number of processes this technique needs (None: whatever the sweep asks for)."""
        return None

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        return cfg

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        """Probe fresh copies of the workload and return the TrainConfig to train with (the time it takes is a
        one-off cost of the trial, recorded as ``build.probe_s``)."""
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return model

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        """Return an optimizer to replace the default one, or None to keep it."""
        return None

    def attach(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        """Called once with the optimizer the loop steps, before the first step."""
        return None

    def batches(self, pipeline: Any, batch_size: int, seed: int, ctx: Context) -> Iterator[Any] | None:
        """Load the global batches of ``batch_size`` from ``pipeline`` (a ``bench.core.data.Pipeline``: the workload's
        training set as a Dataset, and the key order the workload's own batches follow) instead of the workload's
        in-memory path; None keeps the workload's own. At most one technique of a set owns it."""
        return None

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return batches

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], ctx: Context) -> torch.Tensor | None:
        """Run the step's forward and backward passes on the batch ``(x, y)`` (already on the device) and return its
        mean loss, detached and the same on every rank. At most one technique of a set owns it (pipeline
        parallelism); the loop then skips its own micro-batches and never calls ``micro_batch_context``,
        ``forward_context``, ``loss`` or ``backward``. The optimizer step and ``after_step`` stay the loop's."""
        return None

    def micro_batch_context(self, model: nn.Module, last: bool, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        """Entered around each micro-batch's forward and backward when a step has several (``last``: the final one
        before the optimizer step)."""
        return contextlib.nullcontext()

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def loss(self, out: Any, batch: Any, base_loss: torch.Tensor, ctx: Context) -> torch.Tensor:
        return base_loss

    def backward(self, loss: torch.Tensor, ctx: Context) -> bool:
        return False

    def optimizer_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> bool:
        return False

    def after_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        """After each optimizer step (``ctx.step`` still counts the steps before it)."""
        return None

    def on_eval(self, metrics: dict[str, float], ctx: Context) -> bool:
        return False

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        """The module evaluation runs (same parameters). Compile returns its eager original: switching a compiled
        module to eval mode would compile it again, which says nothing about training."""
        return model

    def finalize(self, model: nn.Module, ctx: Context) -> None:
        return None

    def results(self, ctx: Context) -> dict[str, Any] | None:
        """What the technique found, kept in the record's ``technique_results`` under its name."""
        return None

    def continuation_blocker(self, ctx: Context) -> str | None:
        """Why this technique's quality run cannot be trained on past its planned budget, or None when it can.

        The harness trains a set that ran faster than the reference on, to the reference's training clock (the
        equal-time comparison, docs/methodology.md). A technique whose behaviour is planned over the budget's steps
        (an LR schedule that ends there, a pacing or pruning schedule over a fraction of them) would have been
        planned differently for a longer run, so training on past the plan is not what the technique does: it
        returns the reason in one sentence. Asked with the planning context when the continuation is scheduled,
        and with the trial's live context once its budget is trained (state a technique found while training,
        such as a stop, counts there).
        """
        return None

    def held_parts(self, ctx: Context) -> dict[str, list[torch.Tensor]]:
        """What this technique keeps resident beside the model and optimizer, by name (a distillation teacher's
        weights, a reference policy): the memory breakdown counts them as "other" from the start of the tracked
        step, so its peak and memory ratio include them, and records each part's bytes under ``held``."""
        return {}


_KIND_ORDER = (Kind.EXACT, Kind.NUMERIC, Kind.ALGORITHMIC)
_DTYPE_ORDER = ("float32", "tfloat32", "bfloat16", "float16")  # autocast's 16 bits win over TF32's fp32 matmuls


def set_kind(techs: Iterable[Technique]) -> Kind:
    """A set is judged as its least exact member: algorithmic > numeric > exact."""
    return max((t.kind for t in techs), key=_KIND_ORDER.index, default=Kind.EXACT)


def set_compute_dtype(techs: Iterable[Technique]) -> str:
    """The dtype a set's matmuls run in (picks the peak MFU is measured against)."""
    return max((t.compute_dtype for t in techs if t.compute_dtype), key=_DTYPE_ORDER.index, default="float32")


def batch_shards(techs: Iterable[Technique], world_size: int) -> int:
    """Into how many slices the global batch is split across the ranks: the world size under data parallelism, 1
    when a multi-process technique has every rank train the whole batch (tensor or pipeline parallelism)."""
    return 1 if any(t.multi_process and not t.splits_batch for t in techs) else world_size


def set_zero_stage(techs: Iterable[Technique]) -> int | None:
    return next((t.zero_stage for t in techs if t.zero_stage is not None), None)


def _convert(technique: str, key: str, text: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if text.lower() in ("none", "null", ""):
            return None
        hint = args[0]
    if hint is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise OptionError(f"technique '{technique}': option '{key}' wants true/false, got {shown(text)}")
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        if text not in choices:
            raise OptionError(
                f"technique '{technique}': option '{key}' must be one of {', '.join(map(str, choices))}, got {shown(text)}"
            )
        return text
    try:
        return hint(text)
    except (TypeError, ValueError):
        raise OptionError(
            f"technique '{technique}': option '{key}' wants {getattr(hint, '__name__', hint)}, got {shown(text)}"
        ) from None


# ---- registry ----------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Technique]] = {}


# What every technique declares in its own class body (the module docstring says why): name -> what it must be.
DECLARED: dict[str, str] = {"own_flops": "a bool", "hides_tensors": "a bool", "tune_options": "a tuple of option strings"}


def undeclared(cls: type) -> list[str]:
    """The facts of ``DECLARED`` that ``cls`` does not set in its own class body (a parent's value does not count:
    a subclass may run other FLOPs than its parent)."""
    return [name for name in DECLARED if name not in vars(cls)]


def register(cls: type[Technique]) -> type[Technique]:
    """Class decorator: add a technique to the registry. A duplicate name is an error, and so is a class that does
    not declare the facts that change its measurement (``DECLARED``)."""
    name = getattr(cls, "name", None)
    if not name:
        raise TypeError(f"{cls.__qualname__} has no 'name'")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"technique name '{name}' is registered twice ({_REGISTRY[name].__module__}, {cls.__module__})")
    missing = undeclared(cls)
    if missing:
        raise TypeError(f"technique '{name}' ({cls.__module__}.{cls.__qualname__}) must declare "
                        f"{', '.join(missing)} in its class body: {'; '.join(f'{m} = {DECLARED[m]}' for m in missing)} "
                        "(what each means: techniques/base.py)")
    wrong = [m for m in ("own_flops", "hides_tensors") if not isinstance(vars(cls)[m], bool)]
    options = vars(cls)["tune_options"]
    if not (isinstance(options, tuple) and all(isinstance(o, str) for o in options)):
        wrong.append("tune_options")
    if wrong:
        raise TypeError(f"technique '{name}' ({cls.__module__}.{cls.__qualname__}): "
                        f"{'; '.join(f'{m} must be {DECLARED[m]}, not {vars(cls)[m]!r}' for m in wrong)}")
    _REGISTRY[name] = cls
    return cls


def registry() -> dict[str, type[Technique]]:
    """All registered techniques by name (importing ``techniques`` fills it)."""
    return dict(_REGISTRY)


def get(name: str) -> type[Technique]:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise OptionError(f"unknown technique {shown(name)} (known: {known})") from None
