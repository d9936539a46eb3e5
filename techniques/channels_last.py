"""channels_last: convolutional models in the NHWC memory format.

Method card
- What: ``model.to(memory_format=torch.channels_last)`` gives every 4-D parameter and buffer (the Conv2d weights)
  NHWC strides: the same shape (N, C, H, W), with the channels now the innermost, contiguous dimension. A forward
  pre-hook on the model converts its 4-D tensor inputs the same way, so the first convolution meets NHWC on both
  sides; PyTorch then keeps the activations NHWC from layer to layer (convolution, BatchNorm, ReLU and the residual
  adds preserve the format), and the weight gradients come out NHWC too.
- Why a pre-hook and not ``wrap_data``: the hook sits on the model, so it converts every forward's input, the
  evaluation's included (``evaluate`` calls the model directly, never through the training batches), whatever
  supplies the batches (the workload's own or a ``loader``), after the loop has moved them to the device. Inputs
  that are not 4-D (token ids, vectors) pass untouched. It uses ``.to(memory_format=...)``: for a 1-channel image
  (Fashion-MNIST's N x 1 x 28 x 28) ``.contiguous(memory_format=...)`` keeps the NCHW strides (784, 784, 28, 1),
  while ``.to`` writes the channels_last ones (784, 1, 28, 1), as PyTorch's tutorial warns (the same bytes).
- When it helps: convolutions on NVIDIA tensor cores (Volta and newer) in fp16/bf16 (and TF32): cuDNN's fastest
  convolution kernels are NHWC, and an NCHW model pays a transpose before and after each one (NVIDIA's guide
  recommends NHWC "where possible"); PyTorch's tutorial measured +8-35% for AMP training of torchvision models on a
  V100, +22% for ResNet-50. On CPUs, oneDNN computes convolutions in NHWC or blocked layouts, so NCHW tensors are
  reordered around each one; Intel's PyTorch extension turns channels_last on by default for that reason.
- Refusals: models without convolutions gain nothing (only 4-D tensors change). ``check`` asks the model's
  description (``bench.core.structure``: declared by the built-in workloads, derived for Hugging Face models, inferred
  from a user's modules by the check that builds it before the sweep) and refuses one without Conv2d at plan time;
  where that is not known the trial checks the model it transforms: a ValueError saying it has no nn.Conv2d.
- Kind ``numeric`` (measured, not assumed: a deterministic probe, not a report): on the AMD EPYC (AVX2 only)
  (torch 2.13, oneDNN) the NHWC
  convolution and BatchNorm kernels sum in another order. cnn:tiny, seed 0, 2 threads, against the baseline: the
  first forward's logits differ by up to 3.1e-6, every parameter's first gradient by 1e-7 to 6e-7 (relative
  1e-6 to 1e-5); the losses of steps 1-3 happened to be bit-equal, step 4 differs by 5.1e-5 (2.2e-5 relative), and
  over 8 steps by up to 6.8e-4 (3.5e-4 relative), the parameters by up to 1.2e-3. The harness's parity check (8
  steps, numeric tolerance) passes. cuDNN's NHWC kernels are other kernels again: on a GPU expect a difference of
  the same kind (not bit-equality), with its own size.
- Measured (reports/example-cpu-bottleneck, AMD EPYC (AVX2 only), 5 repeats): 1.01x [0.85, 1.19] on cnn:tiny and
  1.03x [0.86, 1.23] on cnn_aug:tiny, both inconclusive: 28 x 28 images with 8-32 channels likely leave oneDNN
  little reordering to save. Not yet run on a GPU.
- Sources: PyTorch tutorial, "Channels Last Memory Format in PyTorch" (Fedyunin;
  pytorch.org/tutorials/intermediate/memory_format_tutorial.html), its "Performance Gains" section; NVIDIA,
  "Convolutional Layers User's Guide" (Deep Learning Performance documentation), "Tensor Layouts In Memory: NCHW vs
  NHWC" (docs.nvidia.com/deeplearning/performance/dl-performance-convolutional); Intel Extension for PyTorch docs,
  "Channels Last".

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(8, 4))
cnn = cnn.to(memory_format=torch.channels_last)  # 4-D weights in NHWC strides
cnn_optimizer = torch.optim.AdamW(cnn.parameters(), lr=1e-3)
for _, y in batches:
    images = torch.randn(len(y), 3, 16, 16)  # your N x C x H x W batch
    loss = loss_fn(cnn(images.to(memory_format=torch.channels_last)), y)  # inputs NHWC too
    cnn_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    cnn_optimizer.step()
```
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from techniques.base import Claim, Context, Kind, Phase, Technique, register


def _inputs_channels_last(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.to(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4
                 else a for a in args)


def apply_channels_last(model: nn.Module) -> nn.Module:
    """Parameters and buffers of ``model`` in channels_last, and its 4-D inputs converted by a forward pre-hook.
    Raises ValueError when the model has no Conv2d (nothing would change but the bookkeeping)."""
    if not any(isinstance(m, nn.Conv2d) for m in model.modules()):
        raise ValueError(f"channels_last: the model ({type(model).__name__}) has no nn.Conv2d layer, so the NHWC "
                         "memory format changes nothing; use it on convolutional models")
    model = model.to(memory_format=torch.channels_last)
    model.register_forward_pre_hook(_inputs_channels_last)
    return model


@register
class ChannelsLast(Technique):
    name = "channels_last"
    summary = "NHWC (channels_last) memory format for convolutional models and their 4-D inputs"
    kind = Kind.NUMERIC
    phase = Phase.SURGERY
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    claims = (
        Claim("speedup", 1.08, 1.35, "AMP training of torchvision models on an NVIDIA V100 (ResNet-50: +22%)",
              "PyTorch tutorial, Channels Last Memory Format in PyTorch, Performance Gains"),
    )

    def check(self, ctx: Context) -> str | None:
        # the model's description answers at plan time (None: not known; the model is checked when transformed)
        if ctx.structure is not None and ctx.structure.convolutional is False:
            return (f"workload '{ctx.workload}' is a model without convolutions (its description: "
                    f"{ctx.structure.source or 'unknown'}): the NHWC memory format only changes 4-D (Conv2d) tensors, "
                    "so there is nothing to measure")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return apply_channels_last(model)
