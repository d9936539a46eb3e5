"""fp16 mixed precision with dynamic loss scaling (``torch.autocast`` + ``torch.amp.GradScaler``).

Method card
- What: matmuls run in float16; because fp16's range is narrow, the loss is multiplied by a scale before backward
  so small gradients do not flush to zero, gradients are unscaled before the step, and steps with inf/NaN
  gradients are skipped while the scale backs off (Micikevicius et al. 2018).
- When it helps: GPUs with fp16 tensor cores (Volta and newer). On GPUs with bf16 prefer bf16 (no scaler).
  On CPUs there is usually no fast fp16 matmul: the calibrated matmul peaks put fp16 at 23 GFLOP/s against fp32's
  146 on the AMD EPYC (AVX2 only) of reports/example-cpu and 48 against 392 on the AMD EPYC (AVX-512, avx512_bf16)
  of reports/example-cpu-auto (321 against 333 on the Intel Xeon (AMX) of reports/example-cpu-bf16), so fp16
  autocast should run several times slower on the EPYCs: an estimate from the peaks, since no committed report
  measured fp16. It runs and is measured as it is; the report shows the slowdown rather than hiding it.
- Sources: Micikevicius et al., "Mixed Precision Training", ICLR 2018 (arXiv:1710.03740); PyTorch AMP docs.

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
