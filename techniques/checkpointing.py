"""Activation checkpointing per block: keep each block's input, recompute its inside in backward.

Method card
- What: each block runs under ``torch.utils.checkpoint`` (non-reentrant): its inner activations are freed after the
  forward and recomputed in the backward. BatchNorm's running statistics are held still during the recomputation,
  so it stays exact. Functional form: ``apply_checkpointing(model)``.
- When it should pay: when memory limits the batch or the model. It costs about one extra forward per step on any
  device, and pays only when the memory it frees buys a larger batch or model.
- Sources: Chen et al., "Training Deep Nets with Sublinear Memory Cost", arXiv:1604.06174; torch.utils.checkpoint
  docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-checkpointing (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu`: cnn:tiny 0.53x [0.41, 0.69] slower, memory 0.81x less; gpt:tiny 0.61x [0.50, 0.74] slower, memory 0.64x less; mlp:tiny 0.42x [0.17, 1.04] inconclusive, memory 1.00x equivalent.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-auto`: cnn:tiny 0.58x [0.45, 0.74] slower, memory 0.80x less; gpt:tiny 0.75x [0.65, 0.85] slower, memory 0.64x less; mlp:tiny 0.52x [0.39, 0.70] slower, memory 1.00x equivalent.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny 0.74x (no verdict: 1 repeat: a verdict needs 3), memory 0.69x less.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
from torch.utils.checkpoint import checkpoint


class Checkpointed(nn.Module):  # keeps only the block's input; recomputes its inside during backward
    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


for i, block in enumerate(model.blocks):  # the model's nn.ModuleList of repeated blocks
    model.blocks[i] = Checkpointed(block)
for x, y in batches:
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from bench.measure import flops
from techniques.base import Bottleneck, Claim, Context, Kind, Phase, Remedy, Technique, model_blocks, register


@contextlib.contextmanager
def running_stats_frozen(module: nn.Module) -> Iterator[None]:
    """BatchNorm layers under ``module`` normalise with batch statistics as usual but leave their running
    statistics (and batch counters) as they were."""
    layers = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats and m.training]
    saved = [(m.momentum, m.num_batches_tracked.clone()) for m in layers]
    for m in layers:
        m.momentum = 0.0  # running = (1 - 0) * running + 0 * batch: unchanged
    try:
        yield
    finally:
        for m, (momentum, count) in zip(layers, saved, strict=True):
            m.momentum = momentum
            m.num_batches_tracked.copy_(count)


class CheckpointedBlock(nn.Module):
    """Runs ``block`` under non-reentrant activation checkpointing while training."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()) or flops.counting():  # model FLOPs: no recomputation
            return self.block(*args, **kwargs)
        calls = 0

        def run(*a: Any, **k: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:  # the forward pass
                return self.block(*a, **k)
            with running_stats_frozen(self.block):  # the recomputation during backward
                return self.block(*a, **k)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)


def apply_checkpointing(model: nn.Module, blocks: nn.ModuleList | nn.Sequential | None = None) -> nn.Module:
    """Wrap each module of ``blocks`` (default ``model.blocks``) in place; returns the model."""
    blocks = getattr(model, "blocks", None) if blocks is None else blocks
    if not isinstance(blocks, nn.ModuleList | nn.Sequential):
        raise TypeError("activation checkpointing needs the model's blocks as an nn.ModuleList (model.blocks)")
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
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    remedies = (Remedy(Bottleneck.ACTIVATIONS, say="activation checkpointing"),)
    claims = (
        Claim("speedup", 0.65, 0.8, "transformers on GPUs: one extra forward per step (~20-35% less throughput)",
              "Chen et al. 2016 (arXiv:1604.06174); Korthikanti et al. 2022, Reducing Activation Recomputation (arXiv:2205.05198)"),
    )

    def check(self, ctx: Context) -> str | None:
        if ctx.structure is not None and not ctx.structure.blocks:  # None: no model named, nothing to refuse
            return (f"workload '{ctx.workload}' has no blocks to checkpoint (no model.blocks and no nn.ModuleList "
                    "of repeated modules; a user's model can name them: --blocks attr.path)")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return apply_checkpointing(model, model_blocks(model, ctx))
