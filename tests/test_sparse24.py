"""sparse24: the reasons it is skipped (no CUDA 8.0+ device, no 16-bit autocast), which layers it takes, its own 2:4
mask, straight-through gradient and 2-D cuSPARSELt packing checked on CPU through its pure-torch reference path
(nothing replaced: the layer, the mask and the autograd function are the ones the GPU runs), the claims check that
holds bf16+sparse24 against bf16, and, on an Ampere or newer GPU, the real kernels against a dense matmul with the
mask they chose, and real training steps."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import techniques.sparse24  # noqa: F401  (registers "sparse24")
from bench import workloads
from bench.analyze import analysis, findings
from bench.plan.config import ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import incompatibility
from bench.records.frame import records_frame
from bench.workloads import gpt_chars
from techniques import sparse24
from techniques.base import Context
from techniques.sparse24 import (
    Sparse24,
    Sparse24Linear,
    apply_sparse24,
    cusparselt_tensor,
    mask24,
    sparse24_targets,
    sparsify24,
)
from tests.helpers import TechniqueSettings
from tests.records import record

SETTINGS = TechniqueSettings("bf16+sparse24:layers=all", "mlp", runs_on="gpu")

CPU = torch.device("cpu")
CPU_REASON = "2:4 sparse kernels need a CUDA GPU with compute capability 8.0+ (Ampere or newer); this device is cpu"
GPT128 = gpt_chars.GPTConfig(vocab_size=11, seq_len=8, n_layer=2, n_head=2, d_model=128)


def test_check_on_cpu_names_the_gpu_it_needs():
    ctx = Context(device=CPU, technique_names=("bf16", "sparse24"))  # no optional package: it needs none
    assert Sparse24().check(ctx) == CPU_REASON
    assert incompatibility(TechniqueSet.parse("bf16+sparse24"), WorkloadSpec("gpt"), CPU, 1) == \
        f"sparse24: {CPU_REASON}"
    with pytest.raises(RuntimeError, match="compute capability 8.0"):
        Sparse24().transform_model(gpt_chars.GPT(GPT128), Context(device=CPU))


def test_on_a_capable_device_it_still_needs_16_bit_autocast_and_one_process(monkeypatch):
    monkeypatch.setattr(sparse24, "sparse24_device_problem", lambda device: None)  # as on an Ampere GPU
    assert "needs bf16 or fp16" in Sparse24().check(Context(device=CPU, technique_names=("sparse24",)))
    assert Sparse24().check(Context(device=CPU, technique_names=("bf16", "sparse24"))) is None
    assert Sparse24().check(Context(device=CPU, technique_names=("fp16", "sparse24"))) is None
    assert "one process" in Sparse24().check(Context(device=CPU, world_size=2, technique_names=("bf16", "sparse24")))


def test_the_registry_gpu_test_runs_it_in_its_bf16_set_instead_of_skipping(monkeypatch):
    """The registry's GPU test skips a technique whose set ``gpu_refusal`` refuses: on a capable GPU (faked here)
    nothing of SETTINGS' set may refuse, and the set holds the bf16 the 2:4 kernels need."""
    from tests.test_registry import gpu_refusal

    assert SETTINGS.requires is None and "bf16" in SETTINGS.names
    assert gpu_refusal(SETTINGS, CPU) == f"sparse24: {CPU_REASON}"
    monkeypatch.setattr(sparse24, "sparse24_device_problem", lambda device: None)
    assert gpu_refusal(SETTINGS, CPU) is None


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
    assert [n for n, m in model.named_modules() if isinstance(m, Sparse24Linear)] == targets
    assert all(p is params[name] for name, p in model.named_parameters())  # the optimizer's Parameters, unchanged
    assert model.head.weight is model.wte.weight
    assert all(m.kernels == "cusparselt" for m in model.modules() if isinstance(m, Sparse24Linear))


