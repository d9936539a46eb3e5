"""Activation checkpointing per block: keep only each block's input, recompute its inside during backward.

Method card
- What: every module in ``model.blocks`` is wrapped so its forward runs under ``torch.utils.checkpoint`` (non-reentrant).
  Activations inside a block are freed after the forward and recomputed in the backward pass.
- When it helps: memory-bound training (bigger batch or model on the same device). Costs one extra forward per block,
  so expect roughly 20-35% lower throughput; it pays off only when the memory it frees buys a larger batch or model.
- Functional form: ``apply_checkpointing(model)``.
- Measured here (DESIGN.md probes, 2-core CPU): tiny GPT tracked tensor peak -49% (4 layers), step speed 0.73-0.80x.
- Sources: Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174; torch.utils.checkpoint docs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from techniques.base import Claim, Context, Kind, Phase, Technique, register


class CheckpointedBlock(nn.Module):
    """Runs ``block`` under non-reentrant activation checkpointing while training."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()):
            return self.block(*args, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def apply_checkpointing(model: nn.Module) -> nn.Module:
    """Wrap each module of ``model.blocks`` in place; returns the model."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError("activation checkpointing needs the model to expose its blocks as `model.blocks` (nn.ModuleList)")
    for i, block in enumerate(blocks):
        if not isinstance(block, CheckpointedBlock):
            blocks[i] = CheckpointedBlock(block)
    return model


@register
class Checkpointing(Technique):
    name = "checkpointing"
    summary = "activation checkpointing of every block (recompute in backward)"
    kind = Kind.EXACT
    phase = Phase.CHECKPOINTING
    claims = (
        Claim("speedup", 0.65, 0.8, "transformers on GPUs: one extra forward per step (~20-35% slower)",
              "Chen et al. 2016 (arXiv:1604.06174); Korthikanti et al. 2022, Reducing Activation Recomputation (arXiv:2205.05198)"),
    )

    def check(self, ctx: Context) -> str | None:
        if not ctx.has_blocks:
            return f"workload '{ctx.workload}' exposes no model.blocks to checkpoint"
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return apply_checkpointing(model)
