"""channels_last: convolutional models in the NHWC memory format.

Method card
- What: ``model.to(memory_format=torch.channels_last)`` gives the 4-D weights NHWC strides, and a forward pre-hook
  converts 4-D inputs (evaluation's too); the layers keep the format. Kind numeric: NHWC kernels sum in another
  order.
- When it should pay: convolutions on NVIDIA tensor cores in fp16/bf16 or TF32, whose fastest cuDNN kernels are NHWC
  (an NCHW model pays a transpose around each); not measured on a GPU. oneDNN on CPUs reorders NCHW too; expect
  little from small images with few channels. Refused without ``nn.Conv2d``.
- Sources: PyTorch tutorial "Channels Last Memory Format in PyTorch" (published: +22% for AMP training of ResNet-50
  on a V100); NVIDIA, "Convolutional Layers User's Guide" (NCHW vs NHWC); Intel Extension for PyTorch docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-channels_last (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-bottleneck`: cnn:tiny 1.01x [0.85, 1.19] inconclusive, memory 1.04x more; cnn_aug:tiny 1.03x [0.86, 1.23] inconclusive, memory 1.04x more.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

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
