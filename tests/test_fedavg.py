"""Federated averaging: the partition, the rounds, the average, the bytes.

- one client is plain training, bit for bit, whatever E (the average of one client is that client);
- 4 clients on 2 real gloo ranks give the global model 4 clients in one process give (every client takes part, so
  which rank hosts it does not change what it learns; only the sum's order differs);
- bytes a deployment would send are 2 x model bytes x participants per round (fp32), and the all-reduce's payload
  is the model once per round per rank;
- the IID split is a partition of the training set; Dirichlet(0.1) is skewed by label, Dirichlet(100) is not;
- each rank trains only its own clients, the same draw on every rank; options and checks give reasons.
"""

from __future__ import annotations

import json

import pytest
import torch

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import ConfigError, TechniqueSpec
from techniques.base import Context, Probe, TrainConfig
from techniques.fedavg import FedAvg, label_skew, participants, partition
from tests.conftest import runs_of
from tests.helpers import TechniqueSettings
from tests.torchrun_jobs import OUT, Job

SETTINGS = TechniqueSettings("fedavg:clients=2:local_steps=1", "mlp", runs_on="torchrun")
# its 2-rank job, run with test_distributed's and test_local_sgd's in one torchrun launch (conftest's dist_runs)
JOBS = {"fedavg": Job("dist_worker", ("fedavg:clients=4:local_steps=2", OUT, "mlp", "16"))}

CPU = torch.device("cpu")


def mlp():
    return workloads.get("mlp").build("tiny", 0, CPU)


def fedavg_run(options: str, steps: int, batch: int):
    """Train mlp:tiny with fedavg in this process; returns (technique, global model, working model)."""
    built = mlp()
    tech = TechniqueSpec.parse(f"fedavg:{options}").resolve()
    ctx = Context(device=CPU, technique_names=("fedavg",), total_steps=steps)
    tech.tune(TrainConfig(batch_size=batch, lr=built.lr), Probe(fresh=lambda seed=0: mlp(), device=CPU), ctx)
    model = tech.transform_model(built.model, ctx)
    optimizer = build_optimizer(model, [tech], ctx, built.lr)
    tech.state_at_build = optimizer.state  # for the test that the optimizer keeps its own state dict
    loop = TrainLoop(model, optimizer, built.loss_fn, [tech], ctx)
    data = tech.wrap_data(built.batches(batch, 0), ctx)
    for _ in range(steps):
        loop.step(next(data))
    return tech, tech.eval_model(model, ctx), model


@pytest.mark.parametrize("local_steps", [1, 3])
def test_one_client_is_plain_training(local_steps):
    tech, server, model = fedavg_run(f"clients=1:local_steps={local_steps}", steps=12, batch=64)
    built = mlp()
    loop = TrainLoop(built.model, build_optimizer(built.model, [], Context(device=CPU), built.lr), built.loss_fn,
                     [], Context(device=CPU))
    x, y = built.train_data
    own = tech.parts[0]
    gen = torch.Generator().manual_seed(0 * 100_003 + 0)  # client 0's own generator for seed 0
    for _ in range(12):
        idx = own[torch.randint(len(own), (64,), generator=gen)]
        loop.step((x[idx], y[idx]))
    for (key, expected), got in zip(built.model.named_parameters(), server.parameters(), strict=True):
        assert torch.equal(got, expected), key
        assert not torch.equal(expected, mlp().model.state_dict()[key]), "training moved nothing"
    assert tech.rounds["quality_run"] == 12 // local_steps


@pytest.mark.distributed
def test_two_ranks_average_what_one_process_averages(dist_runs):
    out = runs_of(dist_runs, "test_fedavg")["fedavg"]
    two_ranks = torch.load(out / "params.pt")
    # one process, same clients, each on the per-rank batch of the 2-rank run (64 / 2)
    tech, server, _ = fedavg_run("clients=4:local_steps=2", steps=32, batch=32)
    assert tech.rounds["quality_run"] == 4
    for key, expected in server.named_parameters():
        assert torch.allclose(two_ranks[key], expected, atol=1e-6), key
    n_bytes = 4 * sum(p.numel() for p in mlp().model.parameters())  # fp32, no buffers
    for rank in (0, 1):
        found = json.loads((out / f"results_rank{rank}.json").read_text())["fedavg"]
        assert found["rounds_completed"] == {"quality_run": 4, "after": 0} and found["steps_per_round"] == 4
        assert found["federated"]["quality_run_bytes"] == 2 * n_bytes * 4 * 4  # 2 x model x 4 participants x 4 rounds
        assert found["communication"]["quality_run"]["bytes"] == 4 * n_bytes  # the flat buffer once per round
        assert found["communication"]["quality_run"]["samples"] == 16 * 64
    text = FedAvg.summarize([found])
    assert "4 of 4 clients per round, 4 steps a round" in text and "4 rounds in the quality run" in text


