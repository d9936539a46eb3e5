"""A user's own model as a workload: ``--model my_model.py:build`` (the protocol is in docs/models.md).

``build`` takes any of ``size``, ``seed``, ``device`` (by name) and returns a ``ModelSpec`` or a dict with the same
keys. The harness seeds torch, ``random`` and numpy with the trial's seed before calling it.

Each ``--model`` becomes a workload class registered under its name (``NAME=`` before the source, else the
function's name when it is not ``build``, else the file's stem). The process that plans the sweep checks every
(model, size) once in a child process (``python -m bench.plan.user_models``): it builds the model, trains one step
and evaluates once, so a protocol violation is one line and exit 2 before any trial runs, and the size's facts
(batch, LR, budget, BatchNorm, and the model's structure: its blocks and the other parts techniques ask for) are
known to the plan without building the model beside it. Trial processes register the same sources from their spec
and build the model themselves.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bench.core.data import Pipeline, classifier_pipeline, dataset_pipeline
from bench.core.files import REPO_DIR
from bench.core.structure import ModelStructure, find_blocks, infer
from bench.core.text import shown
from bench.plan.plugins import (
    Origin,
    Plugin,
    PluginError,
    digest,
    is_file_source,
    load_attr,
    load_entry_points,
    register_technique,
    register_workload_class,
    resolve,
    search_path,
    split_source,
    use_path,
)
from bench.workloads.base import Batch, BuiltWorkload, Workload, forget, registry
from bench.workloads.mlp_mnist1d import shuffled_batches
from techniques.base import logits_of

PARAMETERS = ("size", "seed", "device")
DEFAULT_SIZE = "default"  # a build without a ``size`` parameter (or without a default for it) has this one size
CHECK_TIMEOUT_S = 600.0


@dataclass
class ModelSpec:
    """What a user's ``build`` returns (a dict with these keys works as well)."""

    model: nn.Module
    train_data: Any  # (inputs, targets) tensors | a torch Dataset of (input, target) | batches(batch_size, seed)
    loss: Callable[[Any, Any], torch.Tensor] | None  # (model output, targets) -> scalar mean loss; None with
    # forward_targets: the loss the forward returns (a tuple's one scalar tensor, a dict's or an output's ``loss``)
    evaluate: Callable[[nn.Module], dict[str, float]]  # held-out metrics; called under eval() and no_grad()
    metric: str  # the key of ``evaluate``'s result the reports follow
    higher_is_better: bool
    batch_size: int = 32  # samples per optimizer step
    lr: float = 1e-3  # AdamW's learning rate
    target: float | None = None  # a validation target on ``metric``: time-to-target is measured when given
    margin: float | None = None  # the smallest difference of ``metric`` that counts (quality "equivalent" within it)
    quality_steps: int | None = None  # quality run in optimizer steps at ``batch_size`` (default: one epoch)
    eval_points: int = 10  # evaluations over the quality run
    tokens_per_sample: int = 0  # sequence length for language models
    blocks: str | None = None  # dotted path of the nn.ModuleList of repeated blocks (default: found, see find_blocks)
    structure: ModelStructure | dict[str, Any] | None = None  # the model's parts (bench.core.structure; default: inferred)
    teacher_size: str | None = None  # another size of this build that distill may train as the teacher
    forward_targets: str | None = None  # the model computes its own loss: its forward's parameter for the targets
    # (nanoGPT's "targets", Hugging Face's "labels"); the harness calls model(inputs, **{forward_targets: targets})
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None  # your optimizer, made from the
    # trainable parameters (weight-decay groups, betas); default: AdamW at ``lr``
    schedule: Callable[[torch.optim.Optimizer], Any] | None = None  # your LR schedule, made on the optimizer and
    # stepped after every optimizer step (a torch LRScheduler); default: a constant LR


REQUIRED = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.default is dataclasses.MISSING)
OWN_LOSS = "docs/models.md, Models that compute their own loss"
OPTIONAL = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.default is not dataclasses.MISSING)


# ---- blocks -----------------------------------------------------------------------------------------------------


def check_blocks(model: nn.Module, path: str, where: str) -> str:
    try:
        found = model.get_submodule(path)
    except AttributeError:
        raise PluginError(f"{where}: blocks {shown(path)} is not a submodule of the model (give the dotted path of "
                          "an nn.ModuleList, e.g. encoder.layers)") from None
    if not isinstance(found, nn.ModuleList | nn.Sequential):
        raise PluginError(f"{where}: blocks {shown(path)} is a {type(found).__name__}, not an nn.ModuleList or "
                          "nn.Sequential of blocks")
    return path


