"""Gradient accumulation: split each optimizer step's batch into ``steps`` micro-batches.

Method card
- What: the same global batch is processed as ``steps`` forward/backward passes of ``batch/steps`` samples, with the
  loss of each divided by ``steps`` so the accumulated gradient equals the full batch's mean gradient. One optimizer
  step follows.
- When it helps: memory. Activation memory scales with the micro-batch, so a batch that does not fit can be trained
  with the same math. It does not speed anything up: smaller matmuls usually run less efficiently, so expect a
  slowdown that grows with ``steps``.
- Exactness: equal to the full batch for models whose forward treats samples independently (MLP, GPT). NOT equal for
  models with BatchNorm, whose statistics are computed per micro-batch; the parity check reports that mismatch.
- Sources: PyTorch forum and docs on gradient accumulation; Goyal et al., "Accurate, Large Minibatch SGD" (2017)
  discuss BatchNorm's per-worker statistics, the same effect.

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
steps = 4  # micro-batches per optimizer step; the batch must split into equal parts
for x, y in batches:
    optimizer.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(steps), y.chunk(steps), strict=True):
        loss = loss_fn(model(xs), ys) / steps  # the mean of equal chunks' means is the batch's mean
        loss.backward()  # gradients add up in .grad
    optimizer.step()
```
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from techniques.base import Bottleneck, Kind, Remedy, Technique, TrainConfig, register


@register
class GradAccum(Technique):
    name = "grad_accum"
    summary = "split each step's batch into micro-batches and accumulate gradients"
    kind = Kind.EXACT
    slot = "micro_batching"
    remedies = (Remedy(Bottleneck.ACTIVATIONS, say="gradient accumulation"),)
    tune_options = ("steps=2", "steps=4")  # bench tune: halving and quartering the micro-batch
    own_flops = False
    hides_tensors = False

    @dataclass(frozen=True)
    class Options:
        steps: int = 4

        def __post_init__(self) -> None:
            if self.steps < 1:
                raise ValueError(f"steps must be >= 1, got {self.steps}")

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        if cfg.batch_size % self.options.steps:
            raise ValueError(
                f"grad_accum: batch size {cfg.batch_size} is not divisible by steps={self.options.steps}"
            )
        return replace(cfg, micro_batches=cfg.micro_batches * self.options.steps)
