"""Shared pieces of the multi-process techniques (ddp, zero1-3, offload, deepspeed, local_sgd, fedavg, tp, pp).

Everything here runs on torch.distributed, initialised by the trial process that torchrun started; no collective
communication of our own. Each rank trains on its slice of the global batch, so the global batch (and with it the
math) matches a single process with the same batch size: that is what the parity check compares.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from techniques.base import Context, model_blocks


def needs_world(ctx: Context, name: str) -> str | None:
    """The common check: a data-parallel technique needs several processes."""
    if ctx.world_size < 2:
        return f"{name} needs several processes: run the sweep with --nproc 2 or more"
    return None


FSDP_TECHNIQUES = frozenset({"zero2", "zero3"})  # the techniques that shard with FSDP2's fully_shard


def no_sync_until_last(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    """DDP under gradient accumulation: all-reduce once per optimizer step. The micro-batches before the last one
    accumulate local gradients under ``no_sync`` (no extra memory under DDP: ``.grad`` exists either way)."""
    return contextlib.nullcontext() if last else model.no_sync()


def fsdp_check(ctx: Context, name: str) -> str | None:
    """What FSDP2 sharding (zero2 / zero3) cannot run with, and why."""
    if "compile" in ctx.technique_names and ctx.structure is not None and not ctx.structure.blocks:
        # Measured (torch 2.13, gloo): compiling the whole model and then fully_shard-ing it fails in the first
        # forward with "aten.embedding.default got mixed torch.Tensor and DTensor". With FSDP, compile therefore
        # compiles block by block (torchtitan's order), which needs a model with blocks.
        return (f"{name} with compile needs a model with blocks (compiled one by one before sharding); "
                "FSDP2 after a whole-model torch.compile fails: 'got mixed torch.Tensor and DTensor'")
    return needs_world(ctx, name)


def shard_batches(batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
    """Each rank keeps its contiguous slice of every global batch (the batch must divide by the world size)."""
    for x, y in batches:
        if len(x) % ctx.world_size:
            raise ValueError(f"global batch {len(x)} does not divide by world size {ctx.world_size}")
        yield x.chunk(ctx.world_size)[ctx.rank], y.chunk(ctx.world_size)[ctx.rank]


def _local(t: torch.Tensor) -> torch.Tensor:
    if hasattr(t, "ds_tensor"):  # DeepSpeed ZeRO-3: the parameter is an empty placeholder, its shard is here
        return t.ds_tensor
    return t.to_local() if hasattr(t, "to_local") else t  # FSDP2 parameters are DTensors


def local_bytes(tensors: Any) -> int:
    """Bytes of ``tensors`` held by this rank (local shards; a buffer several views share counted once)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = _local(t)
        key = (local.data_ptr(), local.numel()) if local.numel() else id(local)  # views of one buffer count apart
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer keeps the local shard's optimizer here
    source = inner if isinstance(inner, torch.optim.Optimizer) else optimizer
    return list(source.state.values())


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state held by THIS rank (local shards only).

    Per-element optimizer state (AdamW's exp_avg, exp_avg_sq) is what the ZeRO formula counts; the scalar ``step``
    counters (4 bytes per parameter tensor) are reported apart so the comparison with the formula stays exact.
    """
    for module in model.modules():  # FSDP2 leaves parameters gathered after a forward without backward (eval)
        if hasattr(module, "reshard") and type(module).__name__.startswith("FSDP"):
            module.reshard()
    params = list(model.parameters())
    states = _optimizer_state(optimizer)
    elementwise = [v for s in states for v in s.values() if torch.is_tensor(v) and _local(v).dim() > 0]
    scalars = [v for s in states for v in s.values() if torch.is_tensor(v) and _local(v).dim() == 0]
    return {
        "params": local_bytes(params),
        "grads": local_bytes(p.grad for p in params),
        "optimizer": local_bytes(elementwise),
        "optimizer_scalars": sum(_local(v).element_size() for v in scalars),
    }


# Bytes per parameter of fp32 AdamW model state (params 4 + grads 4 + Adam moments 8) on each rank, by ZeRO stage
# (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, sec. 5;
# with fp32 parameters instead of the paper's mixed-precision 2 + 2 + 12 bytes).
def zero_formula_bytes(stage: int, n_params: int, world: int, param_bytes: int = 4, state_bytes: int = 8) -> dict:
    grads = param_bytes
    shard = {0: (1, 1, 1), 1: (1, 1, world), 2: (1, world, world), 3: (world, world, world)}[stage]
    p, g, o = (n_params * b / d for b, d in zip((param_bytes, grads, state_bytes), shard, strict=True))
    return {"params": p, "grads": g, "optimizer": o, "total": p + g + o}


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def apply_fsdp(model: nn.Module, ctx: Context, reshard_after_forward: bool) -> nn.Module:
    """FSDP2 ``fully_shard`` on every block, then on the root (so blocks gather their parameters one at a time).

    CPU offload (``offload`` in the same set) keeps sharded parameters, gradients and optimizer state in host
    memory; pinned memory is asked for only where CUDA exists (pinning needs an accelerator).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy(pin_memory=ctx.is_cuda) if "offload" in ctx.technique_names else OffloadPolicy()
    blocks = model_blocks(model, ctx)
    if blocks is not None:
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    return model


class CommCounter:
    """Bytes this rank hands to collectives, and the global samples trained, split between the quality run (steps
    before ``ctx.total_steps``) and the steps after it (the speed window, its warm-up and the memory passes).

    Counted where a technique calls the collective, from the tensors it passes (the payload), so the number
    follows what actually ran: a ring all-reduce then moves about 2 (N - 1) / N of the payload out of each rank
    and as much in. Techniques call ``add`` beside each collective, ``samples`` on each global batch and put
    ``results()`` in their record under ``"communication"``.
    """

    def __init__(self) -> None:
        self.bytes = {"quality_run": 0, "after": 0}
        self.samples_seen = {"quality_run": 0, "after": 0}
        self.steps = {"quality_run": 0, "after": 0}
        self.calls = {"quality_run": 0, "after": 0}

    @staticmethod
    def phase(ctx: Context) -> str:
        return "quality_run" if ctx.step < ctx.total_steps else "after"

    def add(self, tensors: Any, ctx: Context) -> None:
        """One collective (or point-to-point send) of ``tensors`` (a tensor or an iterable of them)."""
        tensors = [tensors] if torch.is_tensor(tensors) else list(tensors)
        self.bytes[self.phase(ctx)] += sum(t.numel() * t.element_size() for t in tensors)
        self.calls[self.phase(ctx)] += 1

    def counting(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        """``batches`` unchanged, each global batch counted as it is pulled (before its step runs)."""
        for batch in batches:
            self.samples(len(batch[0]), ctx)
            yield batch

    def samples(self, n: int, ctx: Context) -> None:
        """A global batch of ``n`` samples is about to be trained (call before the step runs)."""
        self.samples_seen[self.phase(ctx)] += n
        self.steps[self.phase(ctx)] += 1

    def results(self) -> dict[str, Any]:
        out: dict[str, Any] = {"unit": "bytes this rank passed to collectives and sends (payload), per global sample"}
        for phase in ("quality_run", "after"):
            n, b = self.samples_seen[phase], self.bytes[phase]
            out[phase] = {"steps": self.steps[phase], "samples": n, "bytes": b, "calls": self.calls[phase],
                          "bytes_per_sample": b / n if n else None}
        return out