# ---- the workload ----------------------------------------------------------------------------------------------


class UserWorkload(Workload):
    """Base of the classes ``register_model`` creates, one per ``--model``."""

    plugin: ClassVar[Plugin]
    function: ClassVar[Callable[..., Any]]
    origin: ClassVar[Origin]
    default_size: ClassVar[str | None] = DEFAULT_SIZE  # None: build's size has no default, labels must name one
    facts: ClassVar[dict[str, dict[str, Any]]]  # per size, from the check process (planning process only)
    check_device: ClassVar[str] = "auto"  # the sweep's device, where the check builds and steps the model

    @property
    def where(self) -> str:
        return f"--model {self.origin.source}"

    def size_params(self, size: str) -> dict[str, Any]:
        """The size's facts, checked in a child process the first time they are asked for."""
        if size not in self.facts:
            self._check_size_name(size)
            type(self).facts[size] = run_check(self.plugin, size, self.check_device)
        return dict(self.facts[size])

    def batchnorm(self, size: str) -> bool:
        return bool(self.size_params(size)["has_batchnorm"])

    def structure(self, size: str) -> ModelStructure | None:
        found = self.size_params(size).get("structure")
        return ModelStructure.from_dict(found) if found is not None else None

    def _accepted(self) -> set[str]:
        """The parameters ``build`` takes by name (all three when it takes ``**kwargs``)."""
        params = inspect.signature(self.function).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return set(PARAMETERS)
        return set(params) & set(PARAMETERS)

    def _check_size_name(self, size: str) -> None:
        if "size" not in self._accepted() and size != DEFAULT_SIZE:
            raise PluginError(f"{self.where}: {self.origin.attr}() takes no size parameter, so its only size is "
                              f"'{DEFAULT_SIZE}'; got {shown(size)} (write {self.name} without a size)")

    def build(self, size: str, seed: int, device: torch.device) -> BuiltWorkload:
        self._check_size_name(size)
        _seed_everything(seed)
        kwargs = {"size": size, "seed": seed, "device": device}
        accepted = self._accepted()
        try:
            raw = self.function(**{k: v for k, v in kwargs.items() if k in accepted})
        except Exception as exc:
            raise PluginError(f"{self.where}: {self.origin.attr}(size={size!r}, seed={seed}) raised "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
        spec = validate(raw, self.where)
        model = spec.model.to(device)
        lr = spec.lr if spec.optimizer is None else _optimizer_lr(spec.optimizer, model, self.where)
        named = spec.blocks or self.plugin.blocks
        blocks = check_blocks(model, named, self.where) if named else find_blocks(model)
        batches, n_train = _batches_of(spec.train_data, self.where)
        structure = _structure_of(spec, model, blocks, self.where, named=named is not None)
        steps = spec.quality_steps if spec.quality_steps is not None else (n_train or 0) // spec.batch_size
        return BuiltWorkload(
            model=model,
            batches=batches,
            loss_fn=spec.loss if spec.loss is not None else returned_loss,
            evaluate=spec.evaluate,
            metric=spec.metric,
            higher_is_better=spec.higher_is_better,
            batch_size=spec.batch_size,
            tokens_per_sample=spec.tokens_per_sample,
            lr=lr,
            target=spec.target,
            margin=spec.margin,
            quality_steps=steps,
            eval_points=spec.eval_points,
            # The model's file defines its data: its digest stands for the dataset (a parity reference computed
            # with another version of the file is refused).
            dataset={"name": f"{self.name} (user model)", "source": self.origin.source,
                     "sha256": self.origin.sha256, "n_train": n_train},
            params={"size": size},
            train_data=spec.train_data if isinstance(spec.train_data, tuple) else None,
            pipeline=_pipeline_of(spec.train_data),
            source=self.origin.record(),
            structure=structure,
            forward_targets=spec.forward_targets,
            optimizer=spec.optimizer,
            schedule=spec.schedule,
        )

    def forward_targets(self, size: str) -> str | None:
        return self.size_params(size).get("forward_targets")


def _structure_of(spec: ModelSpec, model: nn.Module, blocks: str | None, where: str, named: bool = False
                  ) -> ModelStructure:
    """The structure build returned (its blocks defaulting to ``blocks``: named by build's ``blocks`` or
    ``--blocks`` when ``named``, else found), else the inferred one; with build's ``teacher_size``. The model's one
    description: its blocks are what the per-block techniques wrap."""
    if spec.structure is None:
        structure = infer(model, blocks)
    else:
        try:
            structure = ModelStructure.from_dict(spec.structure)
        except ValueError as exc:
            raise PluginError(f"{where}: {exc} (docs/models.md, Structure)") from None
        if named and structure.blocks is not None and structure.blocks != blocks:
            raise PluginError(f"{where}: blocks {shown(blocks)} and the returned structure's blocks "
                              f"{shown(structure.blocks)} differ; name the blocks once (docs/models.md, Blocks)")
        if structure.blocks is None and blocks:
            structure = dataclasses.replace(structure, blocks=blocks, n_blocks=len(model.get_submodule(blocks)))
        structure = dataclasses.replace(structure, source=structure.source or "returned by build")
        for path in filter(None, (structure.blocks, structure.embedding, structure.position_embedding,
                                  *structure.pre_blocks, structure.final_norm, structure.head)):
            try:
                model.get_submodule(path)
            except AttributeError:
                raise PluginError(f"{where}: structure names {shown(path)}, which is not a submodule of the "
                                  "model") from None
        if structure.scaling is not None:
            raise PluginError(f"{where}: structure.scaling cannot be used for a build called by size name; return "
                              "teacher_size (another size of this build) for a teacher instead")
    if spec.teacher_size is not None:
        structure = dataclasses.replace(structure, teacher_size=spec.teacher_size)
    return structure


def _optimizer_lr(factory: Callable[..., Any], model: nn.Module, where: str) -> float:
    """The largest group LR of the optimizer ``factory`` makes for the model: the LR the workload trains at, which a
    technique that picks the LR (lr_finder) scales. Made once on the model's parameters and dropped (an optimizer
    holds no state before its first step)."""
    try:
        optimizer = factory([p for p in model.parameters() if p.requires_grad])
    except Exception as exc:
        raise PluginError(f"{where}: optimizer(parameters) raised {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PluginError(f"{where}: optimizer(parameters) must return a torch.optim.Optimizer; it returned "
                          f"{type(optimizer).__name__}")
    lrs = [float(g["lr"]) for g in optimizer.param_groups]
    if not lrs or not all(_is_number(x) and x > 0 for x in lrs):
        raise PluginError(f"{where}: the optimizer's parameter groups must each have an LR > 0; got {lrs}")
    return max(lrs)


def returned_loss(out: Any, targets: Any = None) -> torch.Tensor:
    """The loss a model that computes its own returned: itself when it returned only a scalar, a dict's (or
    Hugging Face output's) ``loss``, or the one scalar tensor of a tuple (nanoGPT's ``(logits, loss)``)."""
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return out
    if isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):
        return out["loss"]
    if isinstance(getattr(out, "loss", None), torch.Tensor):
        return out.loss
    if isinstance(out, tuple | list):
        scalars = [t for t in out if isinstance(t, torch.Tensor) and t.dim() == 0]
        if len(scalars) == 1:
            return scalars[0]
    raise TypeError(f"the forward returned {described(out)}, with no loss to take (a scalar tensor alone, one in a "
                    "tuple, or a dict's or an output's 'loss')")


