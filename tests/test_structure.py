"""A model's structure, described once: the techniques that change a model (prune:mode=structured, efficient_arch,
mtp, distill, transfer:init) run on a model the built-in workloads do not contain, a small Llama-style decoder written
here (separate q/k/v projections, rotary embeddings, RMSNorm, a gated SwiGLU MLP), with the math properties their
built-in tests check: pruned parameter counts, GQA equal to MHA when key/value heads are duplicated, mtp heads unused
at evaluation, a bigger teacher, a strict checkpoint key check. The Hugging Face GPT-2 and Llama configs repeat the
checks where transformers is installed, and techniques/ is checked to name no built-in workload."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import techniques  # noqa: F401  (registers every technique)
from bench import workloads
from bench.core.structure import MLP, Attention, Block, Cut, ModelStructure, infer
from bench.loop import plain_loop
from bench.plan.config import Budget, TechniqueSpec
from bench.workloads.base import Size, Workload, register
from techniques.base import Context, Probe, TrainConfig, TrainOutput
from techniques.distill import TEACHER_SEED, Distill
from techniques.efficient_arch import EfficientArch, GroupedQKV, SharedHeads
from techniques.mtp import MTP
from techniques.prune import Prune, channel_groups, shrink
from techniques.transfer import Transfer, key_mismatch
from tests.helpers import build_loop

CPU = torch.device("cpu")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed (the "
                                        "trainbench[transformers] extra)")


# ---- a Llama-style decoder, written here ------------------------------------------------------------------------


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embeddings (Su et al. 2021) on (B, H, T, hd): pairs (i, i + hd/2) rotated by t * theta_i."""
    T, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-b, a], -1) * sin


class Attn(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, -1, self.hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rotary(q), rotary(k)
        r = q.shape[1] // k.shape[1]  # key/value heads from the projection's width, as Llama's view(-1) does
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class GatedMLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(d)
        self.attn = Attn(d, heads, kv_heads)
        self.post_norm = nn.RMSNorm(d)
        self.mlp = GatedMLP(d, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int = 23, d: int = 32, n_layer: int = 2, heads: int = 4, kv_heads: int = 4,
                 hidden: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads, kv_heads, hidden) for _ in range(n_layer))
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


SIZES = {"small": {"d": 32, "hidden": 48}, "big": {"d": 64, "hidden": 96}}


def structure_dict(n_layer: int = 2, heads: int = 4, kv_heads: int = 4, d: int = 32, hidden: int = 48) -> dict:
    """What a user's build returns under ``structure`` for TinyLlama."""
    return {
        "blocks": "layers", "n_blocks": n_layer,
        "block": {"attention": {"heads": heads, "kv_heads": kv_heads, "head_dim": d // heads, "module": "attn",
                                "q": "attn.q_proj", "k": "attn.k_proj", "v": "attn.v_proj", "out": "attn.o_proj",
                                "rotary": True},
                  "mlp": {"up": "mlp.up_proj", "gate": "mlp.gate_proj", "down": "mlp.down_proj", "hidden": hidden},
                  "norms": ["input_norm", "post_norm"]},
        "embedding": "embed", "final_norm": "norm", "head": "lm_head", "tied": True, "causal": True,
        "convolutional": False, "calls_sdpa": True,
    }


def llama(seed: int = 0, **kw) -> TinyLlama:
    torch.manual_seed(seed)
    return TinyLlama(**kw)


