"""Tensor parallelism (``tp``): 2 real gloo ranks through torchrun on CPU, and the surgery in one process.

- the head-major qkv surgery alone is the same math: outputs equal the original model's bit for bit, gradients
  up to float32 rounding;
- 10 AdamW steps of gpt:tiny under tp give the single process's per-step losses (rtol 1e-4), the same loss on both
  ranks, and the same parameters after training (gathered with full_tensor);
- per-rank parameter bytes are the sharded projections / 2 plus everything else, computed from the model's shapes;
- the recorded communication equals the bytes of the all-reduces torch actually dispatched in a training step,
  also with checkpointing's recompute and bf16 autocast;
- check() refuses one process, other workloads, compile, zero3 on too few ranks, a degree that leaves replicas,
  and (at build) a model without GPT's blocks or with heads that do not divide;
- a real trial through the runner finishes with status ok and parity.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from bench import workloads
from bench.loop import plain_loop
from techniques import get
from techniques.base import Context
from techniques.tp import HeadMajorAttention, head_major_rows, structure_problem
from tests.conftest import REPO
from tests.helpers import whole_batch_trial
from tests.tp_worker import BATCH, STEPS

CPU = torch.device("cpu")


def gpt_tiny():
    return workloads.get("gpt").build("tiny", 0, CPU)


def torchrun(*args: str, timeout: float = 240) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "tests" / "tp_worker.py"), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---- one process ------------------------------------------------------------------------------------------------


def test_head_major_surgery_is_the_same_math():
    built = gpt_tiny()
    original = built.model
    surgered = copy.deepcopy(original)
    for block in surgered.blocks:
        block.attn = HeadMajorAttention.from_fused(block.attn)
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
    return Context(device=CPU, workload=workload, world_size=world, technique_names=names)


def test_check_reasons():
    tp = get("tp")()
    assert tp.check(ctx_for()) is None
    assert "needs several processes" in tp.check(ctx_for(world=1))
    assert "workload 'mlp' has no such structure" in tp.check(ctx_for("mlp"))
    assert "workload 'cnn' has no such structure" in tp.check(ctx_for("cnn"))
    assert "tp with compile is not supported" in tp.check(ctx_for(names=("tp", "compile")))
    assert "loss scaler checks each rank's local gradient shards" in tp.check(ctx_for(names=("tp", "fp16")))
    reason = tp.check(ctx_for(names=("tp", "zero3")))
    assert "at least 4 ranks; this sweep has 2" in reason and "\n" not in reason
    assert "not implemented" in tp.check(ctx_for(world=4, names=("tp", "zero2")))
    assert "leaves 2 data-parallel replicas" in get("tp")(get("tp").parse_options({"degree": "2"})).check(
        ctx_for(world=4))
    assert "does not divide" in get("tp")(get("tp").parse_options({"degree": "3"})).check(ctx_for(world=4))


def test_plan_refuses_tp_with_ddp_and_says_why_zero3_needs_more_ranks():
    from bench.config import build_config
    from bench.plan import plan

    cfg = build_config("smoke", {"workloads": "gpt,mlp", "techniques": "tp,tp+ddp,tp+zero3", "repeats": 1,
                                 "nproc": 2})
    reasons = {(t.workload.name, t.techniques.label): t.skip_reason for t in plan(cfg, CPU)}
    assert reasons[("gpt", "tp")] is None
    assert "cannot be combined with ddp" in reasons[("gpt", "tp+ddp")]
    assert "at least 4 ranks" in reasons[("gpt", "tp+zero3")]
    assert "has no such structure" in reasons[("mlp", "tp")]


def test_structure_problems_are_found_when_the_model_is_built():
    gpt = gpt_tiny().model  # n_head 2
    ctx = Context(device=CPU, world_size=4)
    assert structure_problem(gpt, ctx, 2) is None
    assert "n_head divisible by it; the model has n_head=2" in structure_problem(gpt, ctx, 4)
    mlp = workloads.get("mlp").build("tiny", 0, CPU).model
    reason = structure_problem(mlp, Context(device=CPU, blocks=None), 2)
    assert "needs a model with blocks" in reason
    blocks = torch.nn.Module()
    blocks.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    assert "block 0 has attn NoneType, mlp NoneType" in structure_problem(blocks, Context(device=CPU), 2)
    dropout = workloads.get("gpt").build("tiny", 0, CPU).model
    dropout.drop.p = 0.1
    assert "dropout is not exact" in structure_problem(dropout, ctx, 2)


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
def tp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    torchrun("tp", str(out))
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
def test_communication_follows_what_runs(label, tmp_path):
    """Counted from what runs, not a formula: checkpointing's recompute all-reduces attention's output again (not the
    MLP's: the recompute stops once it has what backward needs), and under bf16 autocast the forward all-reduces
    move bf16 activations while the input gradients stay fp32."""
    torchrun(label, str(tmp_path), "2")
    p = gpt_tiny().params
    activation = BATCH * p["seq_len"] * p["d_model"] * 4
    for r in (0, 1):
        rank = json.loads((tmp_path / f"rank{r}.json").read_text())
        seen = [b for name, b in rank["collectives"] if name.startswith("all_reduce")]
        assert rank["results"]["bytes_per_step"] == sum(seen)
        assert rank["results"]["communication_detail"]["collectives_per_step"] == len(seen)
        if label == "tp+checkpointing":
            assert len(seen) == 5 * p["n_layer"]
        else:
            assert sum(seen) == p["n_layer"] * (2 * activation // 2 + 2 * activation)


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
