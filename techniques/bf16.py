"""bf16 mixed precision: run forward and loss under ``torch.autocast(dtype=torch.bfloat16)``.

Method card
- What: matmuls and convolutions run in bfloat16, reductions and the optimizer stay fp32; parameters stay fp32.
  bf16 keeps fp32's exponent range, so no loss scaling is needed (unlike fp16).
- When it helps: on hardware with fast bf16 matrix units (NVIDIA Ampere and newer; CPUs with AVX512-BF16 or AMX).
  On a CPU without them autocast adds casts and can be slower.
- Measured here (2-core AMD EPYC VM, AVX2 only: no avx512_bf16/AMX; torch 2.13 CPU; reports/example-cpu, 3
  repeats): bf16 is slower: mlp:tiny 0.10x [0.07, 0.15], gpt:tiny 0.09x [0.06, 0.14], cnn:tiny 0.29x [0.16, 0.52]
  of fp32's samples/s, each "slower", because bf16 matmul peaks at about 17 GFLOP/s here against 146 for fp32 (the
  report's calibrated peaks). DESIGN.md's probe machine (with avx512_bf16) gave 1.7-1.9x: an estimate from its
  probes, with no committed report behind it.
- Sources: Micikevicius et al., "Mixed Precision Training", ICLR 2018; Kalamkar et al., "A Study of BFLOAT16 for
  Deep Learning Training", arXiv:1905.12322; PyTorch AMP docs.

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
for x, y in batches:
    with torch.autocast(device_type=device, dtype=torch.bfloat16):  # forward and loss in bf16
        loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # outside autocast; parameters and optimizer stay fp32
    optimizer.step()
```
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from techniques.base import Bottleneck, Claim, Context, Kind, Phase, Remedy, Technique, register


@register
class BF16(Technique):
    name = "bf16"
    summary = "bf16 autocast for forward and loss; fp32 master weights"
    kind = Kind.NUMERIC
    phase = Phase.PRECISION
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "precision"
    compute_dtype = "bfloat16"
    remedies = (Remedy(Bottleneck.COMPUTE, if_dtype_faster=True),)  # where its calibrated peak beats fp32's
    claims = (
        Claim("speedup", 1.5, 2.0, "NVIDIA V100/A100 mixed precision vs fp32",
              "NVIDIA, Train With Mixed Precision (docs.nvidia.com/deeplearning/performance/mixed-precision-training)"),
    )

    def check(self, ctx: Context) -> str | None:
        if ctx.is_cuda and not torch.cuda.is_bf16_supported():
            return "this GPU has no bf16 support (needs compute capability 8.0+)"
        return None

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=ctx.device.type, dtype=torch.bfloat16)
