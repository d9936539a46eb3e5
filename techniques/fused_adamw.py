"""Fused AdamW: the workload's AdamW with ``fused=True``, one kernel for every parameter's update.

Method card
- What: ``torch.optim.AdamW(..., fused=True)`` with the default optimizer's groups and hyperparameters. The default
  launches several small ops per parameter tensor (a Python loop on CPU, ``foreach`` on CUDA); the fused kernel
  updates them all at once. Same math, another rounding order: kind exact (parity holds). Works with GradScaler.
- When it should pay: when the optimizer step is a visible share of the step (many small tensors, small batches),
  and on GPUs where launches dominate the update; not measured on a GPU. With large batches the gain shrinks to
  nothing.
- ``check`` says when this torch or device has no fused kernel.
- Sources: PyTorch ``torch.optim.AdamW`` docs ("fused > foreach > for-loop"); Loshchilov & Hutter, "Decoupled Weight
  Decay Regularization", ICLR 2019; NVIDIA Apex ``FusedAdam``.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-fused_adamw (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

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