def described(value: Any, depth: int = 0) -> str:
    """What a model returned, in a user's terms: ``a tuple (tensor [16, 1, 65], None)``."""
    if isinstance(value, torch.Tensor):
        return f"tensor {list(value.shape)}" if value.dim() else "a scalar tensor"
    if value is None:
        return "None"
    if isinstance(value, tuple | list) and depth < 1:
        inner = ", ".join(described(v, depth + 1) for v in list(value)[:4]) + (", ..." if len(value) > 4 else "")
        return f"a {type(value).__name__} ({inner})"
    if isinstance(value, Mapping) and depth < 1:
        inner = ", ".join(f"{k}: {described(v, depth + 1)}" for k, v in list(value.items())[:4])
        return f"a {type(value).__name__} {{{inner}}}"
    return f"a {type(value).__name__}"


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def validate(raw: Any, where: str) -> ModelSpec:
    """The returned spec, checked key by key: one error line naming what is wrong and what is expected."""
    if isinstance(raw, ModelSpec):
        values = {f.name: getattr(raw, f.name) for f in dataclasses.fields(ModelSpec)}
    elif isinstance(raw, dict):
        values = dict(raw)
    else:
        raise PluginError(f"{where}: build returned a {type(raw).__name__}; it must return a dict or a "
                          f"bench.plan.user_models.ModelSpec with keys {', '.join(REQUIRED)}")
    unknown = sorted(set(values) - set(REQUIRED) - set(OPTIONAL), key=str)
    if unknown:
        raise PluginError(f"{where}: build returned unknown key(s) {', '.join(shown(k) for k in unknown)} "
                          f"(valid: {', '.join(REQUIRED + OPTIONAL)})")
    if "loss" not in values and values.get("forward_targets"):
        values["loss"] = None  # the loss the forward returns
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise PluginError(f"{where}: build's result lacks {', '.join(missing)} (required: {', '.join(REQUIRED)})")
    v = values
    _expect(isinstance(v["model"], nn.Module), where, "model", "an nn.Module", v["model"])
    _expect(v.get("forward_targets") is None or (isinstance(v["forward_targets"], str) and
                                                  v["forward_targets"].isidentifier()), where, "forward_targets",
            "the name of the forward's parameter that takes the targets (e.g. 'targets', 'labels'), or None",
            v.get("forward_targets"))
    _expect(callable(v["loss"]) or (v["loss"] is None and v.get("forward_targets")), where, "loss",
            "a function (output, targets) -> scalar loss (or None with forward_targets: the loss the forward "
            "returns)", v["loss"])
    for key, what in (("optimizer", "a function (parameters) -> torch.optim.Optimizer, or None"),
                      ("schedule", "a function (optimizer) -> an LR scheduler stepped once per optimizer step, "
                                      "or None")):
        _expect(v.get(key) is None or callable(v[key]), where, key, what, v.get(key))
    _expect(callable(v["evaluate"]), where, "evaluate", "a function (model) -> dict of metrics", v["evaluate"])
    _expect(isinstance(v["metric"], str) and v["metric"] != "", where, "metric", "the name of a key of evaluate's "
            "result", v["metric"])
    _expect(isinstance(v["higher_is_better"], bool), where, "higher_is_better", "True or False",
            v["higher_is_better"])
    spec = ModelSpec(**values)
    _expect(_is_int(spec.batch_size) and spec.batch_size >= 1, where, "batch_size", "a whole number >= 1",
            spec.batch_size)
    _expect(_is_number(spec.lr) and spec.lr > 0, where, "lr", "a number > 0", spec.lr)
    _expect(spec.target is None or _is_number(spec.target), where, "target", "a number or None", spec.target)
    _expect(spec.margin is None or (_is_number(spec.margin) and spec.margin > 0), where, "margin",
            "a number > 0 or None", spec.margin)
    _expect(spec.quality_steps is None or (_is_int(spec.quality_steps) and spec.quality_steps >= 0), where,
            "quality_steps", "a whole number >= 0 or None", spec.quality_steps)
    _expect(_is_int(spec.eval_points) and spec.eval_points >= 1, where, "eval_points", "a whole number >= 1",
            spec.eval_points)
    _expect(_is_int(spec.tokens_per_sample) and spec.tokens_per_sample >= 0, where, "tokens_per_sample",
            "a whole number >= 0", spec.tokens_per_sample)
    _expect(spec.blocks is None or isinstance(spec.blocks, str), where, "blocks", "a dotted path such as "
            "'encoder.layers', or None", spec.blocks)
    _expect(spec.teacher_size is None or isinstance(spec.teacher_size, str), where, "teacher_size", "a size name of "
            "this build, or None", spec.teacher_size)
    return spec


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _expect(ok: bool, where: str, key: str, expected: str, got: Any) -> None:
    if not ok:
        raise PluginError(f"{where}: {key} must be {expected}; got {shown(got, 40)} ({type(got).__name__})")


