"""Data-parallel and sharding techniques with 2 real gloo ranks (torchrun) on CPU.

- parameters after 10 fp32 AdamW steps match one process with the same global batch (atol 1e-4);
- per-rank model-state bytes (local shards) equal the ZeRO formula exactly on an evenly divisible model;
- ddp / zero1-3 combine with bf16, grad_accum, checkpointing and compile (trials finish, parity holds);
- a rank that raises ends the trial as a failed record carrying that rank's error, leaving no processes behind;
- a rank that hangs ends the trial at the runner's timeout, every rank killed (each is a session leader of its own
  under torchrun, so killing the launcher's process group alone would leave them running).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest
import torch

from bench import workloads
from bench.core.structure import ModelStructure
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import build_config
from bench.run.runner import SweepRunner
from techniques._distributed import zero_formula_bytes
from techniques.base import Context
from tests.conftest import TINY_BUDGET, runs_of
from tests.dist_worker import BATCH, STEPS
from tests.torchrun_jobs import OUT, Job

pytestmark = pytest.mark.distributed

# every 2-rank job of this file, run with test_local_sgd's and test_fedavg's in one torchrun launch (conftest's
# dist_runs)
JOBS = {
    **{f"params-{t}": Job("dist_worker", (t, OUT)) for t in ("ddp", "zero1", "zero3")},
    **{f"balanced-{t}": Job("dist_worker", (t, OUT, "balanced")) for t in ("ddp", "zero1", "zero3")},
}


@pytest.fixture(scope="module")
def runs(dist_runs) -> dict[str, Path]:
    return runs_of(dist_runs, "test_distributed")


@pytest.fixture(scope="module")
def single_process_params():
    built = workloads.get("mlp").build("tiny", 0, torch.device("cpu"))
    ctx = Context(device=torch.device("cpu"))
    loop = TrainLoop(built.model, build_optimizer(built.model, [], ctx, built.lr), built.loss_fn, [], ctx)
    batches = built.batches(BATCH, 0)
    for _ in range(STEPS):
        loop.step(next(batches))
    return {k: v.detach().clone() for k, v in built.model.named_parameters()}


@pytest.mark.parametrize("technique", ["ddp", "zero1", "zero3"])
def test_parameters_match_a_single_process(technique, runs, single_process_params):
    params = torch.load(runs[f"params-{technique}"] / "params.pt")
    assert params.keys() == single_process_params.keys()
    for key, expected in single_process_params.items():
        assert torch.allclose(params[key], expected, atol=1e-4), key
        assert not torch.equal(expected, workloads.get("mlp").build("tiny", 0, torch.device("cpu")).model
                               .state_dict()[key]), "training moved nothing"


@pytest.mark.parametrize(("technique", "stage"), [("ddp", 0), ("zero1", 1), ("zero3", 3)])
def test_per_rank_model_state_equals_the_zero_formula(technique, stage, runs):
    n_params = 4 * 64 * 64
    expected = zero_formula_bytes(stage, n_params, world=2)
    for rank in (0, 1):
        got = json.loads((runs[f"balanced-{technique}"] / f"state_rank{rank}.json").read_text())
        assert got["params"] == expected["params"]
        assert got["grads"] == expected["grads"]
        assert got["optimizer"] == expected["optimizer"]
    total = sum(expected[k] for k in ("params", "grads", "optimizer"))
    per_param = {0: 16, 1: 8 + 8 / 2, 3: 16 / 2}[stage]
    assert total == per_param * n_params


@pytest.mark.slow  # a whole sweep of 2-rank trials in subprocesses (CI runs -m slow)
def test_a_raising_rank_becomes_a_failed_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_FAULT_RANK", "1")
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 2,
                                 "budget": {**TINY_BUDGET, "timeout_s": 120}})
    started = time.monotonic()
    records = SweepRunner(cfg, tmp_path / "s", torch.device("cpu")).run()
    ddp = [r for r in records if r.technique_label == "ddp"]
    assert len(ddp) == 1 and ddp[0].status == "failed"
    assert "rank 1: RuntimeError: injected fault on rank 1" in ddp[0].reason
    assert time.monotonic() - started < 120
    assert _trial_processes() == []


# Each sharding technique with the single-process techniques it must combine with (docs/distributed.md's promise).
COMBINATIONS = ["ddp+bf16", "zero1+grad_accum:steps=2", "zero2+checkpointing", "zero3+bf16+checkpointing",
                "zero3+grad_accum:steps=2", "zero3+compile"]


@pytest.mark.slow  # a whole sweep of 2-rank trials in subprocesses (CI runs -m slow)
def test_sharding_combines_with_bf16_grad_accum_checkpointing_and_compile(tmp_path):
    cfg = build_config("smoke", {"workloads": "gpt", "techniques": ",".join(COMBINATIONS), "repeats": 1,
                                 "nproc": 2, "budget": {**TINY_BUDGET, "timeout_s": 180}})
    # a numeric set that ran faster gets a quality-only continuation under the same label: read the planned trial
    records = {r.technique_label: r for r in SweepRunner(cfg, tmp_path / "s", torch.device("cpu")).run()
               if not r.continues}
    for label in COMBINATIONS:
        r = records[label]
        assert r.status == "ok", f"{label}: {r.reason}"
        assert r.world_size == 2 and r.memory.zero_formula_bytes["total"] > 0
        assert r.parity.ok, (f"{label}: differs from one process: losses by {r.parity.loss_rel_diff}, parameter "
                             f"distance by {r.parity.distance_rel_diff}")
        # the quality run trained the same samples as one process would, on two ranks
        assert r.quality.samples_trained == TINY_BUDGET["train_steps"] * r.build.batch_size


def _trial_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if "bench.trial" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow  # a whole sweep of 2-rank trials in subprocesses (CI runs -m slow)
def test_a_hanging_rank_times_out_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBENCH_FAULT_RANK", "1")
    monkeypatch.setenv("TRAINBENCH_FAULT", "hang")
    timeout = 30  # rank 0 meanwhile starts its trial (a few seconds) and waits for rank 1 in the first collective
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 2,
                                 "budget": {**TINY_BUDGET, "max_train_seconds": 20.0, "timeout_s": timeout}})
    started = time.monotonic()
    records = SweepRunner(cfg, tmp_path / "s", torch.device("cpu")).run()
    ddp = [r for r in records if r.technique_label == "ddp"]
    assert len(ddp) == 1 and ddp[0].status == "timeout", ddp[0].reason
    assert time.monotonic() - started < 2 * timeout + 60  # the baseline trial runs too
    assert _trial_processes() == []


def test_world_size_one_skips_with_the_fix():
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp,zero3+offload,offload", "repeats": 1})
    from bench.plan.planner import plan

    reasons = {t.techniques.label: t.skip_reason for t in plan(cfg, torch.device("cpu"))}
    assert "needs several processes: run the sweep with --nproc 2" in reasons["ddp"]
    assert "offload modifies FSDP sharding: combine it with zero2 or zero3" in reasons["offload"]


def test_fsdp_with_compile_needs_blocks():
    from bench.plan.planner import plan

    cfg = build_config("smoke", {"workloads": "gpt", "techniques": "zero3+compile,ddp+compile", "repeats": 1,
                                 "nproc": 2})
    reasons = {t.techniques.label: t.skip_reason for t in plan(cfg, torch.device("cpu"))}
    assert reasons["zero3+compile"] is None and reasons["ddp+compile"] is None
    ctx = Context(device=torch.device("cpu"), world_size=2, structure=ModelStructure(source="test: no blocks"),
                  technique_names=("zero3", "compile"))
    from techniques._distributed import fsdp_check

    assert "got mixed torch.Tensor and DTensor" in fsdp_check(ctx, "zero3")


def test_ddp_bucket_view_option_reaches_ddp(one_rank_group):
    from bench.plan.config import TechniqueSpec

    ctx = Context(device=torch.device("cpu"), world_size=1)
    for label, expected in (("ddp", False), ("ddp:bucket_view=true", True)):
        model = TechniqueSpec.parse(label).resolve().transform_model(torch.nn.Linear(4, 4), ctx)
        assert model.gradient_as_bucket_view is expected


@pytest.mark.parametrize("label", ["ddp", "zero1"])
def test_grad_accum_under_ddp_all_reduces_once_per_step(label, one_rank_group):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from bench.plan.config import TechniqueSpec

    ctx = Context(device=torch.device("cpu"), world_size=1)
    techs = [TechniqueSpec.parse(label).resolve()]
    model = techs[0].transform_model(torch.nn.Linear(8, 2), ctx)
    reductions = []

    def counting_hook(state, bucket):  # DDP calls it once per gradient bucket it all-reduces
        reductions.append(bucket.index())
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    loop = TrainLoop(model, build_optimizer(model, techs, ctx, 1e-3), torch.nn.functional.cross_entropy, techs,
                     ctx, micro_batches=4)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
    loop.step((x, y))
    assert reductions == [0]  # one bucket, reduced once: the first three micro-batches ran under no_sync
    loop.step((x, y))
    assert reductions == [0, 0]