def tokens(B: int = 3, T: int = 12, vocab: int = 23, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def build(size: str = "small", seed: int = 0, device: str = "cpu") -> dict:
    """A user's build: TinyLlama on random token windows, returning its structure and a bigger teacher size."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}")
    model = llama(seed, **SIZES[size])
    data = torch.randint(0, 23, (512, 13), generator=torch.Generator().manual_seed(5))

    def batches(batch_size: int, bseed: int):
        gen = torch.Generator().manual_seed(bseed)
        while True:
            rows = data[torch.randint(0, len(data), (batch_size,), generator=gen)]
            yield rows[:, :-1], rows[:, 1:]

    def loss(logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def evaluate(m):
        return {"val_loss": float(loss(m(data[:32, :-1]), data[:32, 1:]))}

    return {"model": model, "train_data": batches, "loss": loss, "evaluate": evaluate, "metric": "val_loss",
            "higher_is_better": False, "batch_size": 8, "quality_steps": 10, "tokens_per_sample": 12,
            "structure": structure_dict(d=SIZES[size]["d"], hidden=SIZES[size]["hidden"]), "teacher_size": "big"}


@pytest.fixture(scope="module")
def user_workload():
    """This file's ``build`` as a user's model (``--model tests/test_structure.py:build``), built in-process."""
    from bench.plan.user_models import parse_model, register_model

    return register_model(parse_model(f"llama_style={Path(__file__).resolve()}:build"))()


def ctx_for(structure: ModelStructure, **kw) -> Context:
    return Context(device=CPU, structure=structure, **kw)


STRUCT = ModelStructure.from_dict(structure_dict())


# ---- the description ---------------------------------------------------------------------------------------------


def test_a_description_round_trips_through_json_and_refuses_unknown_keys():
    assert ModelStructure.from_dict(STRUCT.to_dict()) == STRUCT
    assert STRUCT.attention == Attention(heads=4, kv_heads=4, head_dim=8, module="attn", q="attn.q_proj",
                                         k="attn.k_proj", v="attn.v_proj", out="attn.o_proj", rotary=True)
    assert STRUCT.attention.projections == "separate" and STRUCT.mlp.gate == "mlp.gate_proj"
    with pytest.raises(ValueError, match=r"structure.block.mlp has unknown key\(s\) gated"):
        ModelStructure.from_dict({**structure_dict(), "block": {"mlp": {"up": "a", "down": "b", "gated": True}}})
    assert STRUCT.missing("attention", "mlp", "head", "teacher") == ["teacher"]


def test_the_built_in_workloads_declare_theirs_the_same_at_plan_and_build_time():
    for name in ("gpt", "mlp"):
        wl = workloads.get(name)
        built = wl.build("tiny", 0, CPU)
        assert built.structure == wl.structure("tiny") == built.model.trainbench_structure()
        assert built.structure.source == "declared"
    gpt = workloads.get("gpt").structure("tiny")
    assert (gpt.attention.qkv, gpt.mlp.up, gpt.head, gpt.tied, gpt.causal) == ("attn.qkv", "mlp.fc", "head", True, True)


def test_inference_finds_the_gated_mlp_head_and_embedding_of_an_undescribed_decoder():
    model = llama()
    found = infer(model, "layers")
    assert (found.embedding, found.final_norm, found.head, found.tied, found.n_blocks) == \
        ("embed", "norm", "lm_head", True, 2)
    assert found.mlp == MLP(up="mlp.up_proj", down="mlp.down_proj", gate="mlp.gate_proj", hidden=48)
    groups = {g.name: g for g in found.hidden_channels()}
    assert set(groups) == {"layers.0.mlp", "layers.1.mlp"}  # the MLP's, once each; the attention is no group
    g = groups["layers.0.mlp"]
    assert {c.tensor for c in g.score if c.tensor.endswith("weight")} == \
        {"layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"}
    assert Cut("layers.0.mlp.down_proj.weight", 1) in g.cuts
    assert found.attention is None and any("attention" in n for n in found.notes)
    assert found.convolutional is False and found.source == "inferred"


def test_inference_keeps_a_residual_out_of_the_channel_groups():
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.relu(h)) + h  # a's outputs also leave through the residual: not removable

    assert infer(Residual(), None).hidden_channels() == []


# ---- prune:mode=structured -----------------------------------------------------------------------------------------


def test_structured_prune_cuts_the_gated_mlp_by_the_hand_count_and_slices_adamw():
    model = llama()
    x = tokens()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        model(x).float().pow(2).mean().backward()
        opt.step()
    before = sum(p.numel() for p in model.parameters())
    tech = Prune(Prune.Options(mode="structured", sparsity=0.5, start=0.0))
    ctx = ctx_for(STRUCT, total_steps=10)
    assert tech.check(ctx) is None
    tech.transform_model(model, ctx)
    for p in model.parameters():
        opt.state[p]["exp_avg"].copy_(p.detach())
    tech.attach(opt, ctx)
    tech.after_step(opt, ctx)
    d, hidden, keep = 32, 48, 24
    assert before - sum(p.numel() for p in model.parameters()) == 2 * (hidden - keep) * 3 * d  # gate, up, down
    for layer in model.layers:
        assert layer.mlp.gate_proj.weight.shape == layer.mlp.up_proj.weight.shape == (keep, d)
        assert layer.mlp.down_proj.weight.shape == (d, keep) and layer.mlp.down_proj.in_features == keep
    assert all(torch.equal(opt.state[p]["exp_avg"], p.detach()) for p in model.parameters())
    assert torch.isfinite(model(x)).all()


def test_removing_all_zero_gated_channels_leaves_the_output_unchanged():
    model = llama().eval()
    groups = channel_groups(model, STRUCT)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.layers:
            dead = torch.randperm(48, generator=gen)[:12]
            layer.mlp.gate_proj.weight[dead] = 0.0
            layer.mlp.up_proj.weight[dead] = 0.0
        x = tokens()
        before = model(x)
        sizes = shrink(groups, 0.25, None)
        after = model(x)
    assert all(v == [48, 36] for v in sizes.values())
    torch.testing.assert_close(after, before)


def test_inferred_and_declared_groups_prune_the_same_channels():
    declared, inferred = llama(), llama()
    a = shrink(channel_groups(declared, STRUCT), 0.5, None)
    b = shrink(channel_groups(inferred, infer(inferred, "layers")), 0.5, None)
    assert sorted(a.values()) == sorted(b.values())
    assert all(torch.equal(p, q) for p, q in zip(declared.parameters(), inferred.parameters(), strict=True))


def test_structured_prune_is_skipped_naming_the_part_a_model_lacks():
    reason = Prune(Prune.Options(mode="structured")).check(ctx_for(ModelStructure(source="inferred")))
    assert reason and "removable hidden channels" in reason and "structure" in reason and "\n" not in reason


# ---- efficient_arch ------------------------------------------------------------------------------------------------


def duplicate_kv_heads(model: TinyLlama, groups: int) -> None:
    """Make the key/value heads equal within each group (heads 0 = 1, 2 = 3 for 2 groups of 4)."""
    hd, per = 8, 4 // groups
    with torch.no_grad():
        for layer in model.layers:
            for proj in (layer.attn.k_proj, layer.attn.v_proj):
                w = proj.weight.view(4, hd, -1)
                for g in range(groups):
                    w[g * per : (g + 1) * per] = w[g * per].clone()


@pytest.mark.parametrize("kv", [1, 2])
def test_gqa_equals_mha_when_key_value_heads_are_duplicated_with_rotary(kv):
    model = llama().eval()
    duplicate_kv_heads(model, kv)
    x = tokens()
    with torch.no_grad():
        mha = model(x)
    before = sum(p.numel() for p in model.parameters())
    tech = EfficientArch(EfficientArch.Options(kv_heads=kv))
    ctx = ctx_for(STRUCT)
    assert tech.check(ctx) is None
    tech.transform_model(model, ctx)
    assert all(isinstance(layer.attn.k_proj, SharedHeads) for layer in model.layers)
    with torch.no_grad():
        torch.testing.assert_close(model(x), mha, rtol=1e-4, atol=1e-5)  # float32 rounding: smaller matmuls
    d, hd = 32, 8
    assert before - sum(p.numel() for p in model.parameters()) == 2 * 2 * d * (4 - kv) * hd  # k, v of 2 layers
    found = tech.measure(x[:1])
    assert found["kv_cache_bytes_per_token_after"] == 2 * 2 * kv * hd * 4 and found["rotary"] is True
    assert found["forward_flops_per_sample_after"] < found["forward_flops_per_sample_before"]


def test_gqa_differs_from_mha_when_heads_are_not_duplicated():
    model = llama().eval()
    x = tokens()
    with torch.no_grad():
        mha = model(x)
    EfficientArch(EfficientArch.Options(kv_heads=2)).transform_model(model, ctx_for(STRUCT))
    with torch.no_grad():
        assert not torch.allclose(model(x), mha, atol=1e-4)


def test_gqa_on_a_fused_projection_equals_mha_with_duplicated_heads():
    from bench.workloads.gpt_chars import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, seq_len=12, n_layer=2, n_head=4, d_model=32)).eval()
    hd = 8
    with torch.no_grad():
        for b in model.blocks:
            for part in (1, 2):  # keys, values: heads 1-3 copied from head 0 (MQA)
                rows = b.attn.qkv.weight[part * 32 : (part + 1) * 32].view(4, hd, 32)
                rows[1:] = rows[0].clone()
                bias = b.attn.qkv.bias[part * 32 : (part + 1) * 32].view(4, hd)
                bias[1:] = bias[0].clone()
    x = tokens(vocab=11)
    with torch.no_grad():
        mha = model(x)
    EfficientArch().transform_model(model, Context(device=CPU))  # the model's own description
    assert all(isinstance(b.attn.qkv, GroupedQKV) for b in model.blocks)
    with torch.no_grad():
        torch.testing.assert_close(model(x), mha, rtol=1e-4, atol=1e-5)  # float32 rounding: smaller matmuls


def test_efficient_arch_is_skipped_naming_what_a_model_lacks():
    reason = EfficientArch().check(ctx_for(ModelStructure(blocks="blocks", convolutional=False, source="inferred")))
    assert reason and "attention" in reason and "Conv2d" in reason and "\n" not in reason
    packed = ModelStructure(blocks="b", block=Block(attention=Attention(4, 4, 8, module="mha", packed=True)))
    assert "nn.MultiheadAttention" in EfficientArch().check(ctx_for(packed))
    assert "valid: 1, 2, 4" in EfficientArch(EfficientArch.Options(kv_heads=3)).check(ctx_for(STRUCT))


# ---- mtp -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["heads", "sequential"])
def test_mtp_heads_train_and_are_unused_at_evaluation(variant):
    model = llama()
    plain = llama()
    tech = MTP(MTP.Options(variant=variant, n=3))
    ctx = ctx_for(STRUCT, seed=4, sequence_length=12)
    assert tech.check(ctx) is None
    model = tech.transform_model(model, ctx)
    x = tokens()
    out = model(x)
    assert isinstance(out, TrainOutput) and torch.equal(out.logits, plain(x))
    assert [t.shape[1] for t in out.extra["mtp_logits"]] == [11, 10]
    y = torch.roll(x, -1, 1)
    loss = tech.loss(out, (x, y), F.cross_entropy(out.logits.reshape(-1, 23), y.reshape(-1)), ctx)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.mtp.parameters() if p.dim() >= 2)
    model.eval()
    with torch.no_grad():
        evaluated = model(x)
        for p in model.mtp.parameters():
            p.add_(1.0)
        assert type(evaluated) is torch.Tensor and torch.equal(model(x), evaluated)
        assert torch.equal(evaluated, plain.eval()(x))


def test_mtp_depths_never_see_the_token_they_predict():
    model = MTP(MTP.Options(variant="heads", n=2)).transform_model(llama(), ctx_for(STRUCT))
    x = tokens(B=1)
    changed = x.clone()
    changed[0, 7] = (changed[0, 7] + 1) % 23
    a, b = (model(t).extra["mtp_logits"][0] for t in (x, changed))
    # head 2 at position i predicts t_{i+2}: positions i < 7 see only tokens up to i; t_7 is no input of theirs
    torch.testing.assert_close(a[0, :7], b[0, :7])
    assert not torch.allclose(a[0, 7], b[0, 7])


def test_mtp_refuses_a_model_that_is_not_causal_or_lacks_parts():
    class Bidirectional(TinyLlama):
        def forward(self, idx):
            return super().forward(idx) + super().forward(idx.flip(1)).flip(1)

    model = Bidirectional()
    s = infer(model, "layers")
    with pytest.raises(ValueError, match="causal"):
        MTP().transform_model(model, ctx_for(s))
    reason = MTP().check(ctx_for(ModelStructure(blocks="blocks", head="head", source="inferred")))
    assert reason and "token embedding" in reason


# ---- distill -------------------------------------------------------------------------------------------------------


def test_distill_trains_a_bigger_teacher_of_the_same_build(user_workload):
    wl = user_workload
    probe = Probe(lambda seed=None: wl.build("small", 0 if seed is None else seed, CPU), CPU, 0, make_loop=plain_loop)
    student = probe.fresh()
    assert student.structure.teacher_size == "big" and student.structure.source == "returned by build"
    tech = Distill(Distill.Options(teacher_steps=0.2))
    ctx = Context(device=CPU, workload=wl.name, structure=student.structure)
    assert tech.check(ctx) is None
    tech.tune(TrainConfig(batch_size=8), probe, ctx)
    meta = tech.results(ctx)
    assert meta["teacher_shape"] == {"size": "big"} and meta["teacher_steps_trained"] == 2
    assert meta["teacher_n_params"] > 2 * meta["student_n_params"]
    x = tokens(vocab=23)
    assert tech._teacher(x).shape == student.model(x).shape
    assert TEACHER_SEED == 20_000


def test_distill_is_skipped_naming_the_teacher_it_lacks():
    reason = Distill().check(ctx_for(STRUCT))
    assert reason == ("needs a teacher: return teacher_size from build, or declare width/depth scaling in "
                      "the structure it returns (docs/models.md)")


# ---- transfer:init -------------------------------------------------------------------------------------------------


def test_transfer_init_loads_a_checkpoint_strictly(tmp_path):
    source = llama(seed=7)
    path = tmp_path / "ckpt.pt"
    torch.save(source.state_dict(), path)
    tech = Transfer(Transfer.parse_options({"init": str(path)}))
    ctx = ctx_for(STRUCT, technique_names=("transfer",))
    assert tech.check(ctx) is None
    tech.tune(TrainConfig(batch_size=8), Probe(lambda seed=None: None, CPU), ctx)
    model = tech.transform_model(llama(seed=0), ctx)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values(),
                                                 strict=True))
    found = tech.results(ctx)
    assert found["init"] == str(path) and found["source"]["tensors"] == len(source.state_dict())
    assert found["head_reinitialised"] is False


def test_transfer_init_names_the_missing_and_unexpected_keys(tmp_path):
    state = llama().state_dict()
    state.pop("layers.1.mlp.down_proj.weight")
    state["layers.1.mlp.extra.weight"] = torch.zeros(2)
    state["norm.weight"] = torch.ones(7)
    path = tmp_path / "other.pt"
    torch.save({"state_dict": state}, path)
    tech = Transfer(Transfer.parse_options({"init": str(path)}))
    ctx = ctx_for(STRUCT)
    tech.tune(TrainConfig(batch_size=8), Probe(lambda seed=None: None, CPU), ctx)
    with pytest.raises(ValueError) as info:
        tech.transform_model(llama(), ctx)
    message = str(info.value)
    assert "\n" not in message and "does not match the model" in message
    assert "1 missing key(s): layers.1.mlp.down_proj.weight" in message
    assert "1 unexpected key(s): layers.1.mlp.extra.weight" in message
    assert "norm.weight (7,) for (32,)" in message
    assert key_mismatch(llama().state_dict(), llama()) is None


def test_transfer_needs_an_init_or_a_declared_source_task(tmp_path):
    reason = Transfer().check(ctx_for(STRUCT))
    assert reason and "init=" in reason
    with pytest.raises(Exception, match="absolute path"):
        Transfer.parse_options({"init": "relative.pt"})
    assert "no such file" in Transfer(Transfer.parse_options({"init": str(tmp_path / "none.pt")})).check(ctx_for(STRUCT))
    assert Transfer().check(Context(device=CPU, structure=workloads.get("gpt").structure("tiny"))) is None


# ---- the user path: build returns its structure ----------------------------------------------------------------


def test_a_users_build_returns_its_structure_and_the_plan_sees_it(user_workload):
    built = user_workload.build("small", 0, CPU)
    assert built.structure.attention.rotary and built.structure.mlp.gate == "mlp.gate_proj"
    from bench.plan.user_models import PluginError, _structure_of, validate

    spec = validate({**build(), "structure": {**structure_dict(), "head": "nowhere"}}, "w")
    with pytest.raises(PluginError, match="'nowhere', which is not a submodule"):
        _structure_of(spec, spec.model, None, "w")
    spec = validate({**build(), "structure": None, "teacher_size": None}, "w")
    assert _structure_of(spec, spec.model, "layers", "w").source == "inferred"


# ---- Hugging Face GPT-2 and Llama ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_models():
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed (the trainbench[transformers] extra)")
    wl = workloads.get("hf")
    return {size: wl.build(size, 0, CPU) for size in ("tiny", "llama-tiny")}


@needs_transformers
@pytest.mark.parametrize("size", ["tiny", "llama-tiny"])
def test_hf_structure_is_the_same_from_the_config_and_from_the_size(size, hf_models):
    built = hf_models[size]
    assert built.structure == workloads.get("hf").structure(size)
    for path in (built.structure.blocks, built.structure.embedding, built.structure.final_norm, built.structure.head):
        built.model.get_submodule(path)
    block = built.model.get_submodule(built.structure.blocks)[0]
    a, m = built.structure.attention, built.structure.mlp
    for rel in filter(None, (a.qkv, a.q, a.k, a.v, a.out, m.up, m.gate, m.down)):
        block.get_submodule(rel)


@needs_transformers
@pytest.mark.parametrize("size", ["tiny", "llama-tiny"])
def test_hf_structured_prune_counts(size):
    built = workloads.get("hf").build(size, 0, CPU)
    model, s = built.model, built.structure
    before = sum(p.numel() for p in model.parameters())
    sizes = shrink(channel_groups(model, s), 0.5, None)
    d, L = 64, 2
    hidden = s.mlp.hidden
    keep = round(0.5 * hidden)
    per_unit = 3 * d if s.mlp.gate else 2 * d + 1  # gate + up rows and down columns; GPT-2: c_fc column + bias, c_proj row
    assert before - sum(p.numel() for p in model.parameters()) == L * (hidden - keep) * per_unit
    assert all(v == [hidden, keep] for v in sizes.values())
    assert torch.isfinite(model(tokens(vocab=built.params["vocab_size"]))).all()


@needs_transformers
@pytest.mark.parametrize("size", ["tiny", "llama-tiny"])
def test_hf_gqa_equals_mha_with_duplicated_heads(size):
    built = workloads.get("hf").build(size, 0, CPU)
    model, s = built.model.eval(), built.structure
    a, hd = s.attention, s.attention.head_dim
    with torch.no_grad():
        for block in model.get_submodule(s.blocks):
            if a.qkv:  # GPT-2's c_attn: Conv1D (in, out); the key and value columns of head 1 copied from head 0
                w, b = block.get_submodule(a.qkv).weight, block.get_submodule(a.qkv).bias
                for part in (1, 2):
                    start = part * a.heads * hd
                    w[:, start + hd : start + 2 * hd] = w[:, start : start + hd].clone()
                    b[start + hd : start + 2 * hd] = b[start : start + hd].clone()
            else:
                for rel in (a.k, a.v):
                    w = block.get_submodule(rel).weight
                    w[hd : 2 * hd] = w[:hd].clone()
    x = tokens(vocab=built.params["vocab_size"])
    with torch.no_grad():
        mha = model(x)
    tech = EfficientArch(EfficientArch.Options(kv_heads=1))
    assert tech.check(ctx_for(s)) is None
    tech.transform_model(model, ctx_for(s))
    with torch.no_grad():
        torch.testing.assert_close(model(x), mha, rtol=1e-4, atol=1e-5)


@needs_transformers
@pytest.mark.parametrize("size", ["tiny", "llama-tiny"])
def test_hf_mtp_distill_and_transfer_init(size, tmp_path):
    wl = workloads.get("hf")
    built = wl.build(size, 0, CPU)
    s = built.structure
    x = tokens(vocab=built.params["vocab_size"])
    plain = wl.build(size, 0, CPU).model
    model = MTP().transform_model(built.model, ctx_for(s, sequence_length=64))
    out = model(x)
    assert torch.equal(out.logits, plain(x)) and out.extra["mtp_logits"][0].shape[1] == x.shape[1] - 1
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), plain.eval()(x))
    # distill: the teacher is the same config scaled (twice the width, whole heads)
    from techniques.distill import teacher_params

    student = wl.build(size, 0, CPU)
    teacher = wl.build_from(teacher_params(s, student.params, 2.0, 1), TEACHER_SEED, CPU)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(teacher.model) > 2 * n(student.model) and Distill().check(ctx_for(s)) is None
    # transfer:init: a checkpoint of the other model type is refused with its keys named
    other = wl.build("llama-tiny" if size == "tiny" else "tiny", 0, CPU).model
    path = tmp_path / "other.pt"
    torch.save(other.state_dict(), path)
    tech = Transfer(Transfer.parse_options({"init": str(path)}))
    tech.tune(TrainConfig(batch_size=8), Probe(lambda seed=None: None, CPU), ctx_for(s))
    with pytest.raises(ValueError, match="missing key"):
        tech.transform_model(wl.build(size, 0, CPU).model, ctx_for(s))


# ---- the plan: a user's model, skipped with the part named -----------------------------------------------------


def test_the_plan_asks_the_description(user_workload):
    from bench.plan.config import TechniqueSet, WorkloadSpec
    from bench.plan.planner import incompatibility

    @register
    class Described(Workload):  # a third-party workload whose description lacks a teacher
        name = "structure_test_described"
        sizes = {"tiny": Size()}

        def structure_from(self, params):
            return ModelStructure.from_dict({**structure_dict(), "source": "declared by the test"})

        def build(self, size, seed, device):
            raise NotImplementedError

    try:
        spec = WorkloadSpec("structure_test_described", "tiny")
        assert incompatibility(TechniqueSet.parse("distill"), spec, CPU, 1).startswith("distill: needs a "
                                                                                        "teacher")
        for label in ("prune:mode=structured", "efficient_arch", "mtp", "mtp:variant=sequential"):
            assert incompatibility(TechniqueSet.parse(label), spec, CPU, 1) is None, label
        reason = incompatibility(TechniqueSet.parse("channels_last"), spec, CPU, 1)
        assert "without convolutions" in reason
    finally:
        workloads.base.forget("structure_test_described")


# ---- techniques name no built-in workload --------------------------------------------------------------------------

PORTED = ("prune", "efficient_arch", "mtp", "distill", "channels_last", "sdpa_backend", "transfer", "tp", "pp")
BUILT_IN = ("gpt", "cnn", "cnn_aug", "mlp", "hf")


def _code(path: Path) -> str:
    """The module's code without its docstrings and comments (method cards may cite what was measured where)."""
    text = re.sub(r'"""(?s:.*?)"""', "", path.read_text())
    return "\n".join(line.split("#")[0] for line in text.splitlines())


@pytest.mark.parametrize("module", PORTED)
def test_ported_techniques_name_no_built_in_workload(module):
    code = _code(Path(techniques.__file__).parent / f"{module}.py")
    code = re.sub(r"\.(lacks|missing)\([^)]*\)", "", code)  # the description's part names ("mlp": its MLP)
    names = "|".join(BUILT_IN)
    assert not re.findall(rf"""["']({names})["']""", code)
    assert "ctx.workload ==" not in code and "ctx.workload !=" not in code and "ctx.workload not in" not in code
    assert not re.findall(r"bench\.workloads\.(gpt_chars|cnn_fashion|cnn_aug|mlp_mnist1d|hf_causal)", code)
    assert not re.findall(r"isinstance\([^)]*\b(GPT|ResNet|MLP)\b", code)


def test_the_rotary_helper_is_a_rotation():
    x = torch.randn(1, 2, 5, 8)
    assert torch.allclose(rotary(x).norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert math.isclose(float(rotary(x)[..., 0, :].sub(x[..., 0, :]).abs().max()), 0.0, abs_tol=1e-6)


# ---- the examples: their structure inferred ---------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# label -> (runs on examples/lstm_lm.py, runs on examples/small_resnet.py); None: not refused, not checked here
ON_EXAMPLES = {
    "prune:mode=structured": (False, True), "efficient_arch": (False, True), "mtp": (True, False),
    "mtp:variant=sequential": (True, False), "distill": (False, False), "transfer": (False, False),
    "channels_last": (False, True), "sdpa_backend:backend=math": (True, False),
}


@pytest.fixture(scope="module")
def examples():
    from bench.plan.user_models import parse_model, register_model
    from bench.workloads.cnn_fashion import DEFAULT_DIR, missing_reason

    found = {"lstm_lm": register_model(parse_model(f"ex_lstm={EXAMPLES / 'lstm_lm.py'}:build"))()}
    if missing_reason(Path(DEFAULT_DIR)) is None:
        found["small_resnet"] = register_model(parse_model(f"ex_resnet={EXAMPLES / 'small_resnet.py'}:build"))()
    return found


@pytest.mark.parametrize("example", ["lstm_lm", "small_resnet"])
def test_the_examples_run_or_are_skipped_with_the_part_named(example, examples, tmp_path):
    if example not in examples:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    wl = examples[example]
    built = wl.build("small", 0, CPU)
    s = built.structure
    assert s.source == "inferred" and s.blocks == "blocks"
    column = 0 if example == "lstm_lm" else 1
    for label, runs in ON_EXAMPLES.items():
        tech = TechniqueSpec.parse(label).resolve()
        ctx = Context(device=CPU, workload=wl.name, structure=s, technique_names=(tech.name,),
                      sequence_length=built.tokens_per_sample)
        reason = tech.check(ctx)
        assert (reason is None) == runs[column], (label, reason)
        if reason is not None:
            assert "\n" not in reason
        elif label not in ("distill", "transfer"):
            loop, batches, _ = build_loop(wl.name, label, size="small", budget=Budget(train_steps=4))
            for _ in range(2):
                assert torch.isfinite(loop.step(next(batches)))
    path = tmp_path / "start.pt"  # transfer:init: the example's own checkpoint loads strictly
    torch.save(wl.build("small", 3, CPU).model.state_dict(), path)
    loop, _, _ = build_loop(wl.name, f"transfer:init={path}", size="small", budget=Budget(train_steps=4))
    start = torch.load(path, weights_only=True)
    assert all(torch.equal(v, start[k]) for k, v in loop.model.state_dict().items())


def test_the_plan_gets_a_users_structure_from_the_check_process():
    """The check that builds a user's model before the sweep (a child process) hands its structure to the plan as
    JSON: the same description the trial's build finds."""
    from bench.plan.user_models import parse_model, register_model

    wl = register_model(parse_model(f"ex_lstm_check={EXAMPLES / 'lstm_lm.py'}:build"))()
    planned = wl.structure("small")
    assert planned == wl.build("small", 0, CPU).structure
    assert (planned.embedding, planned.final_norm, planned.head, planned.source) == ("embed", "norm", "head", "inferred")


def test_the_summary_lines_read_a_checkpoint_and_a_teacher_size_and_keep_the_reports_text_otherwise():
    pretrained = [{"pretrain_steps": 150, "source": {"task": "stdlib", "overlaps_target": False}, "pretrain_s": 4.8,
                   "cached": False, "source_first_loss": 4.6, "source_final_loss": 2.1, "head_reinitialised": False},
                  {"pretrain_steps": 150, "source": {"task": "stdlib"}, "pretrain_s": 4.8, "cached": True}]
    assert Transfer.summarize(pretrained).startswith("pretrained 150 steps on stdlib (loss 4.6 -> 2.1), ")
    given = [{"init": "/data/start.pt", "source": {"task": "checkpoint", "sha256": "ab" * 32, "tensors": 9}}]
    assert Transfer.summarize(given) == ("started from /data/start.pt (sha256 abababababab, 9 tensors, loaded "
                                         "strictly); nothing pretrained")
    scaled = [{"teacher_n_params": 4000, "student_n_params": 1000, "width": 2.0, "depth": 1, "teacher_metric": "acc",
               "teacher_eval": {"acc": 0.8}, "teacher_steps_trained": 300, "teacher_train_s": 3.5, "cached": False,
               "alpha": 0.5, "temperature": 2.0, "teacher_shape": {"width": 512, "depth": 3}}]
    assert Distill.summarize(scaled).startswith("teacher 4,000 params (2.0x width, 1x depth; student 1,000), acc 0.8")
    sized = [{**scaled[0], "teacher_shape": {"size": "big"}}]
    assert Distill.summarize(sized).startswith("teacher 4,000 params (size big; student 1,000), acc 0.8 after 300")


def test_a_reason_quotes_only_the_notes_about_the_parts_it_lacks():
    s = ModelStructure(source="inferred", notes=("attention other than nn.MultiheadAttention is not inferred",
                                                 "block 0 (X) could not be traced (E): no channel groups inside it"))
    embedding = s.lacks("embedding")
    assert embedding is not None and "attention" not in embedding and "traced" not in embedding
    assert "attention other than" in (s.lacks("attention") or "")
    assert "could not be traced" in (s.lacks("channels") or "")