def test_no_qualifying_layer_is_an_error():
    tiny = workloads.get("gpt").build("tiny", 0, CPU).model  # d_model 64
    with pytest.raises(ValueError, match="multiples of 128.*layers=all"):
        apply_sparse24(tiny, "mlp")
    with pytest.raises(ValueError, match="no nn.Linear layer under a module named 'mlp'"):
        apply_sparse24(workloads.get("mlp").build("tiny", 0, CPU).model, "mlp")
    with pytest.raises(ValueError, match="cusparselt, reference"):
        apply_sparse24(gpt_chars.GPT(GPT128), "mlp", kernels="cutlass")


# ---- the mask, the packing, the straight-through gradient -------------------------------------------------------


def tiles_of(mask: torch.Tensor) -> torch.Tensor:
    rows, cols = mask.shape
    return mask.reshape(rows // 4, 4, cols // 4, 4).transpose(1, 2)  # (tile row, tile col, 4, 4)


def test_the_mask_is_2_to_4_in_rows_and_columns_and_greedy_by_magnitude():
    from torch.sparse._semi_structured_conversions import _sparse_semi_structured_tile

    torch.manual_seed(0)
    w = torch.randn(64, 128)
    mask = mask24(w)
    tiles = tiles_of(mask)
    assert tiles.sum(-1).max() == 2 and tiles.sum(-2).max() == 2  # W and W^T are both 2:4
    assert mask.reshape(64, -1, 4).sum(-1).max() == 2 and mask.t().reshape(128, -1, 4).sum(-1).max() == 2
    assert 0.45 < mask.float().mean() <= 0.5  # the greedy pass may keep fewer than 8 of a tile's 16
    # torch's own Python reference of the tile pruning ranks by value: on |w| it is the magnitude-greedy choice
    assert torch.equal(mask, _sparse_semi_structured_tile(w.abs()) != 0)
    assert torch.equal(mask24(-w), mask)  # magnitude, not sign (the tile kernel's default ranks by signed value)


def test_the_greedy_pass_on_one_tile_by_hand():
    tile = torch.tensor([[9., 1, 7, 4], [1, 2, 3, 0], [8, 3, 5, 4], [1, 2, 6, 2]])
    # by |w|: 9, 8, 7, 6 kept; 5 dropped (column 2 holds 7 and 6); 4 at (0, 3) dropped (row 0 holds 9 and 7); 4 at
    # (2, 3) kept; both 3s dropped (column 2, row 2 full); 2 at (1, 1) and (3, 1) kept, at (3, 3) dropped (row 3
    # full); the 1s dropped; the 0 at (1, 3) fills the last free place (the kernel too keeps it: still a zero)
    expected = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(mask24(tile), expected)
    with pytest.raises(ValueError, match="multiples of 4"):
        mask24(torch.ones(6, 8))


def test_the_packed_buffers_reach_cusparselt_as_2d_operands():
    """The H200 crash: ``torch._cslt_sparse_mm`` asserts a 2-D compressed operand, and the tile kernel returns
    flat buffers. The forward multiplies by ``packed``; the backward's grad_input by the transpose's (``packed_t``)."""
    rows, cols = 128, 256
    flat = torch.zeros(rows * cols * 9 // 16, dtype=torch.bfloat16)  # kept values and metadata, as one buffer
    flat_t = torch.zeros_like(flat)
    w = cusparselt_tensor(torch.Size([rows, cols]), flat, None, flat_t, None, None)
    assert w.shape == (rows, cols) and w.dtype == torch.bfloat16
    assert w.packed.dim() == 2 and w.packed.shape[0] == rows and w.packed.data_ptr() == flat.data_ptr()
    wt = w.t()  # what F.linear multiplies by, and what grad_input = grad @ W transposes again
    assert wt.shape == (cols, rows) and wt.packed.dim() == 2 and wt.packed.shape[0] == cols
    assert wt.t().packed.shape == (rows, flat.numel() // rows)


def test_the_straight_through_gradient_matches_a_dense_matmul_with_the_same_mask():
    torch.manual_seed(0)
    model = nn.Sequential()
    model.mlp = nn.Linear(256, 128)
    apply_sparse24(model, "mlp", kernels="reference")
    layer = model.mlp
    x = torch.randn(4, 3, 256, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 3, 128) and layer.weight.dtype == torch.float32
    # the dense reference: the bf16 weight with the same mask, as a leaf of its own
    w16 = layer.weight.detach().to(torch.bfloat16)
    pruned = (w16 * mask24(w16)).requires_grad_()
    xd = x.detach().to(torch.bfloat16).requires_grad_()
    expected = F.linear(xd, pruned, layer.bias.detach().to(torch.bfloat16))
    assert torch.equal(out, expected)
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    assert torch.equal(layer.weight.grad, pruned.grad.float())  # straight through: the pruned weight's gradient
    assert (layer.weight.grad[~mask24(w16)] != 0).all()  # ... reaches the weights the mask dropped too
    assert torch.equal(x.grad, xd.grad.float())
    with pytest.raises(RuntimeError, match="fp16/bf16"):
        layer(x)  # fp32 without autocast: the 2:4 kernels would refuse it


def test_the_mask_follows_the_weights_as_they_learn():
    torch.manual_seed(0)
    w = torch.randn(128, 128, requires_grad=True)
    before = mask24(w)
    sparsify24(w.to(torch.bfloat16), "reference").float().sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))  # every weight gets the dense gradient
    with torch.no_grad():
        w.add_(torch.randn_like(w))
    assert not torch.equal(mask24(w), before)  # chosen again from the current weights each step


def test_it_imports_no_torchao(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # any import of torchao now fails
    model = nn.Sequential()
    model.mlp = nn.Linear(128, 128)
    apply_sparse24(model, "mlp", kernels="reference")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(torch.randn(2, 128)).float()).all()


@pytest.mark.parametrize("label,match", [("sparse24:layers=attn", "mlp, all"), ("sparse24:n=4", "valid options")])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_declared_traits():
    assert Sparse24.kind.value == "algorithmic" and Sparse24.compute_dtype is None and not Sparse24.own_flops
    assert {"qat", "fp8", "prune"} <= Sparse24.conflicts
    (claim,) = Sparse24.claims
    assert claim.over_rest and claim.needs == ("compile",) and claim.devices == 1


# ---- its reading: against the set without it --------------------------------------------------------------------


def test_the_claims_check_holds_bf16_sparse24_against_bf16_and_says_it_is_slower():
    """bf16+sparse24 at 0.8x of bf16 (three seeds): measured against bf16, paired by seed, below the claim, and a
    finding that says the 2:4 kernels made the step slower here, with the numbers."""
    records = [record(label, seed=s, sps=v, workload="gpt", size="small", n_params=3_000_000)
               for label, values in (("baseline", [100, 101, 99]), ("bf16", [200, 204, 198]),
                                     ("bf16+sparse24", [160, 161, 160]))
               for s, v in enumerate(values)]
    frame = records_frame(records)
    configs = analysis.configurations(frame)
    claims = findings.claims_check(configs, {}, {"sparse24": Sparse24.claims}, frame)
    (row,) = claims.itertuples()
    assert (row.technique, row.name, row.against, row.verdict) == ("bf16+sparse24", "sparse24", "bf16", "below")
    assert row.measured == pytest.approx((160 * 161 * 160 / (200 * 204 * 198)) ** (1 / 3), rel=1e-6)
    assert row.measured_hi < 1
    assert row.unmet == ["no compile in the set (the claim's setting ran with it)",
                         "a model of 3M parameters, 101x smaller than the claim's 304M"]
    (found,) = [f for f in findings.diagnose(configs, None, claims) if f.topic == "claim"]
    assert found.text.startswith(f"sparse24 in bf16+sparse24 is below the claim here ({row.measured:.2f}x [")
    assert "over bf16 on gpt:small" in found.text and "it lowers bf16's throughput on this device (the whole interval below 1)" in found.text
    assert "not the claim's setting: no compile in the set" in found.text


def test_without_the_set_without_it_the_claim_is_not_measured_and_says_what_to_add():
    records = [record(label, seed=s, sps=100.0) for label in ("baseline", "bf16+sparse24") for s in range(3)]
    frame = records_frame(records)
    claims = findings.claims_check(analysis.configurations(frame), {}, {"sparse24": Sparse24.claims}, frame)
    (row,) = claims.itertuples()
    assert row.verdict == "not measured" and row.against == "bf16"
    assert row.why == ["this sweep ran no bf16 set to measure sparse24 against: add it"]


# ---- on a GPU -----------------------------------------------------------------------------------------------------


def cuda_loop(workload: str, label: str, size: str = "tiny"):
    """build_loop on the GPU: the workload with ``label`` applied, its loop and batches (tests/test_fp8.py too)."""
    from bench.loop import TrainLoop, build_optimizer
    from bench.plan.config import Budget
    from bench.trial import configure

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


def needs_sparse_gpu() -> torch.device:
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 0) or not torch.backends.cusparselt.is_available():
        pytest.skip("no 2:4 sparse tensor cores (compute capability 8.0+) or no cuSPARSELt in this torch")
    return device


