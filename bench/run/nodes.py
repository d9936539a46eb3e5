"""Multi-node sweeps: the nodes agree on which trials are done before the first trial.

Why: every node runs the same ``python -m bench sweep ... --nnodes N --node-rank R --rdzv-endpoint HOST:PORT``
and launches each multi-process trial with torchrun, rendezvousing on an id derived from the trial id. Only node 0
records results, so on ``--resume`` node 0 would skip the trials in its results.jsonl while the other nodes, which
record nothing, start from the first trial: the nodes would launch different trials and wait on different
rendezvous ids forever. So before the first trial node 0 publishes its done set, and every other node takes it.

The exchange runs over a ``torch.distributed.TCPStore`` that node 0 hosts on the rendezvous endpoint's HOST:PORT:
that port is free between torchrun launches, and every node can already reach it. torchrun's (static) rendezvous binds
it again for each trial, so node 0 closes its store before ``agree_on_done`` returns. The same exchange checks
that all nodes planned the same trials, a mistake that would otherwise show up as a hang.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from datetime import timedelta

from torch.distributed import DistError, TCPStore

from bench.core.errors import ConfigError

log = logging.getLogger(__name__)

# A constant namespace rather than one per plan: a node with a different plan must still find node 0's value (to
# say how the plans differ instead of waiting), and anything else on the port never uses these keys.
PREFIX = "trainbench/agree/"
SAME_COMMAND = "run the same command, with the same flags, on every node"
REACH = ("start the same sweep on every node with the same --rdzv-endpoint; node 0 must be able to listen on the "
         "port and the other nodes must be able to reach it (firewall, host name)")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:29500`` for IPv6) as ``(host, port)``; anything else raises ``ConfigError``."""
    host, _, port = endpoint.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if host and port.isdigit() and 0 < int(port) < 65536:
        return host, int(port)
    raise ConfigError(f"--rdzv-endpoint {endpoint!r} is not valid: give HOST:PORT with a port in 1-65535, "
                      "e.g. node0.cluster:29500")


def plan_digest(plan_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(plan_ids).encode()).hexdigest()


def agree_on_done(endpoint: str, node_rank: int, nnodes: int, plan_ids: list[str], done_ids: set[str],
                  timeout_s: float = 300.0) -> set[str]:
    """The trial ids every node treats as done: node 0's ``done_ids`` restricted to the plan.

    ``plan_ids`` is this node's plan in run order; ``done_ids`` what this node knows is done (on nodes other than 0
    usually nothing). Node 0 hosts the exchange on ``endpoint`` and returns once every node has taken its done set;
    the other nodes wait up to ``timeout_s`` for node 0 to start. A different plan on some node, or a node that does
    not show up in time, raises ``ConfigError`` with a one-line message. One node needs no network at all.
    """
    if nnodes == 1:
        return done_ids & set(plan_ids)
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} is not valid with --nnodes {nnodes}: give 0 to {nnodes - 1}")
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + timeout_s
    mine = {"digest": plan_digest(plan_ids), "trials": len(plan_ids), "nnodes": nnodes}
    if node_rank == 0:
        done = done_ids & set(plan_ids)
        _lead(host, port, endpoint, nnodes, {**mine, "done": sorted(done)}, deadline, timeout_s)
    else:
        done = _follow(host, port, endpoint, node_rank, mine, deadline, timeout_s)
    log.info("nodes agree: %d of the %d planned trials are done", len(done), len(plan_ids))
    return done


def _lead(host: str, port: int, endpoint: str, nnodes: int, value: dict, deadline: float, timeout_s: float) -> None:
    """Node 0: host the store, publish ``value``, wait for every other node's acknowledgement, close the store."""
    try:
        store = TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    except DistError:
        raise ConfigError(f"node 0 cannot listen on port {port} of --rdzv-endpoint {endpoint} (in use?): "
                          "free it or choose another port") from None
    try:
        store.set(PREFIX + "plan", json.dumps(value))
        acks = {rank: f"{PREFIX}ack/{rank}" for rank in range(1, nnodes)}
        # Polled rather than store.wait(), whose timeout logs C++ warnings next to our one-line error.
        while not store.check(list(acks.values())):
            if time.monotonic() >= deadline:
                missing = ", ".join(str(rank) for rank, key in acks.items() if not store.check([key]))
                raise ConfigError(f"node 0 did not hear from node {missing} at {endpoint} within {timeout_s:g} s: "
                                  f"{REACH}")
            time.sleep(0.1)
        for key in acks.values():
            if error := json.loads(store.get(key))["error"]:
                raise ConfigError(error)  # the node's own message, so both nodes say what differs
    finally:
        # Closes the server now, not whenever a traceback lets go of this frame: torchrun binds the port next.
        del store


def _follow(host: str, port: int, endpoint: str, node_rank: int, mine: dict, deadline: float,
            timeout_s: float) -> set[str]:
    """Node r > 0: wait for node 0's store, check that the plans match, acknowledge, return node 0's done set."""
    unreachable = (f"node {node_rank} could not reach node 0 at {endpoint} within {timeout_s:g} s: {REACH}")
    # Poll with a plain socket until node 0 listens: exact timing, and none of the C++ errors a TCPStore client
    # logs on every failed try (node 0 starting a minute later is normal).
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.1)):
                break
        except socket.gaierror:
            raise ConfigError(f"--rdzv-endpoint {endpoint}: host {host!r} cannot be resolved; give node 0's "
                              "host name or address") from None
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(unreachable) from None
            time.sleep(0.2)
    try:
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
        theirs = json.loads(store.get(PREFIX + "plan"))
    except DistError:
        raise ConfigError(unreachable) from None
    error = None
    if theirs["nnodes"] != mine["nnodes"]:
        error = (f"node {node_rank} was started with --nnodes {mine['nnodes']}, node 0 with --nnodes "
                 f"{theirs['nnodes']}: {SAME_COMMAND}")
    elif theirs["digest"] != mine["digest"]:
        counts = (f"{mine['trials']} trials on node {node_rank}, {theirs['trials']} on node 0"
                  if mine["trials"] != theirs["trials"] else f"{mine['trials']} trials on both, not the same ones")
        error = f"node {node_rank}'s plan differs from node 0's ({counts}): {SAME_COMMAND}"
    store.set(f"{PREFIX}ack/{node_rank}", json.dumps({"error": error}))
    if error:
        raise ConfigError(error)
    return set(theirs["done"])