def _batches_of(data: Any, where: str) -> tuple[Callable[[int, int], Iterator[Batch]], int | None]:
    """(batch function, training-set size or None) for each form of ``train_data``."""
    if isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y):
            raise PluginError(f"{where}: train_data's inputs and targets differ in length ({len(x)} and {len(y)})")
        return (lambda batch_size, seed: shuffled_batches(x, y, batch_size, seed)), len(x)
    if isinstance(data, torch.utils.data.IterableDataset):
        raise PluginError(f"{where}: train_data is an IterableDataset, which the harness cannot shuffle by seed; give "
                          "a map-style Dataset, tensors, or a function batches(batch_size, seed)")
    if isinstance(data, torch.utils.data.Dataset):
        n = len(data)

        def batches(batch_size: int, seed: int) -> Iterator[Batch]:
            if batch_size > n:
                raise ValueError(f"batch_size {batch_size} is larger than the Dataset ({n} items)")
            return _dataset_batches(data, batch_size, seed)

        return batches, n
    if callable(data):
        return data, None
    raise PluginError(f"{where}: train_data must be (inputs, targets) tensors, a torch Dataset of (input, target) "
                      f"items, or a function batches(batch_size, seed) returning an iterator; got "
                      f"{type(data).__name__}")


def _pipeline_of(data: Any) -> Pipeline | None:
    """The training set as a ``bench.core.data.Pipeline`` whose batches equal ``_batches_of``'s (for ``loader``); None
    for a batches function, whose samples the harness cannot address one by one. Call after ``_batches_of``."""
    if isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        return classifier_pipeline(data[0], data[1])
    if isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset):
        return dataset_pipeline(data)
    return None


