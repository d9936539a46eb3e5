"""ZeRO stage 2 (as far as FSDP2 goes): ``fully_shard`` with ``reshard_after_forward=False``.

Method card
- What: gradients and optimizer state are sharded across ranks (reduce-scatter instead of all-reduce), parameters
  are all-gathered for the forward pass and kept gathered until after backward.
- How FSDP's modes map to ZeRO, honestly: FSDP2 always stores parameters sharded between steps; with
  ``reshard_after_forward=False`` the gathered parameters live from forward through backward, which is ZeRO-2's
  communication pattern (one all-gather per step), but at rest the parameters are sharded as in ZeRO-3. So the
  per-rank model state measured between steps is 16/N bytes per parameter (ZeRO-3's figure), while the peak during
  a step carries the full parameters (ZeRO-2's). The record shows both the formula for stage 2 and what was measured.
- Measured (2 gloo ranks, AMD EPYC (AVX2 only), reports/example-cpu-2rank): mlp:large 0.57x [0.52, 0.64], no verdict (2
  repeats: a verdict needs 3), with 386 MiB model state per rank at rest (ZeRO-3's figure, the ZeRO-2 formula says
  482 MiB) and 712 MiB clean RSS at rest vs DDP's 1.26 GiB; its median step was shorter than zero3's (2.10 vs 3.38 s,
  an estimate: one all-gather per step fewer); gpt:tiny 0.30x [0.24, 0.36], no verdict.
- When it helps: large models on several devices where gradients and optimizer state dominate memory.
- Combines with bf16, fp16, grad_accum, checkpointing, offload and compile (compiled block by block before
  sharding: FSDP2 after a whole-model torch.compile fails with 'got mixed torch.Tensor and DTensor').
- Sources: Rajbhandari et al., ZeRO, SC 2020; Zhao et al., "PyTorch FSDP", VLDB 2023; torch FSDP2 docs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from techniques._distributed import apply_fsdp, fsdp_check, shard_batches
from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class Zero2(Technique):
    name = "zero2"
    summary = "ZeRO-2-like: FSDP2 fully_shard, parameters kept gathered from forward to backward"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "sharding"
    multi_process = True
    zero_stage = 2
    memory_note = ("FSDP2 keeps parameters sharded between steps, so at rest zero2 holds ZeRO-3's 16/N bytes per "
                   "parameter; the full parameters exist only during the step")
    claims = (
        Claim("model_state_ratio", 0.125, 0.5, "ZeRO paper, Pos+g: up to 8x smaller model state",
              "Rajbhandari et al., ZeRO, SC 2020, Figure 1"),
    )

    def check(self, ctx: Context) -> str | None:
        return fsdp_check(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return apply_fsdp(model, ctx, reshard_after_forward=False)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(batches, ctx)
