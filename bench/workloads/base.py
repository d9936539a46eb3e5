"""The workload interface: a model family with size presets, an offline dataset and a held-out metric.

A workload states its shape once: its sizes are a typed dataclass (``Size``), and its model's parts are a
``ModelStructure`` it declares for every size (``Workload.structure_from``), so the plan checks technique sets against
the same description the built model carries (``BuiltWorkload.structure``). A preference workload hands the
preference methods the ``Preference`` interface (``BuiltWorkload.preference``); techniques import nothing else of a
workload.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from torch import nn

from bench.core.structure import ModelStructure
from bench.core.text import shown

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), on CPU; the loop moves them to the device


@dataclass(frozen=True)
class SourceTask:
    """A task to pretrain the workload's own model on before it trains on the workload (transfer learning): data
    disjoint from the workload's where the workload can spare it (``info["overlaps_target"]`` says when not). The
    workload that declares one in its model's description (``ModelStructure.source_task``) builds it
    (``BuiltWorkload.source_task``): only the workload knows which of its data the trials do not train on."""

    name: str  # what the model's description declares (``ModelStructure.source_task``)
    data: Any  # the source data itself (token ids, or (inputs, labels)), for checks
    batches: Callable[[int, int], Iterator[Batch]]  # (batch_size, seed) -> endless iterator of source batches
    info: dict[str, Any]  # what it is, for the record: "task" (words), its size, "overlaps_target", ...; the
    # pretrained checkpoint's cache key hashes it, so it names everything the data depends on
    new_head: bool  # another label space than the workload's: the model's head does not carry over


class WorkloadError(RuntimeError):
    """A workload cannot be built here (missing data, unknown size). The message says how to fix it."""


@dataclass(frozen=True)
class Size:
    """A workload's size preset: one frozen dataclass per workload (``MlpSize``, ``GptSize``, ...) whose fields are
    the size's parameters, in the order its workload documents them.

    Checked at construction: a value of the wrong type or out of range (a whole number below 1, another number not
    above 0, except the fields in ``may_be_zero``, which may be 0; None only where the field's type allows it) is a
    ``WorkloadError`` naming the field and what is valid, and so is what ``problem`` finds across fields.
    ``params()`` is the plain dict the workload builds from and records (``Workload.size_params``,
    ``BuiltWorkload.params``); ``of(params)`` checks such a dict (a scaled teacher's, a parsed size): unknown keys are
    errors listing the valid ones.
    """

    may_be_zero: ClassVar[tuple[str, ...]] = ()  # numeric fields that may be 0 (no extra corpus, no padding)
    derived: ClassVar[tuple[str, ...]] = ()  # keys the build adds to its recorded params (the vocabulary's size):
    # ``of`` drops them, since a built workload's params come back to build a variant of it (a distillation teacher)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _checked(type(self).__name__, f.name, hints[f.name], getattr(self, f.name),
                             f.name in self.may_be_zero)
            object.__setattr__(self, f.name, value)
        problem = self.problem()
        if problem:
            raise WorkloadError(f"{type(self).__name__}: {problem}")

    def problem(self) -> str | None:
        """What is wrong across fields (a width that is not a whole number of heads), or None."""
        return None

    def params(self) -> dict[str, Any]:
        """The size as the plain dict its workload builds from (tuples as lists, as a TOML or JSON reader gives)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Self:
        """The size whose ``params()`` are ``params`` (``derived`` keys dropped), checked."""
        fields = [f.name for f in dataclasses.fields(cls)]
        given = {k: v for k, v in params.items() if k not in cls.derived}
        unknown = [k for k in given if k not in fields]
        if unknown:
            raise WorkloadError(f"{cls.__name__} has no parameter(s) {', '.join(shown(k) for k in unknown)} "
                                f"(valid: {', '.join(fields)})")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in given
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise WorkloadError(f"{cls.__name__} lacks {', '.join(missing)} (required: {', '.join(fields)})")
        return cls(**given)


def _checked(owner: str, name: str, hint: Any, value: Any, zero_ok: bool) -> Any:
    """``value`` of the field ``name`` checked against its type ``hint`` (sequences become tuples, mappings
    read-only), or a WorkloadError naming what is valid."""
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    if optional:
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    bound = ">= 0" if zero_ok else (">= 1" if hint is int else "> 0")
    if hint is bool:
        ok, valid = isinstance(value, bool), "true or false"
    elif hint is int:
        ok, valid = _is_int(value) and value >= (0 if zero_ok else 1), f"a whole number {bound}"
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and \
            (value >= 0 if zero_ok else value > 0)
        valid = f"a number {bound}"
    elif hint is str:
        ok, valid = isinstance(value, str) and value != "", "a non-empty string"
    elif typing.get_origin(hint) is tuple:
        ok = isinstance(value, list | tuple) and len(value) > 0 and all(_is_int(v) and v >= 1 for v in value)
        valid, value = "a non-empty list of whole numbers >= 1", tuple(value) if ok else value
    elif typing.get_origin(hint) in (Mapping, dict):
        ok, valid = isinstance(value, Mapping), "a mapping of names to values"
        value = types.MappingProxyType(dict(value)) if ok else value
    else:
        raise TypeError(f"{owner}.{name}: a size field's type must be bool, int, float, str, tuple[int, ...] or a "
                        f"Mapping (optionally | None), not {hint}")
    if not ok:
        raise WorkloadError(f"{owner}: {name} must be {valid}{' or None' if optional else ''}, got {shown(value)}")
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


class Preference(typing.Protocol):
    """What the preference methods (techniques/dpo.py, grpo.py, rloo.py, best_of_n.py) may rely on in a preference
    workload's ``BuiltWorkload.preference`` (the built-in one is ``bench.workloads.pref.PreferenceTask``). Tensors live
    on the workload's device; sequences are (batch, prompt_len + completion_len) token ids.

    The other way round, a workload's evaluation samples with the evaluated module's ``preference_sample(prompts,
    generator) -> (sequences, kl)`` when it has one (best-of-n's sampling scheme and its closed-form KL)."""

    prompt_len: int
    completion_len: int
    train_prompts: torch.Tensor  # (n_train_prompts, prompt_len)
    chosen: torch.Tensor  # (n_train_pairs, seq_len): the preferred sequence of each training pair
    rejected: torch.Tensor  # (n_train_pairs, seq_len)
    start: nn.Module  # the starting policy, frozen, in eval mode: the reference of KL terms
    reward_model: nn.Module  # the proxy reward model, frozen, in eval mode
    meta: dict[str, Any]  # what building it cost and how good it is (``rm_heldout_accuracy``, ...)

    @property
    def seq_len(self) -> int:
        """Tokens of a prompt and its completion."""
        ...

    def gold(self, seqs: torch.Tensor) -> torch.Tensor:
        """The gold reward of each sequence's completion (batch,)."""
        ...

    def proxy(self, seqs: torch.Tensor) -> torch.Tensor:
        """The reward model's score of each sequence (batch,)."""
        ...

    def sample(self, model: nn.Module, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Prompts followed by a completion sampled from ``model`` (draws from the CPU ``generator``)."""
        ...

    def logprobs(self, model: nn.Module, seqs: torch.Tensor) -> torch.Tensor:
        """Per-token log-probabilities (batch, completion_len) of each sequence's completion under ``model``."""
        ...

    def generation_flops(self, n_params: int) -> int:
        """Forward FLOPs of sampling one completion, as ``sample`` does it, from a model of ``n_params``."""
        ...


# The equivalence margin of held-out accuracy at equal samples (see ``BuiltWorkload.margin``): one percentage point,
# the resolution at which published recipes are compared (and a fifth of mlp:tiny's seed-to-seed spread).
ACCURACY_MARGIN = 0.01


@dataclass
class BuiltWorkload:
    """One built instance of a workload: model, data, loss and evaluation, all seeded."""

    model: nn.Module
    batches: Callable[[int, int], Iterator[Batch]]  # (batch_size, seed) -> endless iterator of training batches
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, targets) -> mean loss
    evaluate: Callable[[nn.Module], dict[str, float]]  # held-out metrics; the harness sets eval()/no_grad
    metric: str  # the key of ``evaluate``'s result that the reports follow, e.g. "accuracy"
    higher_is_better: bool
    batch_size: int  # default samples per optimizer step for this size
    tokens_per_sample: int = 0  # sequence length for language models, 0 otherwise
    lr: float = 1e-3
    lr_warmup_steps: int = 0  # a linear LR warm-up over this many optimizer steps at ``batch_size`` (the loop's
    # ``lr_warmup``; the trial, its quality run and the parity reference all apply it): 0, none, on every size that
    # does not spike without one
    target: float | None = None  # the size's validation target on ``metric`` (documented in the workload)
    quality_steps: int = 0  # the size's quality budget in optimizer steps at ``batch_size`` (what the target is for)
    # The smallest difference of ``metric`` at equal samples that counts: a set whose whole interval lies within
    # +-margin of the reference's is "equivalent" in quality (None: no margin, any difference counts, and quality
    # is never called equivalent). Documented beside the target in each workload.
    margin: float | None = None
    eval_points: int = 10  # evaluations spread over the quality budget (plus one before training)
    dataset: dict[str, Any] = field(default_factory=dict)  # name, source, sha256, n_train, n_eval
    params: dict[str, Any] = field(default_factory=dict)  # the size preset's resolved parameters
    train_data: tuple[torch.Tensor, torch.Tensor] | None = None  # the in-memory training set of a classifier
    # (inputs, labels): techniques that choose which samples to train on (curriculum) draw from it
    source: dict[str, Any] | None = None  # a user's model: {"file" or "module", "function", "sha256"}
    pipeline: Any = None  # a ``bench.core.data.Pipeline``: the training set as a map-style Dataset and the key order
    # ``batches`` follows, for techniques that load batches themselves (``loader``: a DataLoader with workers)
    preference: Preference | None = None  # a preference workload's prompts, pairs, starting policy, gold reward and
    # proxy reward model (the ``Preference`` interface) that preference methods train on; None on every other
    # workload, and the methods refuse to run there
    curve_metrics: tuple[str, ...] = ()  # keys of ``evaluate``'s result recorded beside ``metric`` at every
    # evaluation point (``quality.curve_extra``), e.g. a preference workload's proxy reward and KL
    structure: ModelStructure | None = None  # the model's parts (``bench.core.structure``): its blocks, for the
    # per-block techniques (checkpointing, per-block compile, FSDP), and what the techniques that change, split or
    # scale it ask for. Declared by the workload (the same as ``Workload.structure``), derived from a Hugging Face
    # config, returned by a user's build or inferred; None: not described, and the trial describes the built model
    source_task: Callable[[], SourceTask] | None = None  # builds the pretraining task the model's description
    # declares (``SourceTask``), on demand: reading its data costs seconds; None when the workload provides none
    forward_targets: str | None = None  # the model computes its own loss (nanoGPT, Hugging Face): the keyword its
    # forward takes the targets by; ``loss_fn`` then reads the loss off the whole output (``bench.loop.TrainLoop``)
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None  # the model's own optimizer
    # (parameter groups, betas, weight decay), built on the trainable parameters; None: the default AdamW at ``lr``
    schedule: Callable[[torch.optim.Optimizer], Any] | None = None  # the model's own LR schedule, made on the
    # optimizer and stepped after each optimizer step (an ``LRScheduler``); None: a constant LR


class Workload(abc.ABC):
    """Base class for reference workloads. A subclass sets ``name``, ``summary`` and ``sizes`` (its ``Size``
    dataclass per preset), and implements ``build_from`` (model, data and evaluation from a size's parameters) and
    ``structure_from`` (the model's parts from the same parameters: what the plan checks technique sets against, so a
    technique that needs a part the model lacks is skipped with the part named before any trial starts)."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    sizes: ClassVar[Mapping[str, Size]] = {}
    has_batchnorm: ClassVar[bool] = False
    has_preferences: ClassVar[bool] = False  # builds a ``BuiltWorkload.preference`` (what preference methods need)
    pretrained_start: ClassVar[bool] = False  # the model starts from fixed trained weights whatever the seed (the
    # seed sets the batch order and a method's sampling only)
    default_size: ClassVar[str | None] = None  # the size a label without one gets (None: the sweep's default)
    size_required: ClassVar[bool] = False  # a label must name the size

    def check(self) -> str | None:
        """Why this workload cannot be built here (e.g. its dataset is missing); None when it can."""
        return None

    def size_params(self, size: str) -> dict[str, Any]:
        """The parameters of ``size`` as a plain dict (``Size.params``)."""
        if size not in self.sizes:
            raise WorkloadError(
                f"workload '{self.name}' has no size {shown(size)} (valid sizes: {', '.join(self.sizes)})"
            )
        return self.sizes[size].params()

    def batchnorm(self, size: str) -> bool:
        """Whether the model at ``size`` holds BatchNorm, known without building it."""
        return self.has_batchnorm

    def structure(self, size: str) -> ModelStructure | None:
        """The model's structure at ``size``, known without building it (what the plan checks technique sets
        against; the built model carries the same in ``BuiltWorkload.structure``). None: not described, and the plan
        cannot refuse a technique for a part the model lacks."""
        return self.structure_from(self.size_params(size))

    def forward_targets(self, size: str) -> str | None:
        """The keyword by which the model at ``size`` takes the targets when it computes its own loss, known without
        building it (techniques that compute a loss from its logits are refused before the sweep); None: it does
        not (every built-in workload)."""
        return None

    def structure_from(self, params: dict[str, Any]) -> ModelStructure | None:
        """The structure of the model built from ``params`` (a size's own, or a scaled teacher's)."""
        return None

    def load_data(self, size: str) -> None:
        """Load ``size``'s dataset into this process (decoded, or read from the sweep's dataset cache:
        ``dataset_cache``), so that ``build`` finds it loaded; the trial times it as its own stage. Nothing by
        default: the data then loads in ``build``."""
        return None

    def build(self, size: str, seed: int, device: torch.device) -> BuiltWorkload:
        """Build model, data, loss and evaluation for ``size``, seeded by ``seed``."""
        return self.build_from(self.size_params(size), seed, device)

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        """Build from resolved size parameters: a size's own, or a variant of them (a distillation teacher's wider
        model on the same data). A workload that can only be built by size name keeps this refusal."""
        raise WorkloadError(f"workload '{self.name}' cannot be built from changed size parameters")


_ARTEFACT_DIR: list[Path] = []


def use_artefact_dir(path: Path | str | None) -> None:
    """Where workloads cache what they build once per sweep (a preference workload's starting policy, pairs and
    reward model): the sweep's reference directory, set by the trial and reference processes. None: nowhere (each
    process builds its own, kept in memory)."""
    _ARTEFACT_DIR[:] = [Path(path)] if path is not None else []


def artefact_dir() -> Path | None:
    """The directory ``use_artefact_dir`` set, created on first use, or None."""
    if not _ARTEFACT_DIR:
        return None
    _ARTEFACT_DIR[0].mkdir(parents=True, exist_ok=True)
    return _ARTEFACT_DIR[0]


def dataset_cache() -> Path | None:
    """Where workloads keep their decoded datasets for the sweep's other processes (``bench.core.data.cached_arrays``):
    ``datasets/`` in the artefact directory; None outside a sweep (each process decodes its own)."""
    where = artefact_dir()
    return where / "datasets" if where is not None else None


_REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    """Class decorator: add a workload to the registry. A duplicate name is an error, and so is a size that is not
    a ``Size`` dataclass."""
    untyped = [name for name, size in cls.sizes.items() if not isinstance(size, Size)]
    if untyped:
        raise TypeError(f"workload '{cls.name}': sizes {', '.join(map(repr, untyped))} must be Size dataclasses "
                        "(bench.workloads.base.Size: one frozen dataclass of the size's parameters), not "
                        f"{type(cls.sizes[untyped[0]]).__name__}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"workload name '{cls.name}' is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def forget(name: str) -> None:
    """Remove a registration (a user's model registered again with other options in the same process)."""
    _REGISTRY.pop(name, None)


def registry() -> dict[str, type[Workload]]:
    return dict(_REGISTRY)


def get(name: str) -> Workload:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise WorkloadError(f"unknown workload {shown(name)} (known: {', '.join(sorted(_REGISTRY))})") from None
