"""Multi-node agreement on the done trials: two real processes on 127.0.0.1 playing node 0 and node 1."""

from __future__ import annotations

import multiprocessing
import socket
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from bench.core.errors import ConfigError
from bench.run import nodes
from bench.run.nodes import agree_on_done

PLAN = ["a", "b", "c"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(results, delay: float, *args, **kwargs) -> None:
    """A node in its own process: says it has started, waits ``delay``, then reports its result or error."""
    results.put("started")
    time.sleep(delay)
    try:
        results.put(agree_on_done(*args, **kwargs))
    except ConfigError as exc:
        results.put(exc)


def start_node(*args, delay: float = 0.0, **kwargs):
    """``agree_on_done(*args, **kwargs)`` in a spawned process, returned once it runs (torch imported)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_node, args=(results, delay, *args), kwargs=kwargs, daemon=True)
    process.start()
    assert results.get(timeout=60) == "started"
    return process, results


def result_of(process, results):
    result = results.get(timeout=20)
    process.join(timeout=10)
    return result


@pytest.mark.distributed
@pytest.mark.parametrize("node_0_delay", [0.0, 1.0], ids=["together", "node-0-late"])
def test_node_1_takes_node_0s_done_set_and_the_port_is_free_afterwards(node_0_delay):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    node_1 = start_node(endpoint, 1, 2, PLAN, set(), timeout_s=15)
    time.sleep(node_0_delay)  # node 1 retries until node 0 listens
    # "x" is not in the plan (a trial of a bigger earlier sweep): it is not part of the agreement.
    assert agree_on_done(endpoint, 0, 2, PLAN, {"a", "b", "x"}, timeout_s=15) == {"a", "b"}
    assert result_of(*node_1) == {"a", "b"}
    # What torchrun's rendezvous does next on node 0: host a store on the same port.
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    del store


@pytest.mark.distributed
def test_node_0_waits_for_a_late_node():
    endpoint = f"127.0.0.1:{free_port()}"
    node_0 = start_node(endpoint, 0, 2, PLAN, {"c"}, timeout_s=15)
    time.sleep(1.0)
    assert agree_on_done(endpoint, 1, 2, PLAN, set(), timeout_s=15) == {"c"}
    assert result_of(*node_0) == {"c"}


@pytest.mark.distributed
def test_different_plans_fail_on_both_nodes_with_what_differs():
    endpoint = f"127.0.0.1:{free_port()}"
    node_1 = start_node(endpoint, 1, 2, [*PLAN, "d"], set(), timeout_s=10)
    with pytest.raises(ConfigError) as on_node_0:
        agree_on_done(endpoint, 0, 2, PLAN, {"a"}, timeout_s=10)
    on_node_1 = result_of(*node_1)
    assert isinstance(on_node_1, ConfigError)
    assert str(on_node_1) == str(on_node_0.value) == (
        "node 1's plan differs from node 0's (4 trials on node 1, 3 on node 0): "
        "run the same command, with the same flags, on every node")


def test_node_0_times_out_naming_the_missing_nodes_and_frees_the_port():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"node 0 did not hear from node 1, 2 at 127.0.0.1:{port} within 0.5 s"):
        agree_on_done(f"127.0.0.1:{port}", 0, 3, PLAN, set(), timeout_s=0.5)
    assert time.monotonic() - start < 5
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    del store


def test_a_node_that_cannot_reach_node_0_says_so():
    port = free_port()  # nothing listens there
    with pytest.raises(ConfigError, match=rf"node 1 could not reach node 0 at 127.0.0.1:{port} within 0.5 s: .*"
                                          "same --rdzv-endpoint"):
        agree_on_done(f"127.0.0.1:{port}", 1, 2, PLAN, set(), timeout_s=0.5)


def test_node_0_cannot_listen_on_a_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"node 0 cannot listen on port {port}"):
            agree_on_done(f"127.0.0.1:{port}", 0, 2, PLAN, set(), timeout_s=2)


def test_one_node_needs_no_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("one node must not touch the network")

    monkeypatch.setattr(nodes, "TCPStore", no_network)
    monkeypatch.setattr(nodes.socket, "create_connection", no_network)
    assert agree_on_done("", 0, 1, PLAN, {"a", "x"}) == {"a"}


@pytest.mark.parametrize("endpoint", ["nohost", "h:notaport", "h:0", "h:70000", ":29500", "h:"])
def test_a_bad_endpoint_says_what_is_valid(endpoint):
    with pytest.raises(ConfigError, match="give HOST:PORT with a port in 1-65535"):
        agree_on_done(endpoint, 1, 2, PLAN, set())


def test_ipv6_endpoints_parse():
    assert nodes.parse_endpoint("[::1]:29500") == ("::1", 29500)
    assert nodes.parse_endpoint("node0.cluster:29500") == ("node0.cluster", 29500)


def test_a_node_rank_outside_nnodes_is_an_error():
    with pytest.raises(ConfigError, match="--node-rank 2 is not valid with --nnodes 2: give 0 to 1"):
        agree_on_done("127.0.0.1:29500", 2, 2, PLAN, set())


# ---- a whole 2-node sweep: two sweeps on this machine playing node 0 and node 1 ---------------------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_a_two_node_sweep_resumes_with_both_nodes_skipping_the_same_trials(tmp_path):
    import json
    import signal
    import subprocess
    import sys

    import torch

    from bench.plan.config import build_config
    from bench.plan.planner import plan
    from bench.records.results import ResultStore
    from tests.conftest import REPO

    flags = {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 1, "nnodes": 2}
    # A seed whose run order starts with the two-node trial: resuming after it is what used to hang (node 1, which
    # records nothing, launched it again and waited at a rendezvous node 0 never joined).
    seed = next(s for s in range(50)
                if plan(build_config("smoke", {**flags, "seed": s}), torch.device("cpu"))[0].world_size == 2)
    port = free_port()

    def node(rank: int, *extra: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "bench", "sweep", "--preset", "smoke", "--workloads", "mlp", "--techniques",
               "ddp", "--repeats", "1", "--seed", str(seed), "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank),
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--mode", "speed", "--no-memory",
               "--out", str(tmp_path / f"node{rank}"), *extra]
        log = (tmp_path / f"node{rank}{''.join(extra)}.log").open("w")
        return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    first = [node(0), node(1)]
    results = tmp_path / "node0" / "results.jsonl"
    deadline = time.monotonic() + 300
    while not (results.exists() and results.read_text().strip()):  # the two-node trial is recorded: interrupt
        assert time.monotonic() < deadline and all(p.poll() is None for p in first), \
            (tmp_path / "node0.log").read_text()[-2000:]
        time.sleep(0.2)
    for p in first:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    (done,) = ResultStore(results).read()
    assert done.world_size == 2 and done.status == "ok", done.reason

    resumed = [node(0, "--resume"), node(1, "--resume")]
    for p in resumed:
        assert p.wait(timeout=300) == 0, (tmp_path / "node0--resume.log").read_text()[-2000:]
    records = ResultStore(results).read()
    assert [r.trial_id for r in records] == [done.trial_id, next(r.trial_id for r in records if r.world_size == 1)]
    assert records[0] == done and records[1].status == "ok"
    for rank in (0, 1):  # both nodes skipped the same trial: node 0's record of it
        said = " ".join((tmp_path / f"node{rank}--resume.log").read_text().split())
        assert "1 trial(s) already done were not run again" in said, said[-1000:]
    # node 0 records and describes the sweep; node 1 only takes part (it could share node 0's directory)
    assert not (tmp_path / "node1" / "results.jsonl").exists() and not (tmp_path / "node1" / "env.json").exists()
    assert json.loads((tmp_path / "node0" / "env.json").read_text())["peak_flops"]
