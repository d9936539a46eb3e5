"""bf16 mixed precision: forward and loss under ``torch.autocast(dtype=torch.bfloat16)``.

Method card
- What: matmuls and convolutions run in bfloat16; parameters, reductions and the optimizer stay fp32. bf16 keeps
  fp32's exponent range, so no loss scaling is needed. Kind numeric.
- When it should pay: where bf16 matrix units outrun fp32's (NVIDIA Ampere and newer, Intel AMX) and the matmuls are
  large enough to hide the casts; elsewhere autocast only adds casts. Of the committed CPUs it was faster only on the
  AMX Xeon, at gpt:small, and slower or inconclusive on every tiny model, avx512_bf16 included. On a GPU it ran
  once, on one H200 (`reports/example-h200-first`), with too few pairs for a verdict.
- Sources: Micikevicius et al., "Mixed Precision Training", ICLR 2018; Kalamkar et al., "A Study of BFLOAT16 for
  Deep Learning Training", arXiv:1905.12322; PyTorch AMP docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-bf16 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu`: cnn:tiny 0.29x [0.16, 0.52] slower, memory 0.60x less; gpt:tiny 0.09x [0.06, 0.14] slower, memory 0.68x less; mlp:tiny 0.10x [0.07, 0.15] slower, memory 1.00x [0.99, 1.02] inconclusive.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-auto`: cnn:tiny 0.93x [0.68, 1.27] inconclusive, memory 0.59x less; gpt:tiny 0.78x [0.58, 1.06] inconclusive, memory 0.68x less; mlp:tiny 0.86x [0.65, 1.15] inconclusive, memory 1.00x equivalent.
- Intel Xeon (AMX), `reports/example-cpu-bf16`: gpt:small 1.66x [1.60, 1.72] faster, memory 0.64x less; gpt:tiny 0.59x [0.44, 0.80] slower, memory 0.68x less; mlp:tiny 0.82x [0.81, 0.83] slower, memory 1.00x equivalent.
- 1 x NVIDIA H200, `reports/example-h200-first`: gpt:gpt2-124m 3.79x [3.20, 4.49] (no verdict: 2 pairs: a verdict needs 3), memory 0.68x (no verdict: 2 pairs: a verdict needs 3).
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

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

from bench.measure import cuda_caps
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
        # Asked of bench.measure.cuda_caps: the planner's process must not initialise CUDA (its trials do).
        if ctx.is_cuda and not cuda_caps.bf16(ctx.device):
            return "this GPU has no bf16 support (needs compute capability 8.0+)"
        return None

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=ctx.device.type, dtype=torch.bfloat16)
