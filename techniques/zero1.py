"""ZeRO stage 1: shard the optimizer state across ranks (``ZeroRedundancyOptimizer`` under DDP).

Method card
- What: DDP, but each rank keeps AdamW's moments only for the parameters it owns, updates those and broadcasts them.
  torch gives whole tensors to ranks, so with uneven sizes a shard is only about 1/N of the state.
- When it should pay: optimizer state dominates memory and several devices are there. Not run on a GPU yet.
- Sources: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020;
  ``torch.distributed.optim.ZeroRedundancyOptimizer`` docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-zero1 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-2rank`: gpt:tiny 0.40x [0.28, 0.57] (no verdict: 2 pairs: a verdict needs 3), memory 0.98x [0.80, 1.21] (no verdict: 2 pairs: a verdict needs 3) (RSS); mlp:large 0.87x [0.27, 2.81] (no verdict: 2 pairs: a verdict needs 3), memory 1.09x [1.01, 1.17] (no verdict: 2 pairs: a verdict needs 3) (RSS).
<!-- end generated -->
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from techniques._distributed import needs_world, no_sync_until_last, shard_batches
from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class Zero1(Technique):
    name = "zero1"
    summary = "ZeRO-1: optimizer state sharded (ZeroRedundancyOptimizer + DDP)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "sharding"
    multi_process = True
    zero_stage = 1
    claims = (
        Claim("model_state_ratio", 0.25, 0.5, "ZeRO paper, Pos with large N: 4x smaller model state (mixed precision)",
              "Rajbhandari et al., ZeRO, SC 2020, Figure 1"),
    )

    def check(self, ctx: Context) -> str | None:
        return needs_world(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        ids = [ctx.device.index] if ctx.is_cuda else None
        return DistributedDataParallel(model, device_ids=ids)

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        from torch.distributed.optim import ZeroRedundancyOptimizer  # lazy: importing it is slow and noisy

        probe = default([torch.nn.Parameter(torch.zeros(1))])  # the default's class and hyper-parameters
        settings = {k: v for k, v in probe.defaults.items() if k in ("lr", "betas", "eps", "weight_decay")}
        return ZeroRedundancyOptimizer(list(params), optimizer_class=type(probe), **settings)

    def micro_batch_context(self, model: nn.Module, last: bool, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return no_sync_until_last(model, last)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(batches, ctx)
