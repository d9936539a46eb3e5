"""The workload interface: a model family with size presets, an offline dataset and a held-out metric."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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
    blocks: str | None = "blocks"  # dotted path (``model.get_submodule``) of the nn.ModuleList of repeated blocks
    # that per-block techniques wrap (checkpointing, per-block compile, FSDP); None when the model has none
    source: dict[str, Any] | None = None  # a user's model: {"file" or "module", "function", "sha256"}
    pipeline: Any = None  # a ``bench.core.data.Pipeline``: the training set as a map-style Dataset and the key order
    # ``batches`` follows, for techniques that load batches themselves (``loader``: a DataLoader with workers)
    preference: Any = None  # a preference workload's structure (``bench.workloads.pref.PreferenceTask``: prompts,
    # pairs, the starting policy, the gold reward and the proxy reward model) that preference methods train on;
    # None on every other workload, and the methods refuse to run there
    curve_metrics: tuple[str, ...] = ()  # keys of ``evaluate``'s result recorded beside ``metric`` at every
    # evaluation point (``quality.curve_extra``), e.g. a preference workload's proxy reward and KL
    structure: ModelStructure | None = None  # the model's parts, for the techniques that change, split or scale it
    # (``bench.core.structure``: declared by the workload, derived from a Hugging Face config, returned by a user's build
    # or inferred)
    source_task: Callable[[], SourceTask] | None = None  # builds the pretraining task the model's description
    # declares (``SourceTask``), on demand: reading its data costs seconds; None when the workload provides none


class Workload(abc.ABC):
    """Base class for reference workloads. Subclasses set the class attributes and implement ``build``."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    sizes: ClassVar[dict[str, dict[str, Any]]] = {}
    has_blocks: ClassVar[bool] = True
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
        if size not in self.sizes:
            raise WorkloadError(
                f"workload '{self.name}' has no size {shown(size)} (valid sizes: {', '.join(self.sizes)})"
            )
        return dict(self.sizes[size])

    def traits(self, size: str) -> tuple[str | None, bool]:
        """(the blocks' path or None, has BatchNorm) at ``size``, known without building the model: what the plan
        checks technique sets against."""
        return ("blocks" if self.has_blocks else None), self.has_batchnorm

    def structure(self, size: str) -> ModelStructure | None:
        """The model's structure at ``size``, known without building it (what the plan checks technique sets
        against; the built model carries the same in ``BuiltWorkload.structure``). None: not described."""
        return self.structure_from(self.size_params(size))

    def structure_from(self, params: dict[str, Any]) -> ModelStructure | None:
        """The structure of the model built from ``params`` (a size's own, or a scaled teacher's)."""
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


_REGISTRY: dict[str, type[Workload]] = {}


def register(cls: type[Workload]) -> type[Workload]:
    """Class decorator: add a workload to the registry. A duplicate name is an error."""
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
