"""bf16 mixed precision: run forward and loss under ``torch.autocast(dtype=torch.bfloat16)``.

Method card
- What: matmuls and convolutions run in bfloat16, reductions and the optimizer stay fp32; parameters stay fp32.
  bf16 keeps fp32's exponent range, so no loss scaling is needed (unlike fp16).
- When it helps: on hardware with fast bf16 matrix units (NVIDIA Ampere and newer; CPUs with AVX512-BF16 or AMX).
  On a CPU without them autocast adds casts and can be slower.
- Measured here, on four machines (committed reports; machines named as in docs/examples.md):
  - AMD EPYC (AVX2 only: no avx512_bf16 or AMX), reports/example-cpu, 3 repeats: slower everywhere, mlp:tiny 0.10x
    [0.07, 0.15], gpt:tiny 0.09x [0.06, 0.14], cnn:tiny 0.29x [0.16, 0.52] of fp32's samples/s, each "slower":
    its calibrated bf16 matmul peak is about 17 GFLOP/s against fp32's 146.
  - AMD EPYC (AVX-512, avx512_bf16), reports/example-cpu-auto: gpt:tiny 0.78x [0.58, 1.06], mlp:tiny 0.86x
    [0.65, 1.15], cnn:tiny 0.93x [0.68, 1.27], each inconclusive, although bf16's calibrated peak is above
    fp32's: the tiny steps are spent in casts, small kernels and the optimizer.
  - Intel Xeon (AMX), reports/example-cpu-bf16: gpt:small 1.66x [1.60, 1.72] faster, within the published
    1.5-2x; gpt:tiny 0.59x [0.44, 0.80] and mlp:tiny 0.82x [0.81, 0.83], both slower.
  - One NVIDIA H200, reports/example-h200-first: gpt:gpt2-124m at batch 8, 3.79x [3.20, 4.49] of fp32's
    samples/s with no verdict (2 pairs: a verdict needs 3).
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
