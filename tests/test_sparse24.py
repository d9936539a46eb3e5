"""sparse24: the reasons it is skipped (no CUDA 8.0+ device, no torchao, no 16-bit autocast), which layers it takes,
its fp32-master-weight forward checked on CPU with PyTorch's reference 2:4 pruning standing in for the CUDA kernel,
and, on an Ampere or newer GPU, real training steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bench.plan.planner
import techniques.sparse24  # noqa: F401  (registers "sparse24")
from bench import workloads
from bench.plan.config import ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import incompatibility
from bench.workloads import gpt_chars
from techniques import sparse24
from techniques._model import TORCHAO_MISSING
from techniques.base import Context
from techniques.sparse24 import Sparse24, apply_sparse24, semi_sparse_linear_class, sparse24_targets
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("bf16+sparse24:layers=all", "mlp", runs_on="gpu", requires="torchao")

pytest.importorskip("torchao", reason="optional extra trainbench[torchao] is not installed")

CPU = torch.device("cpu")
WITH_TORCHAO = frozenset({"torchao"})
CPU_REASON = "2:4 sparse kernels need a CUDA GPU with compute capability 8.0+ (Ampere or newer); this device is cpu"
GPT128 = gpt_chars.GPTConfig(vocab_size=11, seq_len=8, n_layer=2, n_head=2, d_model=128)


def test_check_on_cpu_names_the_gpu_it_needs():
    ctx = Context(device=CPU, available_packages=WITH_TORCHAO, technique_names=("bf16", "sparse24"))
    assert Sparse24().check(ctx) == CPU_REASON
    assert incompatibility(TechniqueSet.parse("bf16+sparse24"), WorkloadSpec("gpt"), CPU, 1) == \
        f"sparse24: {CPU_REASON}"
    with pytest.raises(RuntimeError, match="compute capability 8.0"):
        Sparse24().transform_model(gpt_chars.GPT(GPT128), Context(device=CPU))


def test_torchao_missing_comes_first(monkeypatch):
    assert Sparse24().check(Context(device=CPU)) == TORCHAO_MISSING
    monkeypatch.setattr(bench.plan.planner, "available_packages", lambda: frozenset())  # as if it were not installed
    assert incompatibility(TechniqueSet.parse("bf16+sparse24"), WorkloadSpec("gpt"), CPU, 1) == \
        f"sparse24: {TORCHAO_MISSING}"


def test_on_a_capable_device_it_still_needs_16_bit_autocast_and_one_process(monkeypatch):
    monkeypatch.setattr(sparse24, "sparse24_device_problem", lambda device: None)  # as on an Ampere GPU
    base = dict(device=CPU, available_packages=WITH_TORCHAO)
    assert "needs bf16 or fp16" in Sparse24().check(Context(**base, technique_names=("sparse24",)))
    assert Sparse24().check(Context(**base, technique_names=("bf16", "sparse24"))) is None
    assert Sparse24().check(Context(**base, technique_names=("fp16", "sparse24"))) is None
    assert "one process" in Sparse24().check(Context(**base, world_size=2, technique_names=("bf16", "sparse24")))


def test_layers_mlp_takes_the_feed_forward_and_all_every_linear_with_dims_of_128():
    model = gpt_chars.GPT(GPT128)
    mlp = [f"blocks.{i}.mlp.{n}" for i in range(2) for n in ("fc", "proj")]
    assert sparse24_targets(model, "mlp") == (mlp, {})
    every, left = sparse24_targets(model, "all")
    assert sorted(every) == sorted(mlp + [f"blocks.{i}.attn.{n}" for i in range(2) for n in ("qkv", "proj")])
    assert left.keys() == {"head"} and "wte" in left["head"]  # tied: stays dense
    mlp_model = workloads.get("mlp").build("tiny", 0, CPU).model  # 40 -> 256 -> 256 -> 256 -> 10
    targets, left = sparse24_targets(mlp_model, "all")
    assert targets == ["blocks.1.fc", "blocks.2.fc"] and left.keys() == {"blocks.0.fc", "head"}
    assert "multiples of 128" in left["head"]


def test_the_swap_keeps_the_parameters_and_the_tie():
    model = gpt_chars.GPT(GPT128)
    params = {name: p for name, p in model.named_parameters()}
    targets, _ = apply_sparse24(model, "mlp")
    cls = semi_sparse_linear_class()
    assert [n for n, m in model.named_modules() if isinstance(m, cls)] == targets
    assert all(p is params[name] for name, p in model.named_parameters())  # the optimizer's Parameters, unchanged
    assert model.head.weight is model.wte.weight


def test_no_qualifying_layer_is_an_error():
    tiny = workloads.get("gpt").build("tiny", 0, CPU).model  # d_model 64
    with pytest.raises(ValueError, match="multiples of 128.*layers=all"):
        apply_sparse24(tiny, "mlp")
    with pytest.raises(ValueError, match="no nn.Linear layer under a module named 'mlp'"):
        apply_sparse24(workloads.get("mlp").build("tiny", 0, CPU).model, "mlp")


class _ReferenceSparsify(torch.autograd.Function):
    """PyTorch's Python reference of the 2:4 tile pruning (dense result), with the straight-through gradient."""

    @staticmethod
    def forward(ctx, weight):
        from torch.sparse._semi_structured_conversions import _sparse_semi_structured_tile

        return _sparse_semi_structured_tile(weight.detach().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_the_forward_prunes_a_16_bit_copy_of_the_fp32_weight(monkeypatch):
    monkeypatch.setattr(sparse24, "_sparsify", _ReferenceSparsify.apply)
    torch.manual_seed(0)
    model = nn.Sequential()
    model.mlp = nn.Linear(128, 128)
    apply_sparse24(model, "mlp")
    layer, x = model.mlp, torch.randn(4, 128)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.mlp(x)
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    pruned = _ReferenceSparsify.apply(layer.weight.detach().to(torch.bfloat16))
    kept = (pruned != 0).reshape(128, -1, 4).sum(-1)
    assert kept.max() <= 2 and (pruned != 0).sum() >= 0.45 * pruned.numel()  # 2:4 along every row
    expected = F.linear(x.to(torch.bfloat16), pruned, layer.bias.to(torch.bfloat16))
    assert torch.equal(out, expected)
    out.float().sum().backward()
    grad = layer.weight.grad
    assert grad.dtype == torch.float32 and (grad[pruned == 0] != 0).any()  # straight-through: pruned weights learn
    with pytest.raises(RuntimeError, match="fp16/bf16"):
        model.mlp(x)  # fp32 without autocast: the 2:4 kernels would refuse it


@pytest.mark.parametrize("label,match", [("sparse24:layers=attn", "mlp, all"), ("sparse24:n=4", "valid options")])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_declared_traits():
    assert Sparse24.kind.value == "algorithmic" and Sparse24.compute_dtype is None and not Sparse24.own_flops
    assert {"qat", "fp8", "prune"} <= Sparse24.conflicts


@pytest.mark.gpu
@pytest.mark.parametrize("workload,label,size,expected", [
    ("mlp", "bf16+sparse24:layers=all", "tiny", 2),
    ("gpt", "bf16+sparse24", "small", 8),
])
def test_sparse24_trains_on_an_ampere_or_newer_gpu(workload, label, size, expected):
    from tests.test_fp8 import cuda_loop

    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 0) or not torch.backends.cusparselt.is_available():
        pytest.skip("no 2:4 sparse tensor cores (compute capability 8.0+) or no cuSPARSELt in this torch")
    ctx = Context(device=device, available_packages=WITH_TORCHAO, technique_names=("bf16", "sparse24"))
    assert Sparse24().check(ctx) is None
    loop, batches = cuda_loop(workload, label, size)
    losses = [float(loop.step(next(batches))) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    found = next(t for t in loop.techniques if t.name == "sparse24").results(loop.ctx)
    assert found["sparse_layers"] == expected
    loop.model.eval()
    with torch.no_grad(), loop.forward_context():
        x, _ = next(batches)
        assert torch.isfinite(loop.model(x.to(device)).float()).all()  # evaluation runs the 2:4 forward too
