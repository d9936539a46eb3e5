"""Helpers shared by the techniques that change the model (distill, prune, qat, fp8, sparse24, efficient_arch, mtp):
parameter counts, which weights are tied, GPT-2's initialisation drawn from a trial's own generator, and whether the
optional torchao package is there."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from bench.measure import cuda_caps
from techniques.base import Context

TORCHAO_MISSING = "needs torchao (pip install 'trainbench[torchao]')"


def torchao_missing(ctx: Context) -> str | None:
    """The reason a torchao technique cannot run when the package is absent (``ctx.available_packages`` is filled
    with ``importlib.util.find_spec`` by ``bench.plan.planner.available_packages``), else None."""
    return None if "torchao" in ctx.available_packages else TORCHAO_MISSING


def cuda_capability_problem(device: torch.device, minimum: tuple[int, int], needs: str) -> str | None:
    """Why ``device`` cannot run kernels that need CUDA compute capability ``minimum`` (``needs`` says what needs
    which GPUs), or None."""
    if device.type != "cuda":
        return f"{needs}; this device is {device.type}"
    major, minor = cuda_caps.capability(device)  # no CUDA context in the planner's process
    if (major, minor) < minimum:
        return f"{needs}; this device is {cuda_caps.name(device)} (compute capability {major}.{minor})"
    return None


def module_tensors(model: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers: what holding it costs in memory."""
    return [*model.parameters(), *model.buffers()]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied parameter once


def shared_weights(model: nn.Module) -> dict[str, list[str]]:
    """For each module whose ``weight`` Parameter another module also holds (a tied head): the other holders."""
    owners: dict[int, list[str]] = defaultdict(list)
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners[id(param)].append(name)
    out = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter) and len(owners[id(weight)]) > 1:
            out[name] = [o for o in owners[id(weight)] if o != name]
    return out


@torch.no_grad()
def normal_(t: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """N(0, std) from a CPU generator, copied in: the same values on every device, the global RNG untouched."""
    t.copy_(torch.randn(t.shape, generator=gen) * std)


@torch.no_grad()
def gpt2_init_(module: nn.Module, n_layer: int, gen: torch.Generator) -> None:
    """GPT-2's initialisation (as ``bench.workloads.gpt_chars.GPT``) of new layers, drawn from ``gen``: weights
    N(0, 0.02), residual projections (``*proj.weight``) N(0, 0.02 / sqrt(2 n_layer)), biases 0, norm weights 1."""
    for name, p in module.named_parameters():
        if name.endswith("proj.weight"):
            normal_(p, 0.02 / math.sqrt(2 * n_layer), gen)
        elif p.dim() >= 2:
            normal_(p, 0.02, gen)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def once(found: list[dict[str, Any]], seconds: str, what: str) -> str:
    """How often a cached artefact (teacher, checkpoint) was trained in these trials and what it cost per trial."""
    trained = [f.get(seconds) or 0.0 for f in found if not f.get("cached")]
    cost = max((f.get(seconds) or 0.0 for f in found), default=0.0)
    if not trained:
        return f"{what} in {_secs(cost)} by an earlier trial (all {len(found)} loaded it from the sweep's cache)"
    return (f"{what} in {_secs(cost)} ({len(trained)} of these {len(found)} trials trained it, the others loaded "
            f"it from the sweep's cache): {_secs(sum(trained) / len(found))} per trial here, outside their "
            "one-off costs")
