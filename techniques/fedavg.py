"""Federated averaging (FedAvg) over simulated clients that never share data.

Method card
- What: the training set is split over ``clients``, IID or by label in Dirichlet(``alpha``) proportions
  (``partition=dirichlet``; small alpha, strong skew). Each round a ``fraction`` of clients trains ``local_steps``
  steps on its own data from the global model, and the global model becomes their average weighted by samples.
  Clients live on the torchrun ranks; one all-reduce per round forms the average. Samples per step are the global
  batch, so quality compares with centralised training directly. Clients keep their optimizer state (cross-silo).
- Two communication counts: what a deployment would send (the model down and its update up, per participant and
  round) and what the simulation's all-reduce passed. Needs a classifier's in-memory training set.
- When it should pay: never for speed on one machine: it is for data that cannot move. Read the quality cost and the
  rounds, IID against skewed. Not run on a GPU.
- Sources: McMahan et al., AISTATS 2017 (arXiv:1602.05629); Hsu et al., 2019 (arXiv:1909.06335); Zhao et al., 2018
  (arXiv:1806.00582).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-fedavg (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-parallelism/mlp`: mlp:tiny fedavg:alpha=0.1:partition=dirichlet 0.82x [0.44, 1.53] inconclusive, memory 1.02x [1.01, 1.03] more (RSS); mlp:tiny 0.81x [0.54, 1.21] inconclusive, memory 1.02x [1.00, 1.03] inconclusive (the whole interval above 1, not clear of the threshold) (RSS).
<!-- end generated -->
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from techniques import _reading as rd
from techniques._distributed import CommCounter, is_initialized, local_bytes
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, register

MIN_CLIENT_SAMPLES = 10  # a Dirichlet partition is drawn again until every client has this many (NIID-Bench)


def partition(labels: torch.Tensor, clients: int, alpha: float | None, seed: int) -> list[torch.Tensor]:
    """Indices of each client's samples: an even random split (``alpha`` None), or per class Dirichlet(alpha)
    proportions over the clients, drawn again (up to 1000 times) until every client has ``MIN_CLIENT_SAMPLES``."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    if alpha is None:
        return [torch.from_numpy(np.sort(part)) for part in np.array_split(rng.permutation(n), clients)]
    y = labels.cpu().numpy()
    for _ in range(1000):
        parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for k in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == k))
            cuts = (np.cumsum(rng.dirichlet(np.full(clients, alpha))) * len(idx)).astype(int)[:-1]
            for client, piece in enumerate(np.split(idx, cuts)):
                parts[client].append(piece)
        merged = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(m) for m in merged) >= MIN_CLIENT_SAMPLES:
            return [torch.from_numpy(m) for m in merged]
    raise ValueError(f"no Dirichlet({alpha}) partition of {n} samples over {clients} clients gives every client "
                     f"{MIN_CLIENT_SAMPLES} samples: use fewer clients or a larger alpha")


