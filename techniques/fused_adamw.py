"""Fused AdamW: the workload's AdamW with ``fused=True``, one kernel for the whole update of all parameters.

Method card
- What: ``torch.optim.AdamW(..., fused=True)`` with the default optimizer's parameter groups and hyperparameters.
  The default (``foreach`` on CUDA, a per-parameter Python loop on CPU) launches several small ops per parameter
  tensor per step; the fused implementation does the moment updates, bias correction and weight update of every
  parameter in one multi-tensor kernel. Same math (AdamW, Loshchilov & Hutter): only the floating-point order of
  operations differs, so the kind is ``exact`` (losses match the baseline within the 1e-3 parity tolerance;
  parameters differ by ~1e-8 after a step here, ~1e-6 where a gradient is ~0). It works with GradScaler (fp16):
  the scaler hands the fused kernel its scale and inf flag instead of unscaling separately.
- When it helps: when the optimizer step is a visible part of the step time: many parameter tensors, small
  models or small batches, and on GPUs where per-op launch overhead dominates the update. With a large batch the
  forward and backward dominate and the gain shrinks toward zero.
- Measured here: no committed report yet. Probes on a 2-core AMD EPYC (not committed) found the optimizer step
  shorter fused than in the default per-parameter loop on the tiny workloads; a sweep with an interval, e.g.
  ``python -m bench sweep --workloads mlp:tiny,gpt:tiny,cnn:tiny --techniques fused_adamw --mode speed``, is what
  would say whether whole steps are faster. Parity: the exact tolerance holds (``tests/test_fused_adamw.py``).
- Availability: ``fused=True`` exists for CUDA, CPU (torch 2.4 and newer), MPS and XPU tensors; ``check`` says when
  this torch or device has no fused kernel.
- Sources: PyTorch ``torch.optim.AdamW`` docs (the ``fused`` and ``foreach`` arguments; "fused > foreach >
  for-loop" performance ordering); Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
  NVIDIA Apex ``FusedAdam`` (the original fused multi-tensor Adam).

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # one kernel for every parameter's update
for x, y in batches:
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable

import torch
from torch import nn

from techniques.base import Bottleneck, Context, Kind, Remedy, Technique, register

# Per-group keys that pick an implementation: dropped so the group does not override ``fused=True``.
_IMPL_KEYS = ("foreach", "fused", "capturable", "differentiable")


def fused_devices() -> tuple[str, ...]:
    """Device types with a fused AdamW kernel in this torch (empty when the option does not exist)."""
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return ()
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except ImportError:  # older torch: CUDA only
        return ("cuda",)


def fused_adamw_like(optimizer: torch.optim.Optimizer) -> torch.optim.AdamW:
    """A fused AdamW with the same parameter groups and hyperparameters as ``optimizer`` (an AdamW)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        raise TypeError(f"fused_adamw replaces an AdamW optimizer, got {type(optimizer).__name__}")
    groups = [{k: v for k, v in g.items() if k not in _IMPL_KEYS} for g in optimizer.param_groups]
    return torch.optim.AdamW(groups, fused=True)


@register
class FusedAdamW(Technique):
    name = "fused_adamw"
    summary = "AdamW with fused=True: one kernel updates every parameter (same math)"
    kind = Kind.EXACT
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "optimizer"
    remedies = (
        Remedy(Bottleneck.OPTIMIZER, again="a ZeRO set spreads it over ranks"),
        Remedy(Bottleneck.LAUNCH, device="cuda", why="one kernel for the optimizer's update, not several per "
                                                      "parameter tensor"),
    )

    def check(self, ctx: Context) -> str | None:
        devices = fused_devices()
        if ctx.device.type not in devices:
            have = ", ".join(devices) or "no device"
            return f"torch {torch.__version__} has a fused AdamW for {have}, not for {ctx.device.type}"
        return None

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        # The default factory knows the workload's lr and weight decay; copy its groups into a fused AdamW.
        return fused_adamw_like(default(list(params)))
