"""TF32: fp32 matmuls (and cuDNN convolutions) on NVIDIA tensor cores in TensorFloat-32.

Method card
- What: ``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32``: tensors stay fp32, the matmul rounds
  its inputs to a 10-bit mantissa and accumulates in fp32. Kind numeric. cuDNN convolutions use TF32 by default
  already, so it changes matmuls most (a GPT more than a CNN).
- When it should pay: NVIDIA Ampere and newer, fp32 training dominated by matmuls. Measured on one H200
  (`reports/example-h200-first`); MFU is against the calibrated tfloat32 peak.
- CPU: refused. On an AMD EPYC without AMX torch's CPU equivalent changed neither results nor speed (a probe, not a
  report).
- Sources (published): NVIDIA A100 datasheet and "TensorFloat-32 in the A100 GPU" (2020); PyTorch docs, CUDA
  semantics, "TensorFloat-32 (TF32) on Ampere (and later) devices".

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-tf32 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- 1 x NVIDIA H200, `reports/example-h200-first`: gpt:gpt2-124m 2.59x [2.58, 2.61] faster, memory 1.00x equivalent.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores (NVIDIA Ampere and newer)
torch.backends.cudnn.allow_tf32 = True  # cuDNN convolutions (already PyTorch's default)
for x, y in batches:  # the loop itself is unchanged: tensors stay fp32
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

import torch
from torch import nn

from bench.measure import cuda_caps
from techniques.base import Context, Kind, Phase, Technique, register


def apply_tf32(enabled: bool = True) -> tuple[bool, bool]:
    """Switch TF32 for CUDA matmuls and cuDNN convolutions; returns the previous (matmul, cudnn) settings."""
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return previous


@register
class TF32(Technique):
    name = "tf32"
    summary = "TF32 tensor-core math for fp32 matmuls and convolutions (NVIDIA Ampere+)"
    kind = Kind.NUMERIC
    phase = Phase.PRECISION
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    compute_dtype = "tfloat32"

    def check(self, ctx: Context) -> str | None:
        if not ctx.is_cuda:
            return ("TF32 is a math mode of NVIDIA tensor cores (compute capability 8.0+); on this CPU fp32 "
                    "matmuls are unchanged by it (measured bit-identical), so there is nothing to measure")
        major, minor = cuda_caps.capability(ctx.device)  # no CUDA context in the planner's process
        if major < 8:
            return f"this GPU (compute capability {major}.{minor}) has no TF32 tensor cores (needs 8.0+)"
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        # The switch is process-global and only CUDA reads it: on a CPU context (refused by check, but reachable
        # in-process) leave it alone rather than leak it into whatever runs next in this process.
        if ctx.is_cuda and "tf32_previous" not in ctx.state:
            ctx.state["tf32_previous"] = apply_tf32(True)
        return model

    def finalize(self, model: nn.Module, ctx: Context) -> None:
        previous = ctx.state.pop("tf32_previous", None)
        if previous is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