@functools.lru_cache(maxsize=4)
def participants(round_index: int, clients: int, world: int, per_rank: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """The clients each rank trains in a round: ``per_rank`` of its own (c mod world == rank), the same draw on
    every rank."""
    rng = np.random.default_rng([seed, round_index])
    hosted = [list(range(rank, clients, world)) for rank in range(world)]
    return tuple(tuple(sorted(int(c) for c in rng.choice(own, per_rank, replace=False))) for own in hosted)


@register
class FedAvg(Technique):
    name = "fedavg"
    summary = "federated averaging over simulated clients (IID or Dirichlet non-IID)"
    kind = Kind.ALGORITHMIC
    phase = Phase.SHARDING
    slot = "sharding"
    tune_options = ()  # a simulation of federated clients, not a recipe for one job: not a default candidate
    own_flops = False
    hides_tensors = False
    multi_process = True
    # batch_size: a round's length follows the global batch fixed before training; curriculum and loader: the
    # clients draw their own batches, so what those would feed is never trained
    conflicts = frozenset({"batch_size", "curriculum", "loader"})

    @dataclass(frozen=True)
    class Options:
        clients: int = 4
        fraction: float = 1.0  # of the clients taking part in each round
        local_steps: int = 5  # E: each participant's optimizer steps per round
        partition: Literal["iid", "dirichlet"] = "iid"
        alpha: float = 0.5  # Dirichlet concentration (partition=dirichlet): small is skewed

        def __post_init__(self) -> None:
            if self.clients < 1:
                raise ValueError(f"clients must be at least 1, got {self.clients}")
            if not 0 < self.fraction <= 1:
                raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
            if self.local_steps < 1:
                raise ValueError(f"local_steps must be at least 1, got {self.local_steps}")
            if self.alpha <= 0:
                raise ValueError(f"alpha must be positive, got {self.alpha}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.comm = CommCounter()
        self.steps = 0  # this process's optimizer steps (continuous, unlike ctx.step across stages)
        self.rounds = {"quality_run": 0, "after": 0}  # finished rounds, as CommCounter splits steps

    @property
    def per_round(self) -> int:
        """Clients taking part in each round."""
        return max(1, round(self.options.fraction * self.options.clients))

    def check(self, ctx: Context) -> str | None:
        world, o = ctx.world_size, self.options
        if o.clients % world:
            return f"fedavg hosts clients on ranks evenly: clients={o.clients} does not divide by {world} processes"
        if self.per_round % world:
            return (f"fedavg trains the same number of clients on every rank: {self.per_round} clients per round "
                    f"(fraction={o.fraction:g} of {o.clients}) do not divide by {world} processes")
        return None

    # ---- set-up: the clients' data, the server's model --------------------------------------------------------

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        train = probe.fresh().train_data
        if train is None:
            raise ValueError("fedavg needs a classifier's training set to partition (mlp, cnn; not a language model)")
        self.x, self.y = train
        self.labelled = self.y.dim() == 1 and not self.y.is_floating_point()  # class labels (skew is measurable)
        if self.options.partition == "dirichlet" and not self.labelled:
            raise ValueError("fedavg:partition=dirichlet splits by class label; this workload's targets are not "
                             "class labels (use partition=iid)")
        alpha = self.options.alpha if self.options.partition == "dirichlet" else None
        self.parts = partition(self.y, self.options.clients, alpha, ctx.seed)
        self.local_batch = cfg.batch_size // ctx.world_size
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        self.model = model
        if is_initialized():  # every rank starts from rank 0's model, as DDP would
            for t in _state(model):
                dist.broadcast(t.data, src=0)
        self.server = copy.deepcopy(getattr(model, "_orig_mod", model))  # the global model, evaluated (eager)
        sizes = [t.numel() for t in _state(model)]
        self.flat = torch.zeros(sum(sizes), dtype=torch.float32, device=ctx.device)
        self.model_bytes = local_bytes(_state(model))
        return model

    def attach(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        self.optimizer = optimizer
        self.client_state: dict[int, dict[Any, Any]] = {}  # each client's optimizer state while it is not training
        self.active: int | None = None
        self._start_wave(ctx)

    # ---- the rounds -------------------------------------------------------------------------------------------

    def _where(self, ctx: Context) -> tuple[int, int, int, tuple[tuple[int, ...], ...]]:
        """(round, wave, step in the wave, every rank's participants) of the step to come."""
        per_rank = self.per_round // ctx.world_size
        round_len = self.options.local_steps * per_rank
        round_index, in_round = divmod(self.steps, round_len)
        wave, in_wave = divmod(in_round, self.options.local_steps)
        return round_index, wave, in_wave, participants(round_index, self.options.clients, ctx.world_size,
                                                        per_rank, ctx.seed)

    def _client(self, ctx: Context) -> int:
        _, wave, _, chosen = self._where(ctx)
        return chosen[ctx.rank][wave]

    def _start_wave(self, ctx: Context) -> None:
        """A client starts from the global model with its own optimizer state."""
        client = self._client(ctx)
        with torch.no_grad():
            for mine, server in zip(_state(self.model), _state(self.server), strict=True):
                mine.copy_(server)
        # the optimizer keeps its own state dict (a wrapper may hold on to it): its contents are swapped
        state = self.optimizer.state
        if self.active is not None:
            self.client_state[self.active] = dict(state)
        state.clear()
        state.update(self.client_state.pop(client, {}))
        self.active = client

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        next(batches)  # the clients draw their own batches; the harness notes the workload's first (its FLOP shape)
        generators: dict[int, torch.Generator] = {}
        while True:
            client = self._client(ctx)
            gen = generators.setdefault(client, torch.Generator().manual_seed(ctx.seed * 100_003 + client))
            own = self.parts[client]
            idx = own[torch.randint(len(own), (self.local_batch,), generator=gen)]
            self.comm.samples(self.local_batch * ctx.world_size, ctx)
            yield self.x[idx], self.y[idx]

    def after_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        _, wave, in_wave, chosen = self._where(ctx)
        client = chosen[ctx.rank][wave]
        self.steps += 1
        if in_wave + 1 < self.options.local_steps:
            return
        self._add_client(client, chosen)
        if wave + 1 == len(chosen[ctx.rank]):
            self._finish_round(ctx)
        self._start_wave(ctx)

    def _add_client(self, client: int, chosen: tuple[tuple[int, ...], ...]) -> None:
        total = sum(len(self.parts[c]) for rank in chosen for c in rank)
        weight = len(self.parts[client]) / total
        offset = 0
        with torch.no_grad():
            for t in _state(self.model):
                n = t.numel()
                self.flat[offset : offset + n].add_(t.detach().reshape(-1).float(), alpha=weight)
                offset += n

    def _finish_round(self, ctx: Context) -> None:
        if ctx.world_size > 1:
            self.comm.add(self.flat, ctx)
            dist.all_reduce(self.flat)
        offset = 0
        with torch.no_grad():
            for t in _state(self.server):
                n = t.numel()
                t.copy_(self.flat[offset : offset + n].view_as(t))
                offset += n
        self.flat.zero_()
        self.rounds[CommCounter.phase(ctx)] += 1

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return self.server

    def results(self, ctx: Context) -> dict[str, Any] | None:
        per_rank = self.per_round // ctx.world_size
        if not hasattr(self, "optimizer"):  # never set up (the trial failed before training)
            return None
        per_round = self.per_round * self.model_bytes
        round_steps = self.options.local_steps * per_rank
        return {
            "clients": self.options.clients, "participants_per_round": self.per_round,
            "steps_per_round": round_steps, "rounds_completed": dict(self.rounds),
            # the quality run's last steps that no finished round averaged: its final evaluation does not see them
            "quality_run_steps_after_last_round": self.comm.steps["quality_run"] - round_steps
            * self.rounds["quality_run"],
            "client_samples": [len(p) for p in self.parts],
            "label_skew": label_skew(self.y, self.parts) if self.labelled else None,
            "federated": {  # what a deployment would send: the model down to each participant, its update up
                "model_bytes": self.model_bytes, "bytes_down_per_round": per_round, "bytes_up_per_round": per_round,
                "quality_run_bytes": 2 * per_round * self.rounds["quality_run"],
            },
            "communication": self.comm.results(),  # what this simulation's all-reduce passed
            # the simulation's own state on this rank beside the model, its gradients and the training client's
            # optimizer state (model_state_bytes): the server's model, the average's buffer, the other clients'
            # optimizer states
            "simulation_state_bytes": self.model_bytes + self.flat.numel() * self.flat.element_size()
            + local_bytes(v for state in self.client_state.values() for s in state.values() for v in s.values()
                          if torch.is_tensor(v)),
        }

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """Clients and steps per round, the label skew, the rounds completed and the bytes a deployment would
        send."""
        first = found[0]
        skew = rd.values([(f.get("label_skew") or {}).get("mean_tv_distance") for f in found])  # "-": not class labels
        rounds = rd.values([(f.get("rounds_completed") or {}).get("quality_run") for f in found])
        fed = first.get("federated") or {}
        unaveraged = [f.get("quality_run_steps_after_last_round") for f in found]
        tail = (f"; the final evaluation misses the last {rd.values(unaveraged)} steps (a round unfinished at the budget's "
                "end)" if any(unaveraged) else "")
        return (f"{first['participants_per_round']} of {first['clients']} clients per round, {first['steps_per_round']} "
                f"steps a round; label skew (mean TV distance to the whole set, 0 = IID) {skew}; {rounds} rounds in "
                f"the quality run; a deployment sends {rd.fmt_bytes(fed.get('bytes_down_per_round'))} down and as much up "
                f"per round (MiB over the quality run: "
                f"{rd.values([rd.mib((f.get('federated') or {}).get('quality_run_bytes')) for f in found])})" + tail)


def _state(model: nn.Module) -> list[torch.Tensor]:
    """What a client sends and the server averages: the parameters and the floating-point buffers (batch-norm
    statistics); integer buffers (batch counters) stay each model's own."""
    return [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]


def label_skew(labels: torch.Tensor, parts: list[torch.Tensor]) -> dict[str, float]:
    """How far the clients' label mixes are from the whole set's: the mean over clients of the total variation
    distance between a client's label distribution and the global one (0 = IID, 1 = disjoint), and the mean
    share of each client's most common label."""
    classes = int(labels.max()) + 1
    overall = torch.bincount(labels, minlength=classes).double() / len(labels)
    tv, top = [], []
    for part in parts:
        mine = torch.bincount(labels[part], minlength=classes).double() / len(part)
        tv.append(0.5 * float((mine - overall).abs().sum()))
        top.append(float(mine.max()))
    return {"mean_tv_distance": sum(tv) / len(tv), "mean_top_label_share": sum(top) / len(top)}

