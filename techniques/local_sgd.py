"""Local SGD (post-local SGD): ranks train apart and average their parameters every H steps.

Method card
- What: DDP for the first ``warmup`` steps; then each rank steps its own optimizer and the ranks average parameters
  every ``period`` (H) steps: one all-reduce of the parameters per H steps instead of the gradients every step.
  torch's engine: ``post_localSGD_hook`` and ``PostLocalSGDOptimizer``. Evaluation sees the ranks' average.
- Algorithmic: the ranks drift apart between averages; with AdamW even H = 1 differs from DDP. The record counts
  each rank's all-reduced bytes.
- When it should pay: communication-bound data parallelism (slow links, many nodes); the quality cost grows with H.
  Not run on a GPU yet.
- Refused with ``fp16`` (a step skipped on one rank would unpair the averages) and ``grad_accum``.
- Sources: Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020 (arXiv:1808.07217); Ortiz et al.,
  "Trade-offs of Local SGD at Scale", 2021 (arXiv:2110.08133); torch ``model_averaging`` docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-local_sgd (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-parallelism/gpt`: gpt:tiny local_sgd:period=1 0.89x [0.60, 1.32] inconclusive, memory 1.00x [1.00, 1.01] inconclusive (RSS); gpt:tiny local_sgd:period=4 1.09x [0.83, 1.43] inconclusive, memory 1.01x [1.00, 1.02] inconclusive (RSS); gpt:tiny local_sgd:period=16 1.08x [0.86, 1.34] inconclusive, memory 1.00x [1.00, 1.01] inconclusive (RSS).
- AMD EPYC (AVX2 only), `reports/example-cpu-parallelism/mlp`: mlp:tiny local_sgd:period=1 0.43x [0.32, 0.58] slower, memory 1.04x [1.03, 1.05] more (RSS); mlp:tiny local_sgd:period=4 0.72x [0.39, 1.34] inconclusive, memory 1.04x [1.02, 1.05] more (RSS); mlp:tiny local_sgd:period=16 0.88x [0.74, 1.04] inconclusive, memory 1.04x [1.03, 1.04] more (RSS).
<!-- end generated -->
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.algorithms.model_averaging.utils import average_parameters, get_params_to_average
from torch.nn.parallel import DistributedDataParallel

from techniques import _reading as rd
from techniques._distributed import CommCounter, local_bytes, needs_world, shard_batches
from techniques.base import Bottleneck, Context, Kind, Phase, Technique, register


@register
class LocalSGD(Technique):
    name = "local_sgd"
    summary = "post-local SGD: DDP warm-up, then average parameters every H steps"
    kind = Kind.ALGORITHMIC
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "sharding"
    multi_process = True
    conflicts = frozenset({"grad_accum"})  # the averager counts optimizer steps, the hook backward passes

    @dataclass(frozen=True)
    class Options:
        period: int = 4  # H: optimizer steps between parameter averages
        warmup: int = 10  # ordinary DDP steps before local SGD starts

        def __post_init__(self) -> None:
            if self.period < 1:
                raise ValueError(f"period must be at least 1, got {self.period}")
            if self.warmup < 0:
                raise ValueError(f"warmup must be 0 or more, got {self.warmup}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.comm = CommCounter()
        self._averaged: nn.Module | None = None  # evaluation's averaged copy, until the next step

    def check(self, ctx: Context) -> str | None:
        if "fp16" in ctx.technique_names:
            # GradScaler decides per rank whether to skip a step on its local gradients: the ranks' averagers would
            # fall out of step and their all-reduces pair with different collectives (a hang or a size mismatch).
            return "local_sgd with fp16 is refused: the loss scaler may skip a step on one rank only"
        return needs_world(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState,
            post_localSGD_hook,
        )

        ids = [ctx.device.index] if ctx.is_cuda else None
        self.param_bytes = local_bytes(p for p in model.parameters() if p.requires_grad)
        ddp = DistributedDataParallel(model, device_ids=ids)
        # No subgroup all-reduce after the warm-up: each rank keeps its own gradients (the subgroup would be the
        # rank alone, and creating default subgroups asks CUDA for its device count).
        state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=self.options.warmup,
                                  post_local_gradient_allreduce=False)
        comm = self.comm

        def counted_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations here
            # The warm-up follows the trial's step count, not the hook's own: a speed window starts past the quality
            # run's plan (ctx.step jumps there), and is then local SGD whether or not the quality run came first.
            state.iter = ctx.step
            if state.iter < state.start_localSGD_iter:  # the hook all-reduces this bucket globally
                comm.add(bucket.buffer(), ctx)
            return post_localSGD_hook(state, bucket)

        ddp.register_comm_hook(state, counted_hook)
        return ddp

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        from torch.distributed.optim import PostLocalSGDOptimizer

        averager = _CountingAverager(self.comm, ctx, period=self.options.period, warmup_steps=self.options.warmup)
        return PostLocalSGDOptimizer(default(params), averager)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(self.comm.counting(batches, ctx), ctx)

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        """The ranks' average, as Lin et al. evaluate: between averages each rank's model has drifted on its own.
        A copy (every rank builds it: one all-reduce, not counted as training communication), freed at the next
        step so the memory stages do not see it."""
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        self._averaged = averaged = copy.deepcopy(inner)
        for p in averaged.parameters():
            p.grad = None
        average_parameters(averaged.parameters(), dist.group.WORLD)
        return averaged

    def after_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        self._averaged = None

    def results(self, ctx: Context) -> dict[str, Any] | None:
        # DDP all-reduces every gradient once per step: what the same steps would have passed without local SGD
        return {"period": self.options.period, "warmup": self.options.warmup, "communication": self.comm.results(),
                "ddp_bytes_per_step": getattr(self, "param_bytes", None)}

    # ---- reading ------------------------------------------------------------------------------------------

    explains = {Bottleneck.OPTIMIZER: (
        "optimizer-bound: {share}% of the step is the optimizer; local_sgd averages the parameters inside the optimizer "
        "step: a longer period averages less often")}  # PostLocalSGDOptimizer all-reduces inside its step

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The period and DDP warm-up, the bytes each rank all-reduced per sample and their share of DDP's."""
        first = found[0]
        runs = [(f.get("communication") or {}).get("quality_run") or {} for f in found]
        if not any(r.get("steps") for r in runs):
            return f"H={first['period']} after {first['warmup']} DDP steps; no quality run in these trials"
        per_sample = rd.values([r.get("bytes_per_sample") for r in runs])
        share = rd.values([r["bytes"] / (r["steps"] * f["ddp_bytes_per_step"]) for r, f in zip(runs, found, strict=True)
                         if r.get("steps") and f.get("ddp_bytes_per_step")])
        return (f"H={first['period']} after {first['warmup']} DDP steps: {per_sample} bytes per sample all-reduced by "
                f"each rank in the quality run, {share} of DDP's bytes in the same steps")


class _CountingAverager(PeriodicModelAverager):
    """torch's periodic averager, counting the parameters each average all-reduces."""

    def __init__(self, comm: CommCounter, ctx: Context, period: int, warmup_steps: int) -> None:
        super().__init__(period=period, warmup_steps=warmup_steps)
        self.comm, self.ctx = comm, ctx

    def average_parameters(self, params: Any) -> None:
        params = list(params)
        self.step = self.ctx.step  # the trial's step, as the DDP hook's warm-up (a speed window starts past the plan)
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            self.comm.add(get_params_to_average(params), self.ctx)  # what torch flattens and all-reduces
        super().average_parameters(params)
