"""efficient_arch: exact parameter and FLOP counts of the leaner models, MHA equivalence, training, refusals."""

import math

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

import techniques.efficient_arch as ea  # registers efficient_arch
from bench import workloads
from bench.trial import TrialSpec, run
from bench.workloads.gpt_chars import CausalSelfAttention, GPTConfig
from techniques.base import Context, OptionError
from techniques.efficient_arch import DepthwiseSeparableConv, EfficientArch, GroupedQKV, GroupedQueryAttention
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("efficient_arch", "gpt")

CPU = torch.device("cpu")


def convert(workload: str, kv_heads: int = 1, seed: int = 0):
    """(converted model, technique, built workload) for the workload's tiny size."""
    built = workloads.get(workload).build("tiny", seed, CPU)
    tech = EfficientArch(EfficientArch.Options(kv_heads=kv_heads))
    model = tech.transform_model(built.model, Context(device=CPU, workload=workload, seed=seed))
    return model, tech, built


def count(fn) -> tuple[int, dict[str, int]]:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops(), {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


# ---- parameter counts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv", [1, 2])
def test_gpt_parameter_count_is_the_hand_formula(kv):
    model, tech, built = convert("gpt", kv)
    V, T, d, L, H = built.params["vocab_size"], 64, 64, 2, 2
    hd = d // H
    ln = 2 * d
    mlp = (d * 4 * d + 4 * d) + (4 * d * d + d)
    mha = (3 * d * d + 3 * d) + (d * d + d)  # fused qkv, proj
    gqa = (d * d + d) + (d * 2 * kv * hd + 2 * kv * hd) + (d * d + d)  # q, kv, proj
    outside = V * d + T * d + ln  # wte (the head is tied to it), wpe, ln_f
    before = outside + L * (2 * ln + mlp + mha)
    after = outside + L * (2 * ln + mlp + gqa)
    found = tech.results(Context(device=CPU))
    assert found["n_params_before"] == before
    assert sum(p.numel() for p in model.parameters()) == after == found["n_params_after"]
    assert (after < before) == (kv < H)  # kv_heads == n_head: the baseline's count, projections unfused
    assert all(isinstance(b.attn.qkv, GroupedQKV) and b.attn.qkv.kv_heads == kv for b in model.blocks)
    # the inference-side gain: 2 * n_layer * kv_heads * head_dim fp32 values cached per token
    assert found["kv_cache_bytes_per_token_before"] == 2 * L * H * hd * 4 == 1024
    assert found["kv_cache_bytes_per_token_after"] == 2 * L * kv * hd * 4


def test_cnn_parameter_count_is_the_hand_formula():
    model, tech, _ = convert("cnn")

    def ds(c_in, c_out):  # depthwise 3x3 + its BatchNorm + pointwise 1x1
        return 9 * c_in + 2 * c_in + c_in * c_out

    def block(c_in, c_out, convs):
        shortcut = c_in * c_out + 2 * c_out if c_in != c_out else 0
        return convs(c_in, c_out) + 2 * c_out + convs(c_out, c_out) + 2 * c_out + shortcut

    def plain(c_in, c_out):
        return 9 * c_in * c_out

    stem, head = 9 * 1 * 8 + 2 * 8, 32 * 10 + 10
    stages = [(8, 8), (8, 16), (16, 32)]  # widths [8, 16, 32], one block per stage
    before = stem + head + sum(block(a, b, plain) for a, b in stages)
    after = stem + head + sum(block(a, b, ds) for a, b in stages)
    found = tech.results(Context(device=CPU))
    assert found["n_params_before"] == before == 19810
    assert sum(p.numel() for p in model.parameters()) == after == found["n_params_after"] == 4394
    assert found["convs_replaced"] == 6
    assert sum(isinstance(m, DepthwiseSeparableConv) for m in model.modules()) == 6
    assert model.stem[0].groups == 1 and model.blocks[1][0].shortcut[0].kernel_size == (1, 1)  # unchanged


# ---- FLOP counts -----------------------------------------------------------------------------------------------


def cpu_attention_has_a_formula() -> bool:
    """torch's CPU attention kernel has no FlopCounterMode formula (torch 2.13): its QK^T and AV count 0 there."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu in flop_registry


@pytest.mark.parametrize("kv", [1, 2])
def test_gqa_attention_flops_are_the_matmul_formula(kv):
    B, T, d, H = 1, 64, 64, 2
    hd = d // H
    attn = GroupedQueryAttention(d, H, kv)
    total, ops = count(lambda: attn(torch.randn(B, T, d)))
    linear = 2 * B * T * d * d + 2 * B * T * d * (2 * kv * hd) + 2 * B * T * d * d  # q, kv, proj: 2 m n k
    # FlopCounterMode's attention formula counts QK^T and AV at every query head, GQA or not
    sdpa = 2 * (2 * B * H * T * T * hd)
    assert sdpa_flop_count((B, H, T, hd), (B, kv, T, hd), (B, kv, T, hd)) == sdpa
    assert ops["aten.addmm"] == linear
    assert total == linear + (sdpa if cpu_attention_has_a_formula() else 0)
    fused = CausalSelfAttention(GPTConfig(vocab_size=10, seq_len=T, n_layer=1, n_head=H, d_model=d))
    fused_total, _ = count(lambda: fused(torch.randn(B, T, d)))
    assert fused_total - total == 2 * B * T * d * (3 * d) - (2 * B * T * d * d + 2 * B * T * d * 2 * kv * hd)


def test_separable_conv_flops_are_the_conv_formula():
    # stage 1's first conv of cnn:tiny: 8 -> 16 channels, stride 2, on the stem's 14 x 14 maps -> 7 x 7
    conv = nn.Conv2d(8, 16, 3, 2, 1, bias=False)
    new = ea.separable_from(conv, ea.init_generator(0))
    x = torch.randn(1, 8, 14, 14)
    assert new(x).shape == conv(x).shape == (1, 16, 7, 7)

    def conv_flops(out_hw, c_out, c_in_per_group, k):
        return 2 * out_hw * c_out * c_in_per_group * k * k

    plain, _ = count(lambda: conv(x))
    separable, _ = count(lambda: new(x))
    assert plain == conv_flops(49, 16, 8, 3)
    assert separable == conv_flops(49, 8, 1, 3) + conv_flops(49, 16, 8, 1)  # depthwise (groups 8) + pointwise
    assert new.depthwise.groups == 8 and new.depthwise.stride == (2, 2) and new.depthwise.padding == (1, 1)


@pytest.mark.parametrize("workload", ["gpt", "cnn"])
def test_converted_models_count_fewer_forward_flops(workload):
    built = workloads.get(workload).build("tiny", 0, CPU)
    x = torch.zeros(1, 64, dtype=torch.long) if workload == "gpt" else torch.zeros(1, 1, 28, 28)
    built.model.eval()
    original, _ = count(lambda: built.model(x))
    model, tech, _ = convert(workload)
    model.eval()
    converted, _ = count(lambda: model(x))
    found = tech.measure(x)  # on the first training batch's first sample in a trial
    assert found["forward_flops_per_sample_before"] == original
    assert found["forward_flops_per_sample_after"] == converted < original
    if workload == "gpt":  # MQA saves d^2 multiply-adds per token and block (2 of them here)
        assert original - converted == 2 * 64 * (64 * 64) * 2
        assert found["attention_flops_counted"] == cpu_attention_has_a_formula()


# ---- equivalence -----------------------------------------------------------------------------------------------


def random_fused(n_head: int, d: int = 64, seed: int = 0) -> CausalSelfAttention:
    torch.manual_seed(seed)
    attn = CausalSelfAttention(GPTConfig(vocab_size=10, seq_len=32, n_layer=1, n_head=n_head, d_model=d))
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.2)  # nonzero biases too
    return attn


def test_gqa_with_every_head_equals_the_fused_attention():
    attn = random_fused(n_head=2)
    gqa = ea.gqa_from_mha(attn, kv_heads=2)
    x = torch.randn(3, 32, 64)
    assert torch.allclose(gqa(x), attn(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fallback", [False, True])
def test_query_heads_share_their_groups_key_and_value_head(fallback, monkeypatch):
    """4 heads whose key/value heads are equal within each pair (0 = 1, 2 = 3): mean-pooling them into 2 GQA
    heads loses nothing, so the output equals the MHA's only if query head i reads kv head i // 2."""
    monkeypatch.setattr(ea, "SDPA_GQA", not fallback and ea.sdpa_gqa())  # enable_gqa, or repeat_interleave
    attn = random_fused(n_head=4)
    d, hd = 64, 16
    with torch.no_grad():
        for part in (1, 2):  # keys, values
            for src, dst in ((0, 1), (2, 3)):
                rows = slice(part * d + dst * hd, part * d + (dst + 1) * hd)
                same = slice(part * d + src * hd, part * d + (src + 1) * hd)
                attn.qkv.weight[rows] = attn.qkv.weight[same]
                attn.qkv.bias[rows] = attn.qkv.bias[same]
    gqa = ea.gqa_from_mha(attn, kv_heads=2)
    x = torch.randn(2, 32, 64)
    assert torch.allclose(gqa(x), attn(x), atol=1e-6, rtol=0)
    shifted = ea.gqa_from_mha(attn, kv_heads=2)
    with torch.no_grad():  # the kv heads swapped: query heads would read the other pair's keys
        w, b = shifted.kv.weight.view(2, 2, hd, d).clone(), shifted.kv.bias.view(2, 2, hd).clone()  # (k|v, head)
        shifted.kv.weight.copy_(w.flip(1).reshape(-1, d))
        shifted.kv.bias.copy_(b.flip(1).reshape(-1))
    assert not torch.allclose(shifted(x), attn(x), atol=1e-3)


# ---- initialisation and reproducibility -------------------------------------------------------------------------


def test_kept_heads_come_from_the_models_own_draws_and_leave_the_global_rng_alone():
    built = workloads.get("gpt").build("tiny", 0, CPU)
    state = torch.random.get_rng_state()
    tech = EfficientArch()
    model = tech.transform_model(built.model, Context(device=CPU, workload="gpt", seed=0))
    assert torch.equal(torch.random.get_rng_state(), state)
    again, _, _ = convert("gpt", seed=0)
    other, _, _ = convert("gpt", seed=1)
    a, b, c = (m.blocks[1].attn for m in (model, again, other))
    assert torch.equal(a.qkv.kv.weight, b.qkv.kv.weight) and not torch.equal(a.qkv.kv.weight, c.qkv.kv.weight)
    assert abs(a.qkv.q.weight.std().item() - 0.02) < 0.002  # GPT-2: N(0, 0.02), the workload's own draw
    assert abs(a.proj.weight.std().item() - 0.02 / math.sqrt(4)) < 0.001  # residual projection / sqrt(2 n_layer)
    assert all(not lin.bias.any() for lin in (a.qkv.q, a.qkv.kv, a.proj))


def test_counting_flops_leaves_batchnorm_statistics_and_training_mode_alone():
    built = workloads.get("cnn").build("tiny", 0, CPU)
    kept = {k: v.clone() for k, v in built.model.state_dict().items() if k.startswith(("stem.", "head."))}
    model, tech, _ = convert("cnn")
    tech.measure(torch.zeros(1, 1, 28, 28))
    model_state = model.state_dict()
    assert all(torch.equal(model_state[k], v) for k, v in kept.items())  # incl. running stats, batch counters
    assert all(m.training for m in model.modules())
    assert all(int(v) == 0 for k, v in model_state.items() if k.endswith("num_batches_tracked"))


def test_cnn_layers_follow_channels_last_when_it_ran_first():
    loop, _, _ = build_loop("cnn", "channels_last+efficient_arch")
    ds = loop.model.blocks[2][0].conv2
    assert ds.pointwise.weight.is_contiguous(memory_format=torch.channels_last)
    assert ds.depthwise.weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(ds.bn.running_var, torch.ones(32)) and not ds.bn.running_mean.any()


# ---- training --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["gpt", "cnn"])
def test_the_converted_model_trains_with_every_new_parameter_in_the_optimizer(workload):
    loop, batches, _ = build_loop(workload, "efficient_arch")
    new = {n: p for n, p in loop.model.named_parameters() if ".attn." in n or ".conv1." in n or ".conv2." in n}
    assert new and all(any(k in n for k in ("attn.qkv.q.", "attn.qkv.kv.", "attn.proj.", "depthwise", "pointwise",
                                            "conv1.bn", "conv2.bn")) for n in new)
    in_optimizer = {id(p) for group in loop.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in loop.model.parameters()}
    start = {n: p.detach().clone() for n, p in new.items()}
    for _ in range(3):
        loss = loop.step(next(batches))
        assert torch.isfinite(loss)
    assert all(not torch.equal(p, start[n]) for n, p in new.items())  # every new parameter was updated


# ---- refusals ----------------------------------------------------------------------------------------------------


def structure(workload: str):
    return workloads.get(workload).structure("tiny")


def test_a_model_without_attention_or_convolutions_is_refused_naming_the_parts():
    reason = EfficientArch().check(Context(device=CPU, structure=structure("mlp")))
    assert reason and "\n" not in reason
    assert "attention" in reason and "Conv2d" in reason and "structure" in reason


def test_supported_workloads_pass_and_kv_heads_is_gpt_only():
    for workload in ("gpt", "cnn", "cnn_aug", "hf"):
        assert EfficientArch().check(Context(device=CPU, structure=structure(workload))) is None
    assert EfficientArch(EfficientArch.Options(kv_heads=2)).check(Context(device=CPU, structure=structure("gpt"))) is None
    reason = EfficientArch(EfficientArch.Options(kv_heads=2)).check(Context(device=CPU, structure=structure("cnn")))
    assert reason and "kv_heads" in reason and "no options" in reason
    assert {"tp", "pp"} <= EfficientArch.conflicts and EfficientArch.slot == "architecture"
    assert EfficientArch.own_flops


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_bad_kv_heads_options_are_errors(text):
    with pytest.raises(OptionError, match="kv_heads"):
        EfficientArch.parse_options({"kv_heads": text})
    with pytest.raises(OptionError, match="valid options: kv_heads"):
        EfficientArch.parse_options({"kv_head": "1"})


def test_kv_heads_that_do_not_divide_n_head_are_refused_with_the_valid_values():
    built = workloads.get("gpt").build("tiny", 0, CPU)  # n_head 2
    tech = EfficientArch(EfficientArch.parse_options({"kv_heads": "3"}))
    with pytest.raises(ValueError, match=r"kv_heads=3 does not divide the model's 2 attention heads \(valid: 1, 2\)"):
        tech.transform_model(built.model, Context(device=CPU, workload="gpt"))
    assert all(isinstance(b.attn, CausalSelfAttention) for b in built.model.blocks)  # untouched


# ---- a real trial ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_trial_counts_fewer_flops_per_step_than_the_baseline(tmp_path):
    def trial(techniques):
        return run(TrialSpec(sweep_id="t", trial_id="t", workload="gpt", size="tiny", techniques=techniques,
                             seed=0, repeat=0, device="cpu", mode="speed", reference_dir=str(tmp_path),
                             budget={"min_steps": 4, "min_seconds": 0.0, "warmup_steps": 1, "memory": False,
                                     "parity_steps": 0}))

    lean, base = trial(["efficient_arch"]), trial([])
    assert lean.status == "ok", lean.reason
    assert base.status == "ok", base.reason
    assert 0 < lean.speed.flops_per_step < base.speed.flops_per_step
    found = lean.technique_results["efficient_arch"]
    assert found["kv_heads"] == 1 and found["n_params_after"] < found["n_params_before"]
    assert found["forward_flops_per_sample_after"] < found["forward_flops_per_sample_before"]