def _dataset_batches(data: torch.utils.data.Dataset, batch_size: int, seed: int) -> Iterator[Batch]:
    """Shuffled, seeded batches of a Dataset, epoch after epoch (an incomplete last batch is dropped)."""
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))
    while True:
        for batch in loader:
            yield tuple(batch)


# ---- registering ------------------------------------------------------------------------------------------------


def parse_model(text: str, blocks: str | None = None) -> Plugin:
    """``[NAME=]PATH.py:FUNCTION`` (or ``package.module:FUNCTION``) -> a model plugin with an absolute source."""
    name, sep, source = str(text).strip().partition("=")
    if not sep:
        name, source = "", text
    source = resolve(source, "--model")
    where, attr = split_source(source, "--model")
    if not name:
        module = os.path.splitext(os.path.basename(where))[0] if is_file_source(where) else where.split(".")[-1]
        name = attr if attr != "build" else module
    if not name or any(c in name for c in ":/+,= ") or name != name.strip():
        raise PluginError(f"--model {shown(text)}: {shown(name)} cannot be a workload name (no ':/+,= ' in it; "
                          "write NAME=PATH.py:FUNCTION)")
    return Plugin("model", source, name=name, blocks=blocks, path=search_path(source))


def register_model(plugin: Plugin, check_device: str = "auto") -> type[UserWorkload]:
    """The workload class of a model plugin, registered under its name: again the same class while the plugin and
    its file are unchanged. An earlier user model of that name (another file, an edited one, other options: a
    notebook's next sweep) is replaced; a built-in or installed workload of that name is an error."""
    use_path(plugin)
    known = registry().get(plugin.name or "")
    if known is not None and issubclass(known, UserWorkload):
        if known.plugin == plugin and known.origin.sha256 == digest(plugin.source):
            known.check_device = check_device
            return known
        forget(plugin.name or "")
    function, origin = load_attr(plugin.source, "--model")
    where = f"--model {plugin.source}"
    if not callable(function):
        raise PluginError(f"{where}: {origin.attr} is a {type(function).__name__}, not a function")
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        raise PluginError(f"{where}: {origin.attr} has no inspectable signature; give a Python function") from None
    extra = [n for n, p in params.items() if n not in PARAMETERS and p.default is inspect.Parameter.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if extra:
        raise PluginError(f"{where}: {origin.attr}() may take only {', '.join(PARAMETERS)} (by name); it requires "
                          f"{', '.join(extra)}")
    # A size parameter without a default: every label must name its size (the config says so in one line).
    size_default = params["size"].default if "size" in params else DEFAULT_SIZE
    default_size = size_default if isinstance(size_default, str) else None
    cls = type(f"UserModel_{plugin.name}", (UserWorkload,), {
        "name": plugin.name,
        "summary": f"your model: {origin.source}",
        "plugin": plugin,
        "function": staticmethod(function),
        "origin": origin,
        "default_size": default_size,
        "size_required": default_size is None,
        "facts": {},
        "check_device": check_device,
    })
    register_workload_class(cls, origin.source)
    return cls


def load_plugins(items: list[dict[str, Any]] | tuple[Plugin, ...]) -> None:
    """In a child process: the installed plugins, then the sources the sweep was planned with (users' models and
    techniques), so it registers them exactly as the process that planned the sweep did."""
    load_entry_points()
    for item in items:
        plugin = item if isinstance(item, Plugin) else Plugin(**item)
        use_path(plugin)
        if plugin.kind == "technique":
            register_technique(plugin.source)
        elif plugin.kind == "model":
            register_model(plugin)
        else:
            raise PluginError(f"unknown plugin kind {shown(plugin.kind)} (model, technique)")


# ---- the check, in a child process --------------------------------------------------------------------------


def run_check(plugin: Plugin, size: str, device: str = "auto") -> dict[str, Any]:
    """Build ``plugin`` at ``size`` in a child process, train one step and evaluate once; its facts, or the one-line
    error (exit 2) as a PluginError."""
    cmd = [sys.executable, "-m", "bench.plan.user_models", json.dumps(plugin.to_dict()), size, device]
    try:
        # In the harness's directory, as trial processes run: the check fails exactly when they would.
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=REPO_DIR,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        raise PluginError(f"--model {plugin.source}: checking size {shown(size)} (build, one step, one evaluation) "
                          f"took over {CHECK_TIMEOUT_S:.0f} s") from None
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 2 and lines and lines[-1].startswith("error: "):
        raise PluginError(lines[-1].removeprefix("error: "))
    if proc.returncode != 0:
        tail = " | ".join(lines[-3:])[-500:]
        raise PluginError(f"--model {plugin.source}: checking size {shown(size)} crashed (exit {proc.returncode}): "
                          f"{tail}")
    out = proc.stdout.strip().splitlines()
    try:
        return json.loads(out[-1])
    except (IndexError, json.JSONDecodeError):
        raise PluginError(f"--model {plugin.source}: checking size {shown(size)} ended without its result (did the "
                          "model's code exit the process or print to stdout last?)") from None


def check(plugin: Plugin, size: str, device: torch.device) -> dict[str, Any]:
    """Build the model, train one step on one batch, evaluate once; the facts the plan needs."""
    wl = register_model(plugin)()
    where = wl.where
    built = wl.build(size, 0, device)
    try:
        it = built.batches(built.batch_size, 0)
        if iter(it) is not it:
            raise PluginError(f"{where}: train_data(batch_size, seed) returned a {type(it).__name__}; it must return "
                              "an iterator (write it as a generator: yield each batch)")
        batch = next(it)
        small = next(built.batches(2, 1))  # techniques split and resize the batch: the size must be honoured
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"{where}: drawing a training batch raised {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise PluginError(f"{where}: a training batch must be a pair (inputs, targets); got "
                          f"{type(batch).__name__}{f' of {len(batch)}' if isinstance(batch, tuple | list) else ''}")
    sizes = [len(b[0]) if isinstance(b, tuple | list) and b and hasattr(b[0], "__len__") else None
             for b in (batch, small)]
    if sizes != [built.batch_size, 2]:
        raise PluginError(f"{where}: train_data gave batches of {sizes[0]} and {sizes[1]} samples when asked for "
                          f"{built.batch_size} and 2; it must honour batch_size (techniques split and resize it)")
    x, y = (t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)
    model = built.model.train()
    loss = _first_loss(built, model, x, y, where)
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
        what = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise PluginError(f"{where}: loss returned {what}; it must return a scalar floating-point tensor (the mean "
                          "loss of the batch)")
    if not loss.requires_grad:
        raise PluginError(f"{where}: the loss does not depend on the model's parameters (no gradient); return the "
                          "loss computed from the model's output")
    loss.backward()
    model.eval()
    try:
        with torch.no_grad():
            metrics = built.evaluate(model)
    except Exception as exc:
        raise PluginError(f"{where}: evaluate(model) raised {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from None
    if not isinstance(metrics, dict) or built.metric not in metrics:
        keys = ", ".join(map(str, metrics)) if isinstance(metrics, dict) else type(metrics).__name__
        raise PluginError(f"{where}: evaluate(model) must return a dict holding the metric {shown(built.metric)}; "
                          f"it returned {keys or 'an empty dict'}")
    bad = [k for k, v in metrics.items() if not _is_number(_as_float(v))]
    if bad:
        raise PluginError(f"{where}: evaluate(model)'s values must be finite numbers; {', '.join(map(str, bad))} "
                          f"is not ({shown(metrics[bad[0]], 40)})")
    batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    blocks = built.structure.blocks if built.structure is not None else None
    return {
        "batch_size": built.batch_size, "lr": built.lr, "target": built.target, "quality_steps": built.quality_steps,
        "eval_points": built.eval_points, "tokens_per_sample": built.tokens_per_sample, "metric": built.metric,
        "higher_is_better": built.higher_is_better, "has_batchnorm": batchnorm,
        "n_params": sum(p.numel() for p in model.parameters()), "sha256": wl.origin.sha256,
        "block_types": dict(Counter(type(b).__name__ for b in model.get_submodule(blocks))) if blocks else {},
        "structure": built.structure.to_dict() if built.structure is not None else None,
        "forward_targets": built.forward_targets, "optimizer": built.optimizer is not None,
        "schedule": built.schedule is not None,
    }


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def _forward_parameters(model: nn.Module) -> list[str]:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return []


TARGET_NAMES = ("targets", "labels", "target", "label", "y")  # what a forward calls the targets it computes a loss of


def _first_loss(built: BuiltWorkload, model: nn.Module, x: Any, y: Any, where: str) -> torch.Tensor:
    """The loss of one training batch, computed as the loop computes it; a failure is one line in the user's terms:
    what the forward returned, what the loss expected, and what to change."""
    kw = built.forward_targets
    params = _forward_parameters(model)
    if kw:
        if kw not in params and not any(p.startswith("**") for p in params) and "kwargs" not in params:
            raise PluginError(f"{where}: forward_targets={kw!r}, but the model's forward takes "
                              f"({', '.join(params)}): name the parameter that takes the targets ({OWN_LOSS})")
        try:
            out = model(x, **{kw: y})
        except Exception as exc:
            raise PluginError(f"{where}: the forward with the targets, model(inputs, {kw}=targets), raised "
                              f"{_said(exc)} (inputs {described(x)}, targets {described(y)})") from None
        try:
            return built.loss_fn(out, y)
        except Exception as exc:
            raise PluginError(f"{where}: taking the loss from the forward's output raised {_said(exc)}; the forward "
                              f"with {kw}=targets returned {described(out)}: return its loss as a scalar tensor "
                              f"(alone, in a tuple, or as 'loss' in a dict or output), or give loss=(output, "
                              f"targets) -> the loss to pick it ({OWN_LOSS})") from None
    try:
        out = model(x)
    except Exception as exc:
        named = next((p for p in params[1:] if p in TARGET_NAMES), None)
        hint = (f"; if the forward needs the targets ({named!r}) to compute its own loss, return "
                f"forward_targets={named!r} from build ({OWN_LOSS})") if named else ""
        raise PluginError(f"{where}: the forward pass on a training batch raised {_said(exc)} (inputs "
                          f"{described(x)}){hint}") from None
    try:
        return built.loss_fn(logits_of(out), y)
    except Exception as exc:
        named = next((p for p in params[1:] if p in TARGET_NAMES), None)
        if named:
            hint = (f"; the forward takes {named!r}: if the model computes its own loss, return "
                    f"forward_targets={named!r} from build, and the harness calls model(inputs, {named}=targets) "
                    f"and takes the loss it returns ({OWN_LOSS})")
        elif isinstance(out, tuple | list | Mapping):
            hint = "; loss receives the forward's whole output: take the logits from it (out[0], out['logits'])"
        else:
            hint = ""
        raise PluginError(f"{where}: loss(output, targets) raised {_said(exc)}; the forward, called without "
                          f"targets, returned {described(out)} and the targets are {described(y)}{hint}") from None


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python -m bench.plan.user_models PLUGIN_JSON SIZE DEVICE", file=sys.stderr)
        return 2
    # this module under its own name (run as __main__ it is a second copy)
    from bench.plan import plugins
    from bench.plan import user_models as user

    device = torch.device("cuda" if argv[2] == "auto" and torch.cuda.is_available() else
                          "cpu" if argv[2] == "auto" else argv[2])
    try:
        plugins.load_entry_points()
        facts = user.check(Plugin(**json.loads(argv[0])), argv[1], device)
    except PluginError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