def tie_free(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """Weights whose magnitudes differ within every 4x4 tile (1..16 x 2^-7, random signs), exact in bf16: the
    greedy choice is unique, so the kernel's and ``mask24``'s must agree."""
    ranks = torch.stack([torch.randperm(16) + 1 for _ in range(rows * cols // 16)]).float()
    signs = torch.randint(0, 2, ranks.shape).float() * 2 - 1
    tiles = (ranks * signs / 128).reshape(rows // 4, cols // 4, 4, 4)
    return tiles.transpose(1, 2).reshape(rows, cols).to(device)


@pytest.mark.gpu
def test_the_cusparselt_kernels_match_a_dense_matmul_with_their_mask():
    """Forward and both gradients of the 2:4 layer on cuSPARSELt against a dense bf16 matmul with the mask the
    kernel chose (read back by multiplying the identity). Both accumulate in fp32 and round to bf16, in different
    orders: they may differ by a bf16 rounding step (2^-8 relative), so rtol = atol = 1e-2."""
    device = needs_sparse_gpu()
    torch.manual_seed(0)
    model = nn.Sequential()
    model.mlp = nn.Linear(256, 128).to(device)
    with torch.no_grad():
        model.mlp.weight.copy_(tie_free(128, 256, device))
    apply_sparse24(model, "mlp")
    layer = model.mlp
    x = torch.randn(64, 256, device=device, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(x)
    w16 = layer.weight.detach().to(torch.bfloat16)
    compressed = sparsify24(w16)
    eye = torch.eye(256, device=device, dtype=torch.bfloat16)
    kept = F.linear(eye, compressed).t()  # the pruned weight, exactly: one nonzero product per output
    assert torch.equal(kept != 0, mask24(w16))  # magnitude-greedy 2:4, as on the CPU
    assert torch.equal(kept, w16 * mask24(w16))
    pruned = kept.clone().requires_grad_()
    xd = x.detach().to(torch.bfloat16).requires_grad_()
    expected = F.linear(xd, pruned, layer.bias.detach().to(torch.bfloat16))
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, pruned.grad.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad, xd.grad.float(), rtol=1e-2, atol=1e-2)
    assert (layer.weight.grad[~mask24(w16)] != 0).any()  # straight through to the pruned weights


@pytest.mark.gpu
@pytest.mark.parametrize("workload,label,size,expected", [
    ("mlp", "bf16+sparse24:layers=all", "tiny", 2),
    ("gpt", "bf16+sparse24", "small", 8),
])
def test_sparse24_trains_on_an_ampere_or_newer_gpu(workload, label, size, expected):
    device = needs_sparse_gpu()
    assert Sparse24().check(Context(device=device, technique_names=("bf16", "sparse24"))) is None
    loop, batches = cuda_loop(workload, label, size)
    losses = [float(loop.step(next(batches))) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    found = next(t for t in loop.techniques if t.name == "sparse24").results(loop.ctx)
    assert found["sparse_layers"] == expected
    loop.model.eval()
    with torch.no_grad(), loop.forward_context():
        x, _ = next(batches)
        assert torch.isfinite(loop.model(x.to(device)).float()).all()  # evaluation runs the 2:4 forward too
