"""fp16 mixed precision with dynamic loss scaling (``torch.autocast`` + ``torch.amp.GradScaler``).

Method card
- What: matmuls run in float16. fp16's range is narrow, so the loss is scaled up before backward (small gradients
  would flush to zero), gradients are unscaled before the step, and a step with inf/NaN gradients is skipped while
  the scale backs off. Options: ``init_scale``, ``growth_interval``.
- When it should pay: GPUs with fp16 tensor cores (Volta and newer); where bf16 is fast too, bf16 needs no scaler.
  Not measured on a GPU. On the two committed AMD EPYCs the calibrated fp16 matmul peak (each report's Setup) is far
  below fp32's, so expect it slower there; no committed report measured it.
- Sources: Micikevicius et al., "Mixed Precision Training", ICLR 2018 (arXiv:1710.03740); PyTorch AMP docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-fp16 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
scaler = torch.amp.GradScaler(device, enabled=device == "cuda")  # dynamic loss scaling (a no-op when disabled)
for x, y in batches:
    with torch.autocast(device_type=device, dtype=torch.float16):
        loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # unscales, skips the step on inf/NaN gradients
    scaler.update()
```
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class FP16(Technique):
    name = "fp16"
    summary = "fp16 autocast with dynamic loss scaling (GradScaler)"
    kind = Kind.NUMERIC
    phase = Phase.PRECISION
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "precision"
    compute_dtype = "float16"
    claims = (
        Claim("speedup", 1.5, 3.0, "NVIDIA V100 tensor cores, mixed precision vs fp32",
              "Micikevicius et al., Mixed Precision Training, ICLR 2018; NVIDIA mixed-precision training guide"),
    )

    @dataclass(frozen=True)
    class Options:
        init_scale: float = 2.0**16
        growth_interval: int = 2000

        def __post_init__(self) -> None:
            if self.init_scale <= 0 or self.growth_interval < 1:
                raise ValueError("init_scale must be > 0 and growth_interval >= 1")

    def transform_model(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        ctx.state["grad_scaler"] = torch.amp.GradScaler(
            ctx.device.type, init_scale=self.options.init_scale, growth_interval=self.options.growth_interval
        )
        return model

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=ctx.device.type, dtype=torch.float16)

    def backward(self, loss: torch.Tensor, ctx: Context) -> bool:
        ctx.state["grad_scaler"].scale(loss).backward()
        return True

    def optimizer_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> bool:
        scaler: torch.amp.GradScaler = ctx.state["grad_scaler"]
        scaler.step(optimizer)  # unscales first; skips the step when a gradient is inf/NaN
        scaler.update()
        return True
