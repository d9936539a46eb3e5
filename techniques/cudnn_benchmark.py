"""cudnn_benchmark: cuDNN's autotuner picks each convolution's algorithm by timing them.

Method card
- What: ``torch.backends.cudnn.benchmark = True`` for the trial: the first time a convolution meets a new shape,
  cuDNN times its algorithms and keeps the fastest. Process-global: ``finalize`` restores it. Kind numeric: another
  algorithm sums in another order, and the choice can differ from run to run.
- When it should pay: convolutional models on an NVIDIA GPU with fixed input shapes. The tuning lands in the first
  step (outside the timed window) and again at every new shape, so changing shapes can end up slower.
- Refused off CUDA and without convolutions. Not yet run on a GPU (``pytest -m gpu tests/test_cudnn_benchmark.py``).
- Sources: PyTorch docs, ``torch.backends.cudnn.benchmark`` and "Reproducibility"; PyTorch Performance Tuning Guide.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-cudnn_benchmark (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
torch.backends.cudnn.benchmark = True  # cuDNN times its convolution algorithms once per input shape, keeps the fastest
for x, y in batches:  # the loop itself is unchanged; fixed input shapes keep the tuning to the first step
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

import torch
from torch import nn

from techniques.base import Bottleneck, Context, Kind, Phase, Remedy, Technique, register


def apply_cudnn_benchmark(enabled: bool = True) -> bool:
    """Switch cuDNN's convolution autotuner; returns the previous setting."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    return previous


def has_convolution(model: nn.Module) -> bool:
    """Whether ``model`` holds a convolution layer of any dimension (``nn.Conv1d/2d/3d`` and the transposed ones)."""
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


@register
class CudnnBenchmark(Technique):
    name = "cudnn_benchmark"
    summary = "cuDNN's autotuner: time the convolution algorithms per input shape and keep the fastest (CUDA)"
    kind = Kind.NUMERIC
    phase = Phase.SURGERY  # a process switch: it transforms nothing, so its place in the order does not matter
    own_flops = False  # the same convolutions, other algorithms
    hides_tensors = False
    tune_options = ("",)
    remedies = (
        Remedy(Bottleneck.COMPUTE, say="cudnn_benchmark (convolutional models)", device="cuda",
               why="cuDNN times its convolution algorithms and keeps the fastest"),
    )

    def check(self, ctx: Context) -> str | None:
        if not ctx.is_cuda:
            return f"needs a CUDA device with cuDNN; this trial runs on {ctx.device.type}"
        # the model's description answers at plan time (None: not known; the model is checked when transformed)
        if ctx.structure is not None and ctx.structure.convolutional is False:
            return (f"the model has no convolution (its description: {ctx.structure.source or 'unknown'}); cuDNN's "
                    "autotuner only chooses convolution algorithms, so there is nothing to measure")
        if not torch.backends.cudnn.is_available():
            return "needs a CUDA device with cuDNN; this torch has no cuDNN (torch.backends.cudnn.is_available())"
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        if not has_convolution(model):
            raise ValueError(f"cudnn_benchmark: the model ({type(model).__name__}) has no convolution layer "
                             "(nn.Conv1d/2d/3d); cuDNN's autotuner only chooses convolution algorithms")
        # Process-global, and only CUDA reads it: on a CPU context (refused by check, but reachable in-process)
        # leave it alone rather than leak it into whatever runs next in this process.
        if ctx.is_cuda and "cudnn_benchmark_previous" not in ctx.state:
            ctx.state["cudnn_benchmark_previous"] = apply_cudnn_benchmark(True)
        return model

    def finalize(self, model: nn.Module, ctx: Context) -> None:
        previous = ctx.state.pop("cudnn_benchmark_previous", None)
        if previous is not None:
            apply_cudnn_benchmark(previous)
