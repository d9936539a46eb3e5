"""Build a workload with techniques applied, in-process, the way bench.trial does; each technique's test settings."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Literal

import pytest
import torch

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import Budget, TechniqueSet
from bench.trial import configure


def build_loop(workload: str, label: str, seed: int = 0, size: str = "tiny", budget: Budget | None = None,
               device: torch.device | None = None):
    """(loop, batches iterator, built workload) for ``label`` applied to ``workload`` (tune probes included)."""
    techs = sorted((s.resolve() for s in TechniqueSet.parse(label).specs), key=lambda t: t.phase)
    wl = workloads.get(workload)
    device = device or torch.device("cpu")
    built = wl.build(size, seed, device)
    cfg, ctx, _ = configure(wl, size, built, techs, budget or Budget(), seed, device)
    model = built.model
    for t in techs:
        model = t.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, cfg.lr)
    loop = TrainLoop(model, opt, built.loss_fn, techs, ctx, cfg.micro_batches, built.tokens_per_sample)
    batches = built.batches(cfg.batch_size, seed)
    for t in techs:
        batches = t.wrap_data(batches, ctx)
    return loop, batches, built


def whole_batch_trial(tmp_path, label: str):
    """One 2-rank trial of ``label`` (tp, pp: every rank trains the whole batch) on gpt:tiny through the real runner,
    checked against its baseline: ok, exact parity, and the whole model's parameter count and FLOPs per step (not
    one rank's share, not the world size times them). Returns the record."""
    from bench.plan.config import build_config
    from bench.run.runner import SweepRunner
    from tests.conftest import TINY_BUDGET

    cfg = build_config("smoke", {"workloads": "gpt", "techniques": label, "repeats": 1, "nproc": 2,
                                 "budget": {**TINY_BUDGET, "timeout_s": 180}})
    records = {r.technique_label: r for r in SweepRunner(cfg, tmp_path / "s", torch.device("cpu")).run()}
    r, base = records[label], records["baseline"]
    assert r.status == "ok", r.reason
    assert r.world_size == 2 and r.kind == "exact"
    assert r.parity.ok, (r.parity.loss_rel_diff, r.parity.distance_rel_diff)
    assert r.workload["n_params"] == base.workload["n_params"] == r.build.n_params
    assert r.speed.flops_per_step == base.speed.flops_per_step > 0
    return r


# ---- each technique's test settings ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TechniqueSettings:
    """How the registry-wide tests (tests/test_registry.py) run one technique. Its own test file,
    ``tests/test_<name>.py``, declares them: ``SETTINGS = TechniqueSettings("grad_accum:steps=2", "gpt")``.

    ``runs_on`` says where: "cpu" (two steps in-process in every default run, and the checks that it declares what
    changes its measurement: ``own_flops``, ``hides_tensors``), "gpu" (its ``check`` refuses anything but CUDA: two
    steps under ``-m gpu``) or "torchrun" (a multi-process technique: two steps on 2 gloo ranks, ``-m slow``)."""

    label: str  # the set to run: the technique with its options, and any partner it needs ("bf16+sparse24")
    workload: str  # the workload, at size tiny
    runs_on: Literal["cpu", "gpu", "torchrun"] = "cpu"
    requires: str | None = None  # an optional package it needs: the tests skip, naming it, where it is absent

    def __post_init__(self) -> None:
        if self.runs_on not in ("cpu", "gpu", "torchrun"):
            raise ValueError(f"runs_on must be cpu, gpu or torchrun, got {self.runs_on!r}")

    @property
    def names(self) -> tuple[str, ...]:
        """The technique names of ``label`` as written (the registry is not asked: a planted test technique may be
        unregistered when its settings are read)."""
        return tuple(part.split(":", 1)[0].strip() for part in self.label.split("+"))


def settings_of(name: str) -> TechniqueSettings | str:
    """The ``SETTINGS`` technique ``name``'s test file declares, or (a string) what to add where it declares none."""
    module_name = f"tests.test_{name}"
    example = f'SETTINGS = TechniqueSettings("{name}", "mlp")  (from tests.helpers; a label with options and the tiny ' \
              'workload it runs on, runs_on="gpu" or "torchrun" where it needs them)'
    try:
        module = _test_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return f"{name}: no test file: add tests/test_{name}.py (its tests) with {example}"
    settings = getattr(module, "SETTINGS", None)
    if not isinstance(settings, TechniqueSettings):
        return f"{name}: tests/test_{name}.py declares no settings: add {example}"
    if name not in settings.names:
        return f"{name}: the SETTINGS of tests/test_{name}.py run {settings.label!r}, which does not hold {name}"
    return settings


def _test_module(module_name: str) -> types.ModuleType:
    """The test module, imported as pytest imports it. A file that skips itself at import (``importorskip`` of an
    optional package) is run up to the skip in a module of its own, for the settings it declared above it."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    try:
        return importlib.import_module(module_name)
    except pytest.skip.Exception:
        spec = importlib.util.find_spec(module_name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except pytest.skip.Exception:
            pass
        return module
