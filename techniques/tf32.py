"""TF32: fp32 matmuls (and cuDNN convolutions) on NVIDIA tensor cores in TensorFloat-32.

Method card
- What: ``torch.backends.cuda.matmul.allow_tf32 = True`` (equivalently ``torch.set_float32_matmul_precision("high")``)
  and ``torch.backends.cudnn.allow_tf32 = True``. Tensors stay fp32; inside the matmul the inputs are rounded to
  TF32 (fp32's 8-bit exponent, a 10-bit mantissa like fp16) and accumulated in fp32. No code changes, no loss
  scaling. Kind ``numeric``: losses are close to fp32's, not bit-equal. The previous settings are restored in
  ``finalize``; outside a trial process (``apply_tf32``) the caller owns the global switch.
- Note on the baseline: PyTorch already lets cuDNN convolutions use TF32 by default (``cudnn.allow_tf32`` is True),
  while matmuls default to full fp32. So on a GPU the fp32 baseline's convolutions are TF32 already, and this
  technique changes the matmuls (Linear, attention) most: expect a large effect on the GPT and a small one on the CNN.
- Combining: it has no slot and combines with ``bf16``/``fp16``, as common recipes do (nanoGPT sets both), but under
  autocast most matmuls already run in 16 bits, so the combination adds little beyond the ops autocast keeps in fp32.
- When it helps: NVIDIA Ampere (compute capability 8.0) and newer, fp32 training dominated by matmuls: the A100's
  dense TF32 peak is 156 TFLOP/s against 19.5 for plain FP32 (published: 8x); PyTorch's docs time a 10240^2 matmul
  about 7 times faster (published).
  End-to-end gains are smaller (memory-bound ops do not change).
- On CPU: ``check`` refuses. torch maps ``set_float32_matmul_precision("high")`` to oneDNN's
  ``fp32_precision="tf32"`` on CPU, but on an AMD EPYC without AMX (a probe, torch 2.13; not a report) that left
  ``torch.mm``, ``nn.Linear`` and ``nn.Conv2d`` results bit-identical and their speed within noise (and
  ``"medium"``, oneDNN bf16, was bit-identical too), so a CPU trial would only measure the baseline again. The CUDA
  switch used here does not touch the CPU path at all.
- Measured on one NVIDIA H200 (reports/example-h200-first, speed only, 3 repeats): gpt:gpt2-124m at batch 8
  2.59x [2.58, 2.61] the fp32 baseline's samples/s, faster. Not on a CPU (see above). MFU of a tf32 trial is
  against the calibrated tfloat32 peak (measured with TF32 on; docs/methodology.md).
- Sources (published): NVIDIA, "TensorFloat-32 in the A100 GPU Accelerates AI Training, HPC up to 20x" (blogs.nvidia.com, 2020);
  NVIDIA A100 datasheet; PyTorch docs, CUDA semantics, "TensorFloat-32 (TF32) on Ampere (and later) devices".

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
