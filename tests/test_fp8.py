"""fp8: the reasons it is skipped (no CUDA 8.9+ device, no torchao), the layer swap checked on CPU through torchao's
float8 emulation, and, on a GPU with fp8 tensor cores, real training steps."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import bench.plan.planner
import techniques.fp8  # noqa: F401  (registers "fp8")
from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import Budget, ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import incompatibility
from bench.trial import configure
from techniques._model import TORCHAO_MISSING
from techniques.base import Context
from techniques.fp8 import FP8, apply_float8, count_float8, float8_targets
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("bf16+fp8", "gpt", runs_on="gpu", requires="torchao")

pytest.importorskip("torchao", reason="optional extra trainbench[torchao] is not installed")

CPU = torch.device("cpu")
WITH_TORCHAO = frozenset({"torchao"})
CPU_REASON = "fp8 training needs a CUDA GPU with compute capability 8.9+ (Ada, Hopper); this device is cpu"


def test_check_on_cpu_names_the_gpu_it_needs():
    assert FP8().check(Context(device=CPU, available_packages=WITH_TORCHAO)) == CPU_REASON
    assert incompatibility(TechniqueSet.parse("fp8"), WorkloadSpec("gpt"), CPU, 1) == f"fp8: {CPU_REASON}"
    with pytest.raises(RuntimeError, match="compute capability 8.9"):
        FP8().transform_model(nn.Sequential(nn.Linear(16, 16)), Context(device=CPU))


def test_torchao_missing_comes_first(monkeypatch):
    assert FP8().check(Context(device=CPU)) == TORCHAO_MISSING
    monkeypatch.setattr(bench.plan.planner, "available_packages", lambda: frozenset())  # as if it were not installed
    assert incompatibility(TechniqueSet.parse("fp8"), WorkloadSpec("gpt"), CPU, 1) == f"fp8: {TORCHAO_MISSING}"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_swap_takes_the_linears_with_dims_of_16_and_leaves_the_tied_head(recipe):
    """torchao's emulation (fp8 casts around an ordinary matmul) runs the converted GPT on a CPU."""
    built = workloads.get("gpt").build("tiny", 0, CPU)
    model = built.model
    targets, left = apply_float8(model, recipe, emulate=True)
    assert len(targets) == count_float8(model) == 4 * built.params["n_layer"]
    assert left.keys() == {"head"} and "wte" in left["head"]
    assert type(model.head) is nn.Linear and model.head.weight is model.wte.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = built.batches(4, 0)
    for _ in range(2):
        x, y = next(batches)
        loss = built.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert math.isfinite(float(loss.detach()))


def test_layers_whose_dims_are_not_multiples_of_16_stay_in_high_precision():
    model = workloads.get("mlp").build("tiny", 0, CPU).model  # 40 -> 256 -> 256 -> 256 -> 10
    targets, left = float8_targets(model, "tensorwise", "dims16")
    assert targets == ["blocks.1.fc", "blocks.2.fc"]
    assert left.keys() == {"blocks.0.fc", "head"} and "multiples of 16" in left["head"]
    big = nn.Sequential(nn.Linear(4096, 2048), nn.Linear(1024, 1024))
    assert float8_targets(big, "tensorwise", "auto")[0] == ["0"]  # torchao's size thresholds (K <= 4096, N <= 1024)
    with pytest.raises(ValueError, match="no nn.Linear layer to convert"):
        apply_float8(workloads.get("gpt").build("tiny", 0, CPU).model, "tensorwise", "auto", emulate=True)


@pytest.mark.parametrize("label,match", [("fp8:recipe=blockwise", "tensorwise, rowwise"),
                                         ("fp8:filter=all", "dims16, auto")])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_declared_traits():
    assert FP8.kind.value == "numeric" and FP8.compute_dtype is None and not FP8.own_flops
    assert {"qat", "sparse24", "prune", "tp"} <= FP8.conflicts and "bf16" not in FP8.conflicts


def cuda_loop(workload: str, label: str, size: str = "tiny"):
    """build_loop on the GPU: the workload with ``label`` applied, its loop and batches."""
    device = torch.device("cuda")
    techs = sorted((s.resolve() for s in TechniqueSet.parse(label).specs), key=lambda t: t.phase)
    wl = workloads.get(workload)
    built = wl.build(size, 0, device)
    cfg, ctx, _ = configure(wl, size, built, techs, Budget(), 0, device)
    model = built.model
    for t in techs:
        model = t.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, cfg.lr)
    return TrainLoop(model, opt, built.loss_fn, techs, ctx, cfg.micro_batches, built.tokens_per_sample), \
        built.batches(cfg.batch_size, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("label", ["fp8", "bf16+fp8", "bf16+fp8:recipe=rowwise"])
def test_fp8_trains_on_a_gpu_with_fp8_tensor_cores(label):
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 9):
        pytest.skip("no fp8 tensor cores on this GPU (needs compute capability 8.9+)")
    assert FP8().check(Context(device=device, available_packages=WITH_TORCHAO)) is None
    loop, batches = cuda_loop("gpt", label)
    assert count_float8(loop.model) == 8
    losses = [float(loop.step(next(batches))) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    tech = next(t for t in loop.techniques if t.name == "fp8")
    assert tech.results(loop.ctx)["float8_layers"] == 8
