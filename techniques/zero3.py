"""ZeRO stage 3: FSDP2 ``fully_shard`` with ``reshard_after_forward=True``: everything sharded.

Method card
- What: parameters, gradients and optimizer state are sharded across ranks; each block's parameters are
  all-gathered just before its forward and again before its backward, then freed. Per-rank model state for fp32
  AdamW: 16/N bytes per parameter.
- When it helps: models whose state does not fit one device. Costs an extra all-gather per block in backward
  compared with zero2; on a single CPU host with gloo it is pure overhead.
- Measured (2 gloo ranks, AMD EPYC (AVX2 only), reports/example-cpu-2rank): mlp:large 0.36x [0.01, 10.13], no verdict (2
  repeats: a verdict needs 3), model state per rank 386 MiB = the formula's 16/N exactly, clean RSS at rest 712 MiB
  vs DDP's 1.26 GiB; gpt:tiny 0.27x [0.08, 0.93], no verdict.
- Combines with bf16, fp16, grad_accum, checkpointing, offload and compile (compiled block by block before
  sharding: FSDP2 after a whole-model torch.compile fails with 'got mixed torch.Tensor and DTensor').
- Sources: Rajbhandari et al., ZeRO, SC 2020; Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded
  Data Parallel", VLDB 2023; torch.distributed.fsdp.fully_shard docs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from techniques._distributed import apply_fsdp, fsdp_check, shard_batches
from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class Zero3(Technique):
    name = "zero3"
    summary = "ZeRO-3: FSDP2 fully_shard, parameters resharded after forward"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "sharding"
    multi_process = True
    zero_stage = 3
    claims = (
        Claim("model_state_ratio", 0.0, 0.5, "ZeRO paper, Pos+g+p: model state divided by N",
              "Rajbhandari et al., ZeRO, SC 2020, Figure 1"),
    )

    def check(self, ctx: Context) -> str | None:
        return fsdp_check(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return apply_fsdp(model, ctx, reshard_after_forward=True)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(batches, ctx)
