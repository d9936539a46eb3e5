"""Tensor parallelism (``tp``): 2 real gloo ranks through torchrun on CPU, and the surgery in one process.

- the head-major qkv surgery alone is the same math: outputs equal the original model's bit for bit, gradients
  up to float32 rounding;
- 10 AdamW steps of gpt:tiny under tp give the single process's per-step losses (rtol 1e-4), the same loss on both
  ranks, and the same parameters after training (gathered with full_tensor);
- per-rank parameter bytes are the sharded projections / 2 plus everything else, computed from the model's shapes;
- the recorded communication equals the bytes of the all-reduces torch actually dispatched in a training step,
  also with checkpointing's recompute and bf16 autocast;
- check() refuses one process, compile, zero3 on too few ranks, a degree that leaves replicas, and, from the model's
  description, a model without attention or MLP, nn.MultiheadAttention, GPT-2's transposed Conv1D, a fused qkv tp
  cannot split into whole heads of the same math, heads that do not divide; at build, dropout;
- a Llama-style decoder the built-in workloads do not contain (tests/decoders.py: separate q/k/v with rotary
  embeddings inside the attention, grouped key/value heads, a gated MLP, RMSNorm) trains under tp on 2 ranks as in
  one process (losses and parameters), keeping its own attention forward;
- the same decoder with an attention that hard-codes its head count is refused by the probe guard, one line, on
  every rank: silently other math (view(B, T, n_heads, -1)) and an outright failure (view(B, T, n_heads, hd));
- a real trial through the runner finishes with status ok and parity.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json

import pytest
import torch

from bench import workloads
from bench.core.structure import MLP, ModelStructure
from bench.loop import plain_loop
from techniques import get
from techniques.base import Context
from techniques.tp import HeadMajorAttention, description_problem, head_major_rows, model_problem
from tests import decoders
from tests.helpers import TechniqueSettings, whole_batch_trial
from tests.torchrun_jobs import OUT, Job, launch
from tests.tp_worker import BATCH, STEPS

SETTINGS = TechniqueSettings("tp", "gpt", runs_on="torchrun")

CPU = torch.device("cpu")


def gpt_tiny():
    return workloads.get("gpt").build("tiny", 0, CPU)


# every 2-rank job of this file, in one torchrun launch (tests/torchrun_jobs.py)
JOBS = {
    "tp": Job("tp_worker", ("tp", OUT)),
    "tp+checkpointing": Job("tp_worker", ("tp+checkpointing", OUT, "2")),
    "tp+bf16": Job("tp_worker", ("tp+bf16", OUT, "2")),
    "llama": Job("tp_worker", ("tp", OUT, str(STEPS), "build")),
    "inferred": Job("tp_worker", ("tp", OUT, str(STEPS), "build_inferred")),
    "refuse": Job("tp_worker", ("refuse", OUT, "0", "build_silent,build_fails")),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch(JOBS, tmp_path_factory.mktemp("torchrun"))


# ---- one process ------------------------------------------------------------------------------------------------


def test_head_major_surgery_is_the_same_math():
    built = gpt_tiny()
    original = built.model
    surgered = copy.deepcopy(original)
    for block in surgered.blocks:
        block.attn = HeadMajorAttention.from_fused(block.attn.qkv, block.attn.proj, 2, 32)
    x, y = next(built.batches(BATCH, 0))
    out_a, out_b = original(x), surgered(x)
    assert torch.equal(out_a, out_b)
    built.loss_fn(out_a, y).backward()
    built.loss_fn(out_b, y).backward()
    order = head_major_rows(2, 32)
    for a, b in zip(original.blocks, surgered.blocks, strict=True):
        # backward takes another memory layout through SDPA: equal up to float32 rounding, not bit for bit
        torch.testing.assert_close(a.attn.qkv.weight.grad[order], b.attn.qkv.weight.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(a.mlp.fc.weight.grad, b.mlp.fc.weight.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(original.wte.weight.grad, surgered.wte.weight.grad, rtol=1e-5, atol=1e-7)


def test_head_major_rows_give_each_shard_whole_heads():
    n_head, hd = 4, 3
    order = head_major_rows(n_head, hd)
    assert sorted(order.tolist()) == list(range(3 * n_head * hd))  # a permutation
    d = n_head * hd
    for rank in range(2):  # rank r's contiguous half: heads 2r, 2r+1, each with its q, k and v rows
        rows = order.reshape(2, -1)[rank].tolist()
        heads = {h for h in range(n_head) if set(range(h * hd, (h + 1) * hd)) <= set(rows)}
        assert heads == {2 * rank, 2 * rank + 1}
        for h in heads:
            for part in range(3):
                assert set(range(part * d + h * hd, part * d + (h + 1) * hd)) <= set(rows)


def ctx_for(workload: str = "gpt", world: int = 2, names: tuple[str, ...] = ("tp",)) -> Context:
    structure = workloads.get(workload).structure("tiny")
    return Context(device=CPU, workload=workload, world_size=world, technique_names=names, structure=structure)


def test_check_reasons():
    tp = get("tp")()
    assert tp.check(ctx_for()) is None
    assert "needs several processes" in tp.check(ctx_for(world=1))
    assert tp.check(Context(device=CPU, world_size=2, technique_names=("tp",))) is None  # no model named yet
    assert tp.check(ctx_for("mlp")).startswith("needs the model's attention (its projections and heads)")
    assert "needs the model's attention" in tp.check(ctx_for("cnn"))
    assert "tp with compile is not supported" in tp.check(ctx_for(names=("tp", "compile")))
    assert "loss scaler checks each rank's local gradient shards" in tp.check(ctx_for(names=("tp", "fp16")))
    reason = tp.check(ctx_for(names=("tp", "zero3")))
    assert "at least 4 ranks; this sweep has 2" in reason and "\n" not in reason
    assert "not implemented" in tp.check(ctx_for(world=4, names=("tp", "zero2")))
    assert "leaves 2 data-parallel replicas" in get("tp")(get("tp").parse_options({"degree": "2"})).check(
        ctx_for(world=4))
    assert "does not divide" in get("tp")(get("tp").parse_options({"degree": "3"})).check(ctx_for(world=4))


def test_plan_refuses_tp_with_ddp_and_says_why_zero3_needs_more_ranks():
    from bench.plan.config import build_config
    from bench.plan.planner import plan

    cfg = build_config("smoke", {"workloads": "gpt,mlp", "techniques": "tp,tp+ddp,tp+zero3", "repeats": 1,
                                 "nproc": 2})
    reasons = {(t.workload.name, t.techniques.label): t.skip_reason for t in plan(cfg, CPU)}
    assert reasons[("gpt", "tp")] is None
    assert "cannot be combined with ddp" in reasons[("gpt", "tp+ddp")]
    assert "at least 4 ranks" in reasons[("gpt", "tp+zero3")]
    assert "needs the model's attention" in reasons[("mlp", "tp")]


LLAMA = ModelStructure.from_dict(decoders.STRUCTURE)


def _with(s: ModelStructure, **attention) -> ModelStructure:
    block = dataclasses.replace(s.block, attention=dataclasses.replace(s.attention, **attention))
    return dataclasses.replace(s, block=block)


def test_the_description_says_what_tp_cannot_split():
    gpt = workloads.get("gpt").structure("tiny")  # fused qkv, 2 heads
    assert description_problem(gpt, 2) is None and description_problem(LLAMA, 2) is None
    assert description_problem(gpt, 4) == "tp:degree=4 needs the model's attention heads divisible by it; the model has 2"
    assert "key/value heads divisible by it; the model has 2" in description_problem(LLAMA, 4)
    odd = dataclasses.replace(LLAMA, block=dataclasses.replace(LLAMA.block, mlp=dataclasses.replace(LLAMA.mlp,
                                                                                                    hidden=49)))
    assert description_problem(odd, 2) == "tp:degree=2 needs the model's MLP hidden units divisible by it; the model has 49"
    reasons = {
        "packed": description_problem(_with(LLAMA, packed=True), 2),
        "transposed": description_problem(_with(gpt, transposed=True), 2),
        "rotary": description_problem(_with(gpt, rotary=True), 2),
        "grouped": description_problem(_with(gpt, kv_heads=1), 2),
        "no out": description_problem(_with(LLAMA, out=None), 2),
        "no mlp": description_problem(workloads.get("mlp").structure("tiny"), 2),
    }
    assert "(nn.MultiheadAttention) computes them inside its forward" in reasons["packed"]
    assert "stores them (in, out) (GPT-2's Conv1D)" in reasons["transposed"]
    assert "would drop this model's rotary embeddings: describe separate q, k, v" in reasons["rotary"]
    assert "as many key/value heads as query heads (1 and 2 here)" in reasons["grouped"]
    assert reasons["no out"].endswith("names no output projection")
    assert reasons["no mlp"].startswith("needs the model's attention (its projections and heads)")
    assert all("\n" not in r for r in reasons.values())


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_hugging_face_gpt2_is_refused_naming_its_conv1d_and_llama_is_not():
    hf = workloads.get("hf")
    assert "stores them (in, out) (GPT-2's Conv1D)" in description_problem(hf.structure("tiny"), 2)
    assert description_problem(hf.structure("llama-tiny"), 2) is None


def test_what_only_the_built_model_shows():
    gpt = gpt_tiny().model
    s = gpt.trainbench_structure()
    assert model_problem(gpt, s, 2) is None
    gpt.drop.p = 0.1
    assert "dropout is not exact" in model_problem(gpt, s, 2)
    gpt = gpt_tiny().model
    gpt.blocks[1].mlp.fc = torch.nn.Sequential(gpt.blocks[1].mlp.fc)
    assert model_problem(gpt, s, 2) == "tp shards nn.Linear projections; the model's block 1 has mlp.fc as a Sequential"


# ---- two ranks ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single_process():
    built = gpt_tiny()
    loop = plain_loop(built, built.lr, CPU)
    batches = built.batches(BATCH, 0)
    losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
    params = {k: v.detach().clone() for k, v in built.model.named_parameters()}
    return losses, params


@pytest.fixture(scope="module")
def tp_run(runs):
    out = runs["tp"]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return ranks, torch.load(out / "params.pt")


distributed = pytest.mark.distributed  # the tests that launch torchrun


@distributed
def test_tp_gives_the_single_process_losses_and_parameters(tp_run, single_process):
    ranks, params = tp_run
    ref_losses, ref_params = single_process
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the loss is the same on every rank, bit for bit
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"]
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(ref_losses), rtol=1e-4, atol=0)
    assert params.keys() == ref_params.keys()
    initial = gpt_tiny().model.state_dict()
    d = gpt_tiny().params["d_model"]
    for key, expected in ref_params.items():
        got, start = params[key], initial[key].to(expected)
        if key.endswith("attn.qkv.bias"):
            # The key bias's true gradient is zero (it adds q.b_k to every score of a query: softmax ignores it), so
            # what AdamW does with it is normalised rounding noise, in one process as under tp: compared loosely.
            torch.testing.assert_close(got[d:2 * d], expected[d:2 * d], rtol=0, atol=1e-4, msg=key)
            got, expected = torch.cat([got[:d], got[2 * d:]]), torch.cat([expected[:d], expected[2 * d:]])
            start = torch.cat([start[:d], start[2 * d:]])
        # What training did to the tensor, tp against one process: the updates' difference relative to the update.
        # (An element-wise tolerance failed on an AMD EPYC with avx512_bf16 for 1 element of 16,384 in
        # blocks.1.mlp.fc.weight: 3.2e-5 apart after moving 3e-3, AdamW normalising the rounding of a tiny gradient.
        # A 10% learning-rate error moves every update by 10%: this still catches it a hundred times over.)
        moved = (expected - start).norm()
        assert moved > 0, f"training moved nothing: {key}"
        assert float((got - expected).norm() / moved) < 1e-3, key


@distributed
def test_per_rank_parameter_bytes_are_the_sharded_fraction(tp_run):
    ranks, _ = tp_run
    model = gpt_tiny().model
    sharded = sum(p.numel() for n, p in model.named_parameters()
                  if n.split(".", 2)[-1] in ("attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                             "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight"))
    # row-parallel biases (attn.proj.bias, mlp.proj.bias) are replicated: added once after the all-reduce
    total = sum(p.numel() for p in model.parameters())  # the tied head counted once
    expected = 4 * (sharded // 2 + (total - sharded))
    for rank in ranks:
        assert rank["param_bytes"] == expected
        assert rank["results"]["param_bytes_per_rank"] == expected
        assert rank["results"]["degree"] == 2 and rank["results"]["local_heads"] == 1


@distributed
def test_communication_is_what_torch_all_reduced(tp_run):
    ranks, _ = tp_run
    p = gpt_tiny().params
    activation = BATCH * p["seq_len"] * p["d_model"] * 4  # fp32 (B, T, d_model)
    for rank in ranks:
        seen = [b for name, b in rank["collectives"] if name.startswith("all_reduce")]
        assert len(seen) == 4 * p["n_layer"]  # 2 in forward, 2 in backward per block
        assert set(seen) == {activation}
        assert rank["results"]["bytes_per_step"] == sum(seen)
        assert rank["results"]["communication_detail"]["collectives_per_step"] == len(seen)


@distributed
@pytest.mark.parametrize("label", ["tp+checkpointing", "tp+bf16"])
def test_communication_follows_what_runs(label, runs):
    """Counted from what runs, not a formula: checkpointing's recompute all-reduces attention's output again (not the
    MLP's: the recompute stops once it has what backward needs), and under bf16 autocast the forward all-reduces
    move bf16 activations while the input gradients stay fp32."""
    p = gpt_tiny().params
    activation = BATCH * p["seq_len"] * p["d_model"] * 4
    for r in (0, 1):
        rank = json.loads((runs[label] / f"rank{r}.json").read_text())
        seen = [b for name, b in rank["collectives"] if name.startswith("all_reduce")]
        assert rank["results"]["bytes_per_step"] == sum(seen)
        assert rank["results"]["communication_detail"]["collectives_per_step"] == len(seen)
        if label == "tp+checkpointing":
            assert len(seen) == 5 * p["n_layer"]
        else:
            assert sum(seen) == p["n_layer"] * (2 * activation // 2 + 2 * activation)


# ---- a model the built-in workloads do not contain ---------------------------------------------------------------


def _relative_moves(got: dict, expected: dict, initial: dict) -> dict[str, float]:
    """Per tensor: how far tp's training ended from one process's, relative to how far one process moved it."""
    out = {}
    for key, want in expected.items():
        moved = (want - initial[key]).norm()
        assert moved > 0, f"training moved nothing: {key}"
        out[key] = float((got[key] - want).norm() / moved)
    return out


@distributed
def test_a_llama_style_decoder_trains_under_tp_as_in_one_process(runs):
    built = decoders.workload().build("default", 0, CPU)
    initial = {k: v.detach().clone() for k, v in built.model.named_parameters()}
    loop = plain_loop(built, built.lr, CPU)
    batches = built.batches(BATCH, 0)
    ref_losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
    ref_params = {k: v.detach().clone() for k, v in built.model.named_parameters()}

    ranks = [json.loads((runs["llama"] / f"rank{r}.json").read_text()) for r in (0, 1)]
    params = torch.load(runs["llama"] / "params.pt")
    assert ranks[0]["losses"] == ranks[1]["losses"]
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(ref_losses), rtol=1e-4, atol=0)
    assert params.keys() == ref_params.keys()
    assert max(_relative_moves(params, ref_params, initial).values()) < 1e-3
    found = ranks[0]["results"]
    assert (found["n_head"], found["local_heads"], found["kv_heads"], found["projections"]) == (4, 2, 2, "separate")
    assert found["probe"]["max_rel_diff"] < 1e-5
    # the model's own attention ran on a rank's heads: q, k, v, gate, up column-parallel, o and down row-parallel,
    # so 2 all-reduces forward and 5 backward per layer, each of a (B, T, d_model) fp32 activation
    seen = [b for name, b in ranks[0]["collectives"] if name.startswith("all_reduce")]
    assert seen == [BATCH * decoders.T * decoders.D * 4] * (7 * decoders.LAYERS)
    assert found["bytes_per_step"] == sum(seen)


@distributed
def test_tp_and_structured_prune_read_one_inferred_description(runs):
    """A model that returns no structure (a GPT-2-style decoder): the harness infers it once, and tp shards the same
    attention and MLP that prune:mode=structured shrinks; tp trains as one process does."""
    from techniques.prune import Prune, channel_groups

    built = decoders.workload("build_inferred").build("default", 0, CPU)
    s = built.structure
    assert s.source == "inferred" and s.blocks == "h"
    assert s.mlp == MLP(up="mlp.c_fc", down="mlp.c_proj", hidden=decoders.HIDDEN)
    assert (s.attention.qkv, s.attention.out, s.attention.heads, s.attention.head_dim) == \
        ("attn.c_attn", "attn.c_proj", decoders.HEADS, decoders.D // decoders.HEADS)
    assert get("tp")().check(Context(device=CPU, world_size=2, structure=s, technique_names=("tp",))) is None
    prune = Prune(Prune.Options(mode="structured", sparsity=0.5, start=0.0))
    assert prune.check(Context(device=CPU, structure=s)) is None
    groups = channel_groups(built.model, s)
    assert [g.name for g in groups] == ["h.0.mlp", "h.1.mlp"]  # each block's MLP, once: the MLP tp shards

    initial = {k: v.detach().clone() for k, v in built.model.named_parameters()}
    loop = plain_loop(built, built.lr, CPU)
    batches = built.batches(BATCH, 0)
    ref_losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
    ref_params = {k: v.detach().clone() for k, v in built.model.named_parameters()}
    ranks = [json.loads((runs["inferred"] / f"rank{r}.json").read_text()) for r in (0, 1)]
    torch.testing.assert_close(torch.tensor(ranks[0]["losses"]), torch.tensor(ref_losses), rtol=1e-4, atol=0)
    moves = _relative_moves(torch.load(runs["inferred"] / "params.pt"), ref_params, initial)
    assert max(moves.values()) < 1e-3, {k: v for k, v in moves.items() if v >= 1e-3}
    assert "mlp.c_fc (colwise)" in ranks[0]["results"]["sharded"]


@distributed
def test_an_attention_that_hard_codes_its_head_count_is_refused_by_the_guard(runs):
    refused = [json.loads((runs["refuse"] / f"refused{r}.json").read_text()) for r in (0, 1)]
    assert refused[0] == refused[1]  # every rank decides alike
    silent, fails = refused[0]["build_silent"], refused[0]["build_fails"]
    assert silent.startswith("tp: the sharded model's output differs from the whole model's on a probe input "
                             "(largest difference ")
    assert fails.startswith("tp: the sharded model fails on a probe input (RuntimeError: ")
    for reason in (silent, fails):
        assert "its attention's forward likely assumes the full head count" in reason and "\n" not in reason


@pytest.mark.slow
@distributed
def test_a_tp_trial_through_the_runner(tmp_path):
    r = whole_batch_trial(tmp_path, "tp")
    found = r.technique_results["tp"]
    assert found["degree"] == 2 and found["bytes_per_step"] > 0
    run = found["communication"]["quality_run"]
    assert run["steps"] > 0 and run["bytes"] == run["steps"] * found["bytes_per_step"]
    assert run["samples"] == run["steps"] * r.workload["batch_size"]  # each rank trains the whole batch
    assert r.memory.per_rank[0]["model_state"]["params"] == found["param_bytes_per_rank"]
