"""The harness's own overhead: ``bench.loop.TrainLoop`` with every hook present against a bare hand-written loop.

Both run the same model (same seed), the same fixed batch and the same optimizer in this process, so the only
difference is the loop: hooks resolved at construction, a forward context entered, a loss hook, backward and
optimizer-step owners asked, a detached loss returned. The technique overrides every hook with a no-op that
returns the default, so every code path of the loop that a hook can reach is taken.

Compare the two medians of each group (``gpt:tiny``, ``mlp:tiny``): the goal is the loop within 2% of the bare loop.
``test_step_overhead_interleaved`` times both loops step by step in alternation, immune to the machine's drift;
its ``extra_info.trainloop_over_bare`` is the figure to read. A benchmark, not a timed test: the figures live in
the stored JSON and the README.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from techniques.base import Context, Technique, TrainConfig

ROUNDS = 200
WARMUP = 10


class NoOpEverywhere(Technique):
    """Overrides every hook with a no-op returning the default (not registered: a test double)."""

    name = "noop_everywhere"
    summary = "every hook overridden, nothing changed"

    def launch(self, ctx: Context) -> int | None:
        return None

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return model

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        return None

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return batches

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def loss(self, out: Any, batch: Any, base_loss: torch.Tensor, ctx: Context) -> torch.Tensor:
        return base_loss

    def backward(self, loss: torch.Tensor, ctx: Context) -> bool:
        return False

    def optimizer_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> bool:
        return False

    def on_eval(self, metrics: dict[str, float], ctx: Context) -> bool:
        return False

    def finalize(self, model: nn.Module, ctx: Context) -> None:
        return None


def _every_hook_overridden() -> bool:
    hooks = ("launch", "configure", "transform_model", "build_optimizer", "wrap_data", "forward_context", "loss",
             "backward", "optimizer_step", "on_eval", "finalize")
    return all(getattr(NoOpEverywhere, h) is not getattr(Technique, h) for h in hooks)


def trainloop_step(workload: str) -> Callable[[], torch.Tensor]:
    """One TrainLoop step with the no-op technique applied the way bench.trial applies techniques."""
    assert _every_hook_overridden()
    wl = workloads.get(workload)
    built = wl.build("tiny", 0, torch.device("cpu"))
    tech = NoOpEverywhere()
    cfg = tech.configure(TrainConfig(batch_size=built.batch_size, lr=built.lr))
    ctx = Context(device=torch.device("cpu"), workload=workload, structure=wl.structure("tiny"),
                  has_batchnorm=wl.has_batchnorm)
    model = tech.transform_model(built.model, ctx)
    opt = build_optimizer(model, [tech], ctx, cfg.lr)
    batch = next(tech.wrap_data(built.batches(cfg.batch_size, 0), ctx))
    loop = TrainLoop(model, opt, built.loss_fn, [tech], ctx, cfg.micro_batches)
    assert loop._context_techs and loop._loss_techs and loop._backward_owner and loop._step_owner
    return lambda: loop.step(batch)


def bare_step(workload: str) -> Callable[[], torch.Tensor]:
    """The same training step written by hand: what a user's own loop would do."""
    built = workloads.get(workload).build("tiny", 0, torch.device("cpu"))
    model, loss_fn = built.model, built.loss_fn
    opt = torch.optim.AdamW(model.parameters(), lr=built.lr, weight_decay=0.0)  # as bench.loop.default_optimizer
    x, y = next(built.batches(built.batch_size, 0))

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


@pytest.mark.parametrize("workload", ["gpt", "mlp"])
@pytest.mark.parametrize("loop", ["bare", "trainloop"])
def test_step_overhead(benchmark, workload, loop):
    step = bare_step(workload) if loop == "bare" else trainloop_step(workload)
    benchmark.group = f"overhead {workload}:tiny"
    benchmark.extra_info.update(workload=f"{workload}:tiny", loop=loop, threads=torch.get_num_threads())
    benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)


@pytest.mark.parametrize("workload", ["gpt", "mlp"])
def test_step_overhead_interleaved(benchmark, workload):
    """One bare step then one TrainLoop step per round, each timed on its own: on a machine whose speed drifts by
    tens of percent over seconds (a shared VM), only interleaving at the step level compares like with like. The
    benchmark's own figure is the pair; the two medians and their ratio are in ``extra_info``."""
    bare, loop = bare_step(workload), trainloop_step(workload)
    times: dict[str, list[float]] = {"bare": [], "trainloop": []}
    clock = time.perf_counter

    def pair() -> None:
        for name, step in (("bare", bare), ("trainloop", loop)):
            t0 = clock()
            step()
            times[name].append(clock() - t0)

    benchmark.group = f"overhead {workload}:tiny"
    benchmark.pedantic(pair, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    warm = {k: v[WARMUP:] for k, v in times.items()}
    medians = {k: statistics.median(v) for k, v in warm.items()}
    benchmark.extra_info.update(
        workload=f"{workload}:tiny", loop="interleaved", threads=torch.get_num_threads(),
        bare_median_s=medians["bare"], trainloop_median_s=medians["trainloop"],
        trainloop_over_bare=medians["trainloop"] / medians["bare"],
    )


def test_both_loops_compute_the_same_losses():
    """Not a benchmark: the two loops being timed do the same work (also runs in the normal suite)."""
    for workload in ("gpt", "mlp"):
        a, b = bare_step(workload), trainloop_step(workload)
        assert [float(a()) for _ in range(3)] == [float(b()) for _ in range(3)]