def test_each_client_keeps_its_own_optimizer_state_in_the_optimizers_own_dict():
    tech, _, model = fedavg_run("clients=2:local_steps=1", steps=6, batch=32)  # clients 0, 1, 0, 1, 0, 1
    assert tech.active == 0 and set(tech.client_state) == {1}  # client 0's wave comes next; client 1 rests
    assert tech.optimizer.state is tech.state_at_build  # contents swapped, the dict kept (a wrapper may hold it)
    for client_state in (tech.optimizer.state, tech.client_state[1]):  # each client's AdamW took 3 steps
        assert len(client_state) == len(list(model.parameters()))
        assert all(float(s["step"]) == 3 for s in client_state.values())
    assert not torch.equal(*(next(iter(st.values()))["exp_avg"] for st in (tech.optimizer.state, tech.client_state[1])))


def test_partitions_cover_the_set_and_dirichlet_skews_labels():
    y = mlp().train_data[1]
    iid = partition(y, 8, None, seed=0)
    assert torch.equal(torch.sort(torch.cat(iid)).values, torch.arange(len(y)))
    assert max(len(p) for p in iid) - min(len(p) for p in iid) <= 1
    skewed = partition(y, 8, 0.1, seed=0)
    assert torch.equal(torch.sort(torch.cat(skewed)).values, torch.arange(len(y)))
    assert min(len(p) for p in skewed) >= 10
    assert all(torch.equal(a, b) for a, b in zip(skewed, partition(y, 8, 0.1, seed=0), strict=True))
    tv = {alpha: label_skew(y, partition(y, 8, alpha, seed=0))["mean_tv_distance"] for alpha in (100.0, 1.0, 0.1)}
    assert label_skew(y, iid)["mean_tv_distance"] < 0.1  # sampling noise only (500 samples a client, 10 labels)
    assert tv[100.0] < 0.1 < tv[1.0] < tv[0.1]  # measured 0.04, 0.34, 0.58
    assert label_skew(y, skewed)["mean_top_label_share"] > 0.4  # 0.49 measured; IID gives 0.125


def test_each_rank_trains_its_own_clients_the_same_draw_everywhere():
    for round_index in range(5):
        chosen = participants(round_index, 8, 2, 2, seed=3)
        assert chosen == participants(round_index, 8, 2, 2, seed=3)
        assert all(len(c) == 2 and all(x % 2 == rank for x in c) for rank, c in enumerate(chosen))
    assert {participants(r, 8, 2, 2, seed=3) for r in range(10)} != {participants(0, 8, 2, 2, seed=3)}


def test_options_and_checks_give_reasons():
    for bad, why in [("clients=0", "clients must be at least 1"), ("fraction=0", "fraction must be in"),
                     ("local_steps=0", "local_steps must be at least 1"), ("alpha=0", "alpha must be positive"),
                     ("partition=labels", "must be one of iid, dirichlet")]:
        with pytest.raises(ConfigError, match=why):
            TechniqueSpec.parse(f"fedavg:{bad}")
    two = Context(device=CPU, world_size=2)
    assert "clients=3 does not divide by 2" in TechniqueSpec.parse("fedavg:clients=3").resolve().check(two)
    assert "3 clients per round" in TechniqueSpec.parse("fedavg:clients=6:fraction=0.5").resolve().check(two)
    assert TechniqueSpec.parse("fedavg:clients=4:fraction=0.5").resolve().check(two) is None
    conflicts = {"curriculum", "loader", "batch_size"}
    assert conflicts <= TechniqueSpec.parse("fedavg").resolve().conflicts
    with pytest.raises(ValueError, match="needs a classifier's training set"):
        gpt = lambda seed=0: workloads.get("gpt").build("tiny", 0, CPU)  # noqa: E731
        TechniqueSpec.parse("fedavg").resolve().tune(TrainConfig(batch_size=8), Probe(fresh=gpt, device=CPU),
                                                      Context(device=CPU))
