"""Local SGD with 2 real gloo ranks (torchrun) on CPU.

- with H = 1, no warm-up and plain SGD it is DDP: the parameters after 10 steps match DDP's (averaging the ranks'
  SGD updates is the update of the averaged gradient);
- with H = 4 it is not DDP any more, and the bytes it counts are the gradient buckets of each warm-up step plus the
  parameters of each average, exactly;
- evaluation sees the ranks' average (the ranks' own models have drifted since the last average);
- the warm-up follows the trial's step count: started past the plan (a speed window), no step is a DDP step;
- options, the one-process check and fp16 give their reasons.
"""

from __future__ import annotations

import json

import pytest
import torch

from bench import workloads
from bench.plan.config import ConfigError, TechniqueSpec
from techniques.base import Context
from techniques.local_sgd import LocalSGD
from tests.conftest import runs_of
from tests.helpers import TechniqueSettings
from tests.torchrun_jobs import OUT, Job

SETTINGS = TechniqueSettings("local_sgd:period=2:warmup=1", "mlp", runs_on="torchrun")

STEPS = 10
# every 2-rank job of this file, run with test_distributed's and test_fedavg's in one torchrun launch (conftest's
# dist_runs); plain SGD, under which local SGD can equal DDP
JOBS = {name: Job("dist_worker", (techniques, OUT, "mlp", str(STEPS), "sgd"), env)
        for name, techniques, env in [
            ("ddp", "ddp", {}),
            ("period-1", "local_sgd:period=1:warmup=0", {}),
            ("period-4", "local_sgd:period=4:warmup=2", {}),
            # a speed window starts at ctx.step = the plan's steps (here 100, past warmup=10)
            ("past-the-plan", "local_sgd:period=4:warmup=10", {"TRAINBENCH_TEST_START_STEP": "100"}),
        ]}


def n_params() -> int:
    return sum(p.numel() for p in workloads.get("mlp").build("tiny", 0, torch.device("cpu")).model.parameters())


@pytest.fixture(scope="module")
def runs(dist_runs):
    return runs_of(dist_runs, "test_local_sgd")


@pytest.fixture(scope="module")
def ddp_sgd(runs):
    return torch.load(runs["ddp"] / "params.pt")


@pytest.mark.distributed
def test_period_one_without_warmup_is_ddp_under_sgd(runs, ddp_sgd):
    params = torch.load(runs["period-1"] / "params.pt")
    initial = workloads.get("mlp").build("tiny", 0, torch.device("cpu")).model.state_dict()
    for key, expected in ddp_sgd.items():
        assert torch.allclose(params[key], expected, atol=1e-6), key
        assert not torch.equal(expected, initial[key]), "training moved nothing"
    counted = json.loads((runs["period-1"] / "results_rank0.json").read_text())["local_sgd"]["communication"]
    assert counted["quality_run"]["bytes"] == STEPS * 4 * n_params()  # one parameter average per step, no buckets


@pytest.mark.distributed
def test_period_four_drifts_from_ddp_and_counts_what_it_sends(runs, ddp_sgd):
    out = runs["period-4"]
    params = torch.load(out / "params.pt")
    assert any(not torch.allclose(params[k], v, atol=1e-6) for k, v in ddp_sgd.items())
    for rank in (0, 1):
        counted = json.loads((out / f"results_rank{rank}.json").read_text())["local_sgd"]["communication"]
        run = counted["quality_run"]
        # steps 0-1 all-reduce every gradient bucket (DDP); the averager then averages at steps 2 and 6 (of 0-9)
        assert run["bytes"] == (2 + 2) * 4 * n_params()
        assert run["samples"] == STEPS * 64 and run["steps"] == STEPS
        assert run["bytes_per_sample"] == run["bytes"] / run["samples"]
    found = json.loads((out / "results_rank0.json").read_text())["local_sgd"]
    assert "0.4 of DDP's bytes" in LocalSGD.summarize([found])  # 4 of 10 steps' worth
    # steps 7-9 came after the last average: the ranks differ, and evaluation saw their mean
    own = [torch.load(out / f"own_rank{rank}.pt") for rank in (0, 1)]
    assert any(not torch.equal(own[0][k], own[1][k]) for k in own[0])
    for key, averaged in params.items():
        assert torch.allclose(averaged, (own[0][key] + own[1][key]) / 2, atol=1e-7), key


@pytest.mark.distributed
def test_past_the_plan_every_step_is_local(runs):
    # started at step 100, past warmup=10: no gradient is all-reduced, parameters are averaged at steps 102 and 106
    # ((step - warmup) % 4 == 0)
    counted = json.loads((runs["past-the-plan"] / "results_rank0.json").read_text())["local_sgd"]["communication"]
    assert counted["quality_run"]["bytes"] == 0
    assert counted["after"]["bytes"] == 2 * 4 * n_params() and counted["after"]["calls"] == 2


def test_options_and_check_give_reasons():
    with pytest.raises(ConfigError, match="period must be at least 1"):
        TechniqueSpec.parse("local_sgd:period=0")
    with pytest.raises(ConfigError, match="warmup must be 0 or more"):
        TechniqueSpec.parse("local_sgd:warmup=-1")
    tech = TechniqueSpec.parse("local_sgd").resolve()
    assert "--nproc 2" in tech.check(Context(device=torch.device("cpu"), world_size=1))
    assert tech.check(Context(device=torch.device("cpu"), world_size=2)) is None
    with_fp16 = Context(device=torch.device("cpu"), world_size=2, technique_names=("local_sgd", "fp16"))
    assert "loss scaler may skip a step on one rank" in tech.check(with_fp16)
