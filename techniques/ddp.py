"""Data parallelism: DistributedDataParallel across the processes torchrun starts.

Method card
- What: every rank holds the full model, trains on its slice of the global batch, and gradients are averaged
  across ranks with all-reduce during backward (bucketed, overlapping communication with computation). The global
  batch and the math equal one process with the same batch: parity checks that.
- When it helps: more devices than one, compute-bound steps. Per-rank model state is unchanged (16 bytes/param for
  fp32 AdamW), plus DDP's gradient buckets (another 4 bytes/param: gradients are copied into buckets unless
  ``gradient_as_bucket_view``, the ``bucket_view=true`` option). On one CPU, several ranks only split the same
  cores: expect no gain there.
- With gradient accumulation the micro-batches before the last run under ``no_sync``: gradients accumulate
  locally and are all-reduced once per optimizer step (a test counts the bucket reductions). Its speed against
  all-reducing every micro-batch is in no committed report.
- Measured (2 gloo ranks x 1 thread vs 1 process x 2 threads, AMD EPYC (AVX2 only), reports/example-cpu-2rank):
  mlp:large 0.79x [0.62, 1.01], gpt:tiny 0.67x [0.46, 0.97], no verdict (2 repeats: a verdict needs 3); per-rank
  model state 771 MiB for mlp:large, the formula exactly (exact byte counts), and the clean RSS at rest 1.26 GiB
  (the buckets add 193 MiB). ``bucket_view=true`` drops that copy; its saving is in no committed report.
- Sources: Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020;
  torch.nn.parallel.DistributedDataParallel docs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from techniques._distributed import needs_world, no_sync_until_last, shard_batches
from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class DDP(Technique):
    name = "ddp"
    summary = "DistributedDataParallel: replicate the model, all-reduce gradients"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "sharding"
    multi_process = True
    zero_stage = 0
    claims = (
        Claim("scaling", 0.9, 1.0, "ResNet/BERT on up to 256 GPUs: near-linear scaling efficiency",
              "Li et al., PyTorch Distributed, VLDB 2020"),
    )

    @dataclass(frozen=True)
    class Options:
        # True: gradients live inside DDP's communication buckets instead of being copied into them, which saves
        # one gradient-sized buffer per rank (torch's docs); off by default, as in torch.
        bucket_view: bool = False

    def check(self, ctx: Context) -> str | None:
        return needs_world(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        ids = [ctx.device.index] if ctx.is_cuda else None
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=self.options.bucket_view)

    def micro_batch_context(self, model: nn.Module, last: bool, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return no_sync_until_last(model, last)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(batches, ctx)
