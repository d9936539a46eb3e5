"""cudnn_benchmark: cuDNN's autotuner picks each convolution's algorithm by timing them.

Method card
- What: ``torch.backends.cudnn.benchmark = True`` for the trial. The first time a convolution meets a new
  configuration (input shape, dtype, memory format, weights), cuDNN runs the algorithms it has for it and keeps the
  fastest; later calls of that configuration reuse the choice. Off (PyTorch's default), cuDNN's heuristics choose
  without timing. ``torch.backends.cudnn.benchmark_limit`` caps how many algorithms are tried (cuDNN v8 API). The
  switch is process-global: ``finalize`` restores what it was; outside a trial process (``apply_cudnn_benchmark``)
  the caller owns it.
- When it helps: convolutional models on an NVIDIA GPU whose input shapes stay fixed, where the heuristic's choice is
  not the fastest. The autotuning runs once per configuration, so it lands in the trial's first step (timed on its
  own, outside the timed window) and again for every new shape: a model whose inputs change size (a sequence-length
  curriculum, images of varying size) tunes again each time and can end up slower.
- Kind ``numeric``: another algorithm sums in another order, so results are close to the baseline's, not
  bit-identical; PyTorch's reproducibility notes add that the choice itself can differ from run to run (timing noise),
  so two runs of this set need not match each other either (``torch.backends.cudnn.deterministic`` is the switch for
  that, not used here).
- Refusals: ``check`` refuses anything but a CUDA device with cuDNN (the switch does nothing elsewhere), and a model
  whose description says it has no convolution (``bench.core.structure``: ``convolutional``, which looks for Conv2d);
  where that is not known, the trial checks the model it is given for any ``nn.Conv*`` layer (a ValueError without
  one). It names no workload.
- Measured: nothing yet. The GPU path has not run here (no GPU in the session that added it); the CPU tests check the
  refusals and that the switch is set and restored. ``pytest -m gpu tests/test_cudnn_benchmark.py`` trains it on a
  GPU.
- Sources: PyTorch docs, ``torch.backends.cudnn.benchmark`` and ``benchmark_limit``
  (pytorch.org/docs/stable/backends.html); PyTorch docs, "Reproducibility", section "CUDA convolution benchmarking"
  (pytorch.org/docs/stable/notes/randomness.html); PyTorch Performance Tuning Guide, "Enable cuDNN auto-tuner"
  (pytorch.org/tutorials/recipes/recipes/tuning_guide.html).

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
