"""Tensor parallelism (Megatron-LM style) of the GPT blocks through ``torch.distributed.tensor.parallel``.

Method card
- What: every block's attention and MLP are split across the ranks of a tensor-parallel group, the way Megatron-LM
  does it: the first projection of each pair is sharded by output column (``ColwiseParallel``: attention's fused
  ``qkv``, the MLP's ``fc``), the second by input row (``RowwiseParallel``: both ``proj``), so each rank holds
  ``1/degree`` of those weights and computes ``n_head/degree`` whole heads and ``1/degree`` of the MLP's hidden
  units. Per block pair one all-reduce of the activations in forward (the row-parallel output) and one of the input
  gradient in backward (the column-parallel input): 4 all-reduces of ``B x T x d_model`` per transformer block and
  step. Embeddings, layer norms and the tied head stay replicated; every rank trains the same full batch, so the
  math is the single process's (parity checks it). torch's own engine does the sharding and the collectives
  (``parallelize_module`` on a ``DeviceMesh``); nothing here communicates by itself.
- The fused ``qkv`` weight is ``[q; k; v]``: a column shard of it would give rank 0 all of q and half of k, not whole
  heads. The surgery reorders its rows head-major, ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]`` (Megatron's own fused
  layout), so any contiguous shard holds whole heads with their q, k and v; the attention's forward reads q, k, v
  per head from that layout. The same math exactly, for any degree (a unit test compares outputs in one process),
  and one backward all-reduce for q, k and v together (three separate Linears would cost three).
- When it helps: a model whose layers are too wide for one device's memory or whose matmuls are big enough to split
  (GPUs in one NVLink node: the all-reduces sit on the critical path). Per-rank parameter bytes shrink for the
  sharded projections only. On a CPU host with gloo and a tiny model it is pure overhead: the same full batch is
  computed on every rank and the all-reduces are exposed.
- Caveats: the GPT workload only (blocks holding its ``CausalSelfAttention`` and ``MLP``): other models, look-alikes
  with other attention math included, are refused. ``n_head`` must divide by the degree (found when the model is built: the plan does not know a
  workload's size). Degree = world size: a smaller degree leaves data-parallel replicas, which need FSDP on the
  other axis of a 2-D mesh (torchtitan's FSDP + TP); that is not implemented (``apply_fsdp`` shards over the whole
  world), so ``tp`` with ``zero2``/``zero3`` and a degree below the world size are refused with the reason. Not
  combined with compile (it runs before sharding in phase order; torchtitan compiles after TP), fp16 (the loss
  scaler would judge each rank's gradient shards alone and might skip a step on one rank only) nor with dropout
  (dropout of sharded heads draws other random numbers than one process). No sequence parallelism (it needs
  reduce-scatter, which gloo lacks). ``results`` records the bytes this rank passes to collectives per training
  step, counted from the tensor shapes the sharded layers see (not a formula), and the per-rank parameter bytes.
- Measured (2 gloo ranks x 1 thread against 1 process x 2 threads, 2-core AMD EPYC, gpt:tiny, 3 seeds;
  docs/parallelism.md): 0.29x [0.16, 0.52] of the baseline's samples/s (slower), exact (parity ok, curves match),
  model state per rank 956 KiB against DDP's 1.7 MiB, 131 kB all-reduced per sample per rank (4.7x DDP's gradient
  bytes).
- Sources: Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
  Parallelism", arXiv:1909.08053 (2019), sec. 3; torchtitan (pytorch/torchtitan, ``parallelize.py``,
  ``apply_tp``); torch.distributed.tensor.parallel docs (``parallelize_module``, ``ColwiseParallel``,
  ``RowwiseParallel``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from techniques import _reading as rd
from techniques._distributed import CommCounter, local_bytes, needs_world
from techniques.base import Context, Kind, Phase, Technique, model_blocks, register

SUPPORTED_WORKLOADS = frozenset({"gpt"})  # models with GPT's block structure (bench/workloads/gpt_chars.py)
FSDP_PARTNERS = ("zero2", "zero3")
_WRAPPERS = ("block", "_checkpoint_wrapped_module", "_orig_mod")  # checkpointing's / compile's wrapped module


def head_major_rows(n_head: int, head_dim: int) -> torch.Tensor:
    """Row order that turns a fused ``[q; k; v]`` weight (3 x n_head x head_dim rows) head-major: for each head its
    q rows, then its k rows, then its v rows. ``new = old[order]``; ``old[order] = new`` undoes it."""
    d = n_head * head_dim
    head = torch.arange(n_head)[:, None, None]
    part = torch.arange(3)[None, :, None]
    within = torch.arange(head_dim)[None, None, :]
    return (part * d + head * head_dim + within).reshape(-1)


class HeadMajorAttention(nn.Module):
    """Causal self-attention whose fused ``qkv`` projection is head-major, so a contiguous column shard of it holds
    whole heads. Computes what ``gpt_chars.CausalSelfAttention`` computes; under tensor parallelism ``qkv`` returns
    this rank's heads only, and the head count is read from its width."""

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.qkv, self.proj = qkv, proj
        self.n_head = n_head  # heads this module computes (n_head / degree once sharded)
        self.head_dim = proj.out_features // n_head
        self.dropout = dropout

    @classmethod
    def from_fused(cls, attn: nn.Module) -> HeadMajorAttention:
        """The same attention with ``attn.qkv``'s rows reordered head-major (same Linear, same Parameters)."""
        n_head, d = attn.n_head, attn.proj.out_features
        order = head_major_rows(n_head, d // n_head).to(attn.qkv.weight.device)
        with torch.no_grad():
            attn.qkv.weight.copy_(attn.qkv.weight[order])
            if attn.qkv.bias is not None:
                attn.qkv.bias.copy_(attn.qkv.bias[order])
        return cls(attn.qkv, attn.proj, n_head, getattr(attn, "dropout", 0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x).view(B, T, -1, 3, self.head_dim)  # -1: this rank's heads
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


def _unwrap(block: nn.Module) -> nn.Module:
    """The block itself inside checkpointing's or compile's wrapper."""
    while not hasattr(block, "attn"):
        inner = next((getattr(block, a) for a in _WRAPPERS if isinstance(getattr(block, a, None), nn.Module)), None)
        if inner is None:
            return block
        block = inner
    return block


def structure_problem(model: nn.Module, ctx: Context, degree: int) -> str | None:
    """Why ``model`` cannot be tensor-parallelised ``degree`` ways, or None. Its blocks must hold the GPT workload's
    own attention and MLP (``bench/workloads/gpt_chars.py``): the surgery rewrites that attention's forward, so a
    look-alike with other math (rotary embeddings, a gated MLP) is refused rather than silently changed."""
    from bench.workloads.gpt_chars import MLP, CausalSelfAttention

    blocks = model_blocks(model, ctx) if ctx.has_blocks else None
    if blocks is None or len(blocks) == 0:
        return "tp needs a model with blocks (GPT's: attn.qkv, attn.proj, mlp.fc, mlp.proj); this one has none"
    for i, wrapped in enumerate(blocks):
        block = _unwrap(wrapped)
        attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
        if not isinstance(attn, CausalSelfAttention) or not isinstance(mlp, MLP):
            return (f"tp shards the GPT workload's blocks (attn: CausalSelfAttention with a fused qkv, mlp: MLP); "
                    f"block {i} has attn {type(attn).__name__}, mlp {type(mlp).__name__}")
        if attn.n_head % degree:
            return f"tp:degree={degree} needs n_head divisible by it; the model has n_head={attn.n_head}"
        if mlp.fc.out_features % degree:
            return f"tp:degree={degree} needs the MLP's hidden width divisible by it ({mlp.fc.out_features})"
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()) or any(
            getattr(_unwrap(b).attn, "dropout", 0.0) for b in blocks):
        return "tp with dropout is not exact (sharded heads draw other random numbers than one process)"
    return None


@register
class TensorParallel(Technique):
    name = "tp"
    summary = "tensor parallelism: Megatron-style column/row-sharded attention and MLP (parallelize_module)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    slot = "tensor_parallel"
    multi_process = True
    splits_batch = False  # every rank trains the whole global batch
    conflicts = frozenset({"ddp", "zero1", "deepspeed", "offload", "local_sgd", "fedavg", "pp"})

    @dataclass(frozen=True)
    class Options:
        degree: int = 0  # ranks one layer is split across; 0: all of them

        def __post_init__(self) -> None:
            if self.degree < 0:
                raise ValueError(f"degree must be 0 (all ranks) or positive, got {self.degree}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._bytes: collections.Counter[int] = collections.Counter()  # per optimizer step (ctx.step)
        self._calls: collections.Counter[int] = collections.Counter()
        self.comm = CommCounter()
        self._info: dict[str, Any] = {}

    def degree(self, ctx: Context) -> int:
        return self.options.degree or ctx.world_size

    def check(self, ctx: Context) -> str | None:
        reason = needs_world(ctx, self.name)
        if reason:
            return reason
        degree = self.degree(ctx)
        fsdp = [n for n in FSDP_PARTNERS if n in ctx.technique_names]
        if fsdp:
            least = 2 * max(self.options.degree, 2)  # world = degree x dp with degree >= 2 and dp >= 2
            if ctx.world_size < least:
                return (f"{fsdp[0]} composes with tp only on a 2-D mesh, world = tp degree x dp with both >= 2: at "
                        f"least {least} ranks; this sweep has {ctx.world_size}")
            return (f"tp with {fsdp[0]} (FSDP on the data-parallel axis of a 2-D mesh) is not implemented: "
                    "FSDP here shards over the whole world")
        if degree > ctx.world_size or ctx.world_size % degree:
            return f"tp:degree={degree} does not divide the {ctx.world_size} ranks"
        if degree != ctx.world_size:
            return (f"tp:degree={degree} on {ctx.world_size} ranks leaves {ctx.world_size // degree} data-parallel "
                    "replicas, which need FSDP on a 2-D mesh (not implemented): use degree 0 (all ranks)")
        if "fp16" in ctx.technique_names:
            # GradScaler looks for inf/NaN in each rank's local shards only: one rank could skip the step while
            # the other takes it, and the replicated parameters would part silently.
            return "tp with fp16 is refused: the loss scaler checks each rank's local gradient shards only"
        if "compile" in ctx.technique_names:
            return "tp with compile is not supported: compile runs before sharding here, torchtitan compiles after TP"
        if ctx.workload not in SUPPORTED_WORKLOADS:
            return (f"tp shards GPT-style blocks (attn.qkv, attn.proj, mlp.fc, mlp.proj); workload {ctx.workload!r} "
                    "has no such structure (supported: gpt)")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        degree = self.degree(ctx)
        problem = structure_problem(model, ctx, degree)
        if problem:
            raise ValueError(problem)
        mesh = init_device_mesh(ctx.device.type, (degree,), mesh_dim_names=("tp",))
        blocks = model_blocks(model, ctx)
        assert blocks is not None
        n_head = 0
        for wrapped in blocks:
            block = _unwrap(wrapped)
            n_head = block.attn.n_head
            block.attn = HeadMajorAttention.from_fused(block.attn)
            # Column-parallel qkv / fc take the replicated activation and return this rank's columns (whole heads,
            # a slice of the MLP's hidden units) as plain local tensors; row-parallel proj takes them and
            # all-reduces its output, which is replicated again. Why everything else stays consistent: after each
            # row-parallel all-reduce the residual stream is bit-identical on every rank, so layer norms, the tied
            # head, the loss and the gradients reaching them are identical; in backward the column-parallel layers'
            # input gradient (a partial sum per rank) is all-reduced by torch's ColwiseParallel, so the gradient
            # entering each layer norm and the embeddings is identical too. Replicated parameters therefore get the
            # same gradients on every rank without a collective of their own, and AdamW keeps them equal.
            parallelize_module(block, mesh, {
                "attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel(),
            })
            block.attn.n_head = n_head // degree
            self._count(block.attn.proj, ctx, output=True)
            self._count(block.mlp.proj, ctx, output=True)
            self._count(block.attn.qkv, ctx, output=False)
            self._count(block.mlp.fc, ctx, output=False)
        self._info = {"degree": degree, "n_head": n_head, "local_heads": n_head // degree, "blocks": len(blocks),
                      "param_bytes_per_rank": local_bytes(model.parameters()),
                      "sharded": ["attn.qkv (colwise)", "attn.proj (rowwise)", "mlp.fc (colwise)",
                                  "mlp.proj (rowwise)"]}
        return model

    def _count(self, module: nn.Module, ctx: Context, output: bool) -> None:
        """Count the bytes of the all-reduce ``module`` makes torch run in a training step, from the tensors it
        sees: a row-parallel layer's output, all-reduced in its forward (again when checkpointing recomputes it);
        a column-parallel layer's input gradient, all-reduced in backward (counted when backward produces it, so a
        recomputed forward, whose graph is never backpropagated, adds nothing). Forwards without autograd
        (evaluation) are not training communication: left out."""

        def add(t: torch.Tensor) -> None:
            t = t.to_local() if hasattr(t, "to_local") else t
            self.comm.add(t, ctx)
            self._bytes[ctx.step] += t.numel() * t.element_size()
            self._calls[ctx.step] += 1
            for old in [s for s in self._bytes if s < ctx.step - 1]:  # keep the last two steps
                del self._bytes[old], self._calls[old]

        def after_forward(mod: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            if mod.training and torch.is_grad_enabled():
                add(out)

        def before_forward(mod: nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0]
            if mod.training and torch.is_grad_enabled() and x.requires_grad:
                x.register_hook(add)  # x is still the plain replicated activation: this hook runs before torch's

        if output:
            module.register_forward_hook(after_forward)
        else:
            module.register_forward_pre_hook(before_forward, prepend=True)

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return self.comm.counting(batches, ctx)  # every rank trains the whole batch: counted for bytes per sample

    def results(self, ctx: Context) -> dict[str, Any] | None:
        if not self._info:
            return None
        last = max(self._bytes, default=None)
        return {
            **self._info,
            "communication": self.comm.results(),  # bytes this rank passed to all-reduces, per sample
            "bytes_per_step": self._bytes[last] if last is not None else None,  # the last training step's
            "communication_detail": {
                "collectives_per_step": self._calls[last] if last is not None else None,
                "collective": "all_reduce (sum) over the tp group",
                "counted": "row-parallel outputs (forward) and column-parallel input gradients (backward), from "
                           "the shapes seen in the last training step; a ring all-reduce sends "
                           f"{2 * (self._info['degree'] - 1) / self._info['degree']:g}x these bytes on the wire",
            },
        }

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """Heads and parameter bytes per rank, all-reduces per step and bytes per sample."""
        first = found[0]
        per_sample = rd.values([((f.get("communication") or {}).get("quality_run") or {}).get("bytes_per_sample")
                              for f in found])
        calls = (first.get("communication_detail") or {}).get("collectives_per_step")
        return (f"degree {first['degree']}: {first['local_heads']} of {first['n_head']} heads per rank, "
                f"{rd.fmt_bytes(first.get('param_bytes_per_rank'))} of parameters per rank; {calls} all-reduces a step, "
                f"{per_sample} bytes per sample passed by each rank in the quality run")

