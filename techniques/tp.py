"""Tensor parallelism (Megatron-LM style) of a model's blocks through ``torch.distributed.tensor.parallel``.

Method card
- What: each block's first projections (attention's q, k and v or its fused qkv; the MLP's up and gate) are sharded
  by output column (``ColwiseParallel``), the second (attention's output, the MLP's down) by input row
  (``RowwiseParallel``), so each rank holds ``1/degree`` of those weights and computes ``heads/degree`` whole heads
  and ``1/degree`` of the MLP's hidden units: an all-reduce of the activations per row-parallel layer in forward, of
  the input gradient per column-parallel layer in backward. Embeddings, norms and the head stay replicated, and every
  rank trains the same full batch, so the math is one process's (parity checks it). A fused qkv is reordered
  head-major and its attention replaced by causal SDPA over that layout. Before training, the sharded model's output
  on a small probe must match the whole model's within 1e-4 of its largest value: an attention that hard-codes its
  head count fails there, with one line. Kind exact.
- When it should pay: layers too large for one device's memory, or matmuls large enough to split, on GPUs joined by a
  fast link (NVLink in one node): the all-reduces sit on every layer's critical path. Per-rank parameter bytes shrink
  for the sharded projections only. On one CPU host with gloo it is overhead only: each rank computes the same batch
  on a share of the cores and waits on exposed all-reduces. Not run on a GPU yet.
- Options and caveats: ``degree`` (0: all ranks; a degree below the world size would leave data-parallel replicas
  that need FSDP on a 2-D mesh, not implemented, and is refused). Refused for a model without described blocks,
  attention or MLP, for ``nn.MultiheadAttention`` and GPT-2's Conv1D projections, for a fused qkv with rotary
  embeddings, grouped key/value heads or non-causal attention, when heads or hidden units do not divide by the
  degree, and for dropout; with ``ddp``, ``zero1``-``zero3``, ``deepspeed``, ``offload``, ``local_sgd``,
  ``fedavg``, ``pp``, ``mtp``, ``efficient_arch``, ``compile`` and ``fp16``. No sequence parallelism. ``results`` records the bytes this
  rank passes to collectives per step and its parameter bytes.
- Sources: Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism",
  arXiv:1909.08053, sec. 3; torchtitan's ``apply_tp``; torch.distributed.tensor.parallel docs
  (``parallelize_module``).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-tp (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-parallelism/gpt`: gpt:tiny 0.29x [0.16, 0.52] slower, memory 1.01x [1.00, 1.02] inconclusive (the whole interval above 1, not clear of the threshold) (RSS).
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny 0.28x on 2 cores against 1: unequal resources; per core 0.14x (no verdict: 1 repeat: a verdict needs 3), memory 1.02x [1.00, 1.05] inconclusive (RSS).
<!-- end generated -->
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bench.core.structure import ModelStructure
from techniques import _reading as rd
from techniques._distributed import CommCounter, local_bytes, needs_world
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, model_structure, register

FSDP_PARTNERS = ("zero2", "zero3")
_WRAPPERS = ("block", "_checkpoint_wrapped_module", "_orig_mod")  # checkpointing's / compile's wrapped module
PROBE_SHAPE = (2, 16)  # token ids of the probe the sharded model is checked on (batch, at most this many positions)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}  # max |sharded - whole| / max |whole|; 2e-2 for 16-bit
_HEADS_HINT = ("its attention's forward likely assumes the full head count (tp needs it to read the heads from the "
               "projections' width, e.g. view(B, T, -1, head_dim) and reshape(B, T, -1))")


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
    whole heads: ``out(SDPA(q, k, v, is_causal=True))`` with every head's q, k, v read from ``qkv``'s output. Under
    tensor parallelism ``qkv`` returns this rank's heads only, and the head count is read from its width. The two
    projections keep the names they had in the replaced attention (``qkv_name``, ``out_name``)."""

    def __init__(self, qkv: nn.Linear, out: nn.Linear, head_dim: int, dropout: float = 0.0,
                 qkv_name: str = "qkv", out_name: str = "proj") -> None:
        super().__init__()
        self.qkv_name, self.out_name = qkv_name, out_name
        self.add_module(qkv_name, qkv)
        self.add_module(out_name, out)
        self.head_dim = head_dim
        self.dropout = dropout

    @classmethod
    def from_fused(cls, qkv: nn.Linear, out: nn.Linear, heads: int, head_dim: int, dropout: float = 0.0,
                   qkv_name: str = "qkv", out_name: str = "proj") -> HeadMajorAttention:
        """The attention of ``qkv`` (rows ``[q; k; v]``, reordered head-major in place: same Linear, same
        Parameters) and ``out``."""
        order = head_major_rows(heads, head_dim).to(qkv.weight.device)
        with torch.no_grad():
            qkv.weight.copy_(qkv.weight[order])
            if qkv.bias is not None:
                qkv.bias.copy_(qkv.bias[order])
        return cls(qkv, out, head_dim, dropout, qkv_name, out_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = getattr(self, self.qkv_name)(x).view(B, T, -1, 3, self.head_dim)  # -1: this rank's heads
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return getattr(self, self.out_name)(y.transpose(1, 2).reshape(B, T, -1))


def _home(block: nn.Module, path: str) -> nn.Module:
    """The module inside ``block`` (looking through checkpointing's or compile's wrappers) where ``path`` resolves."""
    node = block
    while True:
        try:
            node.get_submodule(path)
            return node
        except AttributeError:
            inner = next((getattr(node, a) for a in _WRAPPERS if isinstance(getattr(node, a, None), nn.Module)), None)
            if inner is None:
                raise ValueError(f"tp: the model's description names {path!r} in each block, but its block "
                                 f"{type(block).__name__} has no such module") from None
            node = inner


def _part(block: nn.Module, path: str) -> nn.Module:
    return _home(block, path).get_submodule(path)


def description_problem(s: ModelStructure, degree: int) -> str | None:
    """Why a model so described cannot be tensor-parallelised ``degree`` ways, or None (the plan's reason: the
    technique's name is put before it). What the description cannot show (dropout, an attention forward that
    hard-codes its head count) is found on the model itself (``model_problem``, the probe in ``transform_model``)."""
    lacking = s.lacks("blocks", "attention", "mlp")
    if lacking:
        return lacking
    a, mlp = s.attention, s.mlp
    assert a is not None and mlp is not None
    if a.packed:
        return ("shards the attention's projections as modules; this model's attention (nn.MultiheadAttention) "
                "computes them inside its forward")
    for part, transposed in (("attention", a.transposed), ("MLP", mlp.transposed)):
        if transposed:
            return (f"shards nn.Linear projections (weights stored (out, in)); this model's {part} stores them "
                    "(in, out) (GPT-2's Conv1D), which torch's ColwiseParallel and RowwiseParallel do not shard")
    if a.projections is None or not a.out:
        return ("needs the attention's q, k, v (or fused qkv) and output projections as modules; the model's "
                "description names " + (f"no {'output projection' if a.projections else 'q, k, v or qkv'}"))
    if a.projections == "fused":
        if a.kv_heads != a.heads:
            return (f"splits a fused qkv projection by whole heads only with as many key/value heads as query heads "
                    f"({a.kv_heads} and {a.heads} here): describe separate q, k, v projections")
        if a.rotary:
            return ("replaces an attention with a fused qkv projection by causal SDPA over its head-major rows, "
                    "which would drop this model's rotary embeddings: describe separate q, k, v projections (the "
                    "model's own forward then runs on each rank's heads)")
        if s.causal is False:
            return ("replaces an attention with a fused qkv projection by causal SDPA; this model is not causal: "
                    "describe separate q, k, v projections")
        inside = a.module and all(p.startswith(f"{a.module}.") and "." not in p[len(a.module) + 1:]
                                  for p in (a.qkv, a.out))
        if not inside:
            return ("replaces an attention with a fused qkv projection as a whole: the description must name the "
                    "attention module and its qkv and output projections as its direct children")
    for what, n in (("attention heads", a.heads), ("key/value heads", a.kv_heads), ("MLP hidden units", mlp.hidden)):
        if n and n % degree:
            return f"tp:degree={degree} needs the model's {what} divisible by it; the model has {n}"
    return None


def model_problem(model: nn.Module, s: ModelStructure, degree: int) -> str | None:
    """What the description cannot show and the built model does: projections that are not nn.Linear, widths that do
    not divide, dropout (sharded heads would draw other random numbers than one process). None: none of these."""
    a, mlp = s.attention, s.mlp
    assert a is not None and mlp is not None
    blocks = model.get_submodule(s.blocks)
    for i, block in enumerate(blocks):
        for rel in _colwise(s) + _rowwise(s):
            m = _part(block, rel)
            if type(m) is not nn.Linear:
                return (f"tp shards nn.Linear projections; the model's block {i} has {rel} as a {type(m).__name__}")
        for rel in _colwise(s):
            if _part(block, rel).out_features % degree:
                return (f"tp:degree={degree} needs every column-parallel projection's width divisible by it; block "
                        f"{i}'s {rel} has {_part(block, rel).out_features}")
        attention = _part(block, a.module) if a.module else None
        for attr in ("dropout", "attention_dropout", "attn_dropout"):
            p = getattr(attention, attr, 0.0)
            if isinstance(p, float | int) and not isinstance(p, bool) and p > 0:
                return "tp with dropout is not exact (sharded heads draw other random numbers than one process)"
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return "tp with dropout is not exact (sharded heads draw other random numbers than one process)"
    return None


def _dropout_of(attention: nn.Module) -> float:
    p = getattr(attention, "dropout", 0.0)
    return float(p) if isinstance(p, float | int) and not isinstance(p, bool) else 0.0


def _colwise(s: ModelStructure) -> list[str]:
    """The block's projections sharded by output column: attention's q, k, v (or fused qkv), the MLP's gate and up."""
    a, mlp = s.attention, s.mlp
    assert a is not None and mlp is not None
    attention = [a.qkv] if a.projections == "fused" else [a.q, a.k, a.v]
    return [p for p in (*attention, mlp.gate, mlp.up) if p]


def _rowwise(s: ModelStructure) -> list[str]:
    """The block's projections sharded by input row: attention's output and the MLP's down projection."""
    a, mlp = s.attention, s.mlp
    assert a is not None and mlp is not None and a.out
    return [a.out, mlp.down]


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model's output (a tensor, a tuple or list of them, a dict, an object with ``logits``),
    DTensors gathered whole."""
    if isinstance(value, torch.Tensor):
        return [value.full_tensor() if hasattr(value, "full_tensor") else value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    logits = getattr(value, "logits", None)
    return _tensors(logits) if logits is not None else []


def probe_outputs(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The model's output tensors on ``x`` in eval mode without gradients (every module's mode restored)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            return [t.detach().clone() for t in _tensors(model(x))]
    finally:
        for m, training in modes:
            m.training = training


def difference(whole: list[torch.Tensor], sharded: list[torch.Tensor]) -> float:
    """The largest absolute difference of the outputs, relative to the whole model's largest value; inf when the
    outputs do not even have the same shapes."""
    if len(whole) != len(sharded) or any(a.shape != b.shape for a, b in zip(whole, sharded, strict=True)):
        return math.inf
    worst = 0.0
    for a, b in zip(whole, sharded, strict=True):
        if a.is_floating_point():
            scale = float(a.abs().max()) if a.numel() else 0.0
            worst = max(worst, float((a.double() - b.double()).abs().max()) / max(scale, 1e-30) if a.numel() else 0.0)
        elif not torch.equal(a, b):
            return math.inf
    return worst


@register
class TensorParallel(Technique):
    name = "tp"
    summary = "tensor parallelism: Megatron-style column/row-sharded attention and MLP (parallelize_module)"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
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
        self.example: torch.Tensor | None = None  # the probe input, when tune drew one (no token embedding)
        self._probe_diff: float | None = None

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
        if ctx.structure is None:  # no model named (a device-level listing): nothing to refuse yet
            return None
        return description_problem(ctx.structure, degree)

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        """A model without a described token embedding gets its probe input from the data: two training samples
        of a fresh copy of the workload (a one-off cost, outside the steps). Token models need no copy."""
        s = ctx.structure
        if s is not None and not s.embedding and description_problem(s, self.degree(ctx)) is None:
            built = probe.fresh()
            x = next(built.batches(built.batch_size, ctx.seed))[0]
            self.example = x[: PROBE_SHAPE[0]].clone() if torch.is_tensor(x) else None
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        degree = self.degree(ctx)
        s = model_structure(model, ctx)
        problem = description_problem(s, degree)
        if problem:
            raise ValueError(problem if problem.startswith("tp") else f"tp: {problem}")
        problem = model_problem(model, s, degree)
        if problem:
            raise ValueError(problem)
        a = s.attention
        assert a is not None
        x = self._probe_input(model, s, ctx)
        whole = probe_outputs(model, x)
        mesh = init_device_mesh(ctx.device.type, (degree,), mesh_dim_names=("tp",))
        blocks = model.get_submodule(s.blocks)
        for block in blocks:
            if a.projections == "fused":  # whole heads in every contiguous shard: the head-major layout
                assert a.module and a.qkv and a.out
                home = _home(block, a.module)
                old = home.get_submodule(a.module)
                qkv_name, out_name = a.qkv.rsplit(".", 1)[-1], a.out.rsplit(".", 1)[-1]
                new = HeadMajorAttention.from_fused(getattr(old, qkv_name), getattr(old, out_name), a.heads,
                                                    a.head_dim, _dropout_of(old), qkv_name, out_name)
                new.train(old.training)
                parent, _, name = a.module.rpartition(".")
                setattr(home.get_submodule(parent) if parent else home, name, new)
            # Column-parallel projections take the replicated activation and return this rank's columns (whole
            # heads, a slice of the MLP's hidden units) as plain local tensors; the row-parallel ones take them and
            # all-reduce their output, which is replicated again. Why everything else stays consistent: after each
            # row-parallel all-reduce the residual stream is bit-identical on every rank, so norms, the head, the
            # loss and the gradients reaching them are identical; in backward the column-parallel layers' input
            # gradient (a partial sum per rank) is all-reduced by torch's ColwiseParallel, so the gradient entering
            # each norm and the embeddings is identical too. Replicated parameters therefore get the same gradients
            # on every rank without a collective of their own, and AdamW keeps them equal.
            for rel in _colwise(s):
                parallelize_module(_part(block, rel), mesh, ColwiseParallel())
            for rel in _rowwise(s):
                parallelize_module(_part(block, rel), mesh, RowwiseParallel())
        self._guard(model, x, whole, mesh, ctx)
        for block in blocks:  # counted after the probe: its forward is no training communication anyway
            for rel in _rowwise(s):
                self._count(_part(block, rel), ctx, output=True)
            for rel in _colwise(s):
                self._count(_part(block, rel), ctx, output=False)
        self._info = {"degree": degree, "n_head": a.heads, "local_heads": a.heads // degree,
                      "kv_heads": a.kv_heads, "projections": a.projections, "blocks": len(blocks),
                      "param_bytes_per_rank": local_bytes(model.parameters()),
                      "sharded": [f"{rel} (colwise)" for rel in _colwise(s)] + [f"{rel} (rowwise)"
                                                                                  for rel in _rowwise(s)],
                      "probe": {"shape": list(x.shape), "max_rel_diff": self._probe_diff}}
        return model

    def _probe_input(self, model: nn.Module, s: ModelStructure, ctx: Context) -> torch.Tensor:
        """A small input the model is checked on before and after sharding: ``tune``'s samples, else token ids
        drawn from the described embedding's vocabulary (a fixed generator: the same on every rank)."""
        example = getattr(self, "example", None)
        if example is not None:
            return example.to(ctx.device)
        if not s.embedding:
            raise ValueError("tp checks the sharded model's output against the whole model's on a probe input, made "
                             "from the token embedding or tune's samples; this model has no embedding described and "
                             "no samples were drawn")
        vocab = model.get_submodule(s.embedding).num_embeddings
        T = min(ctx.sequence_length or PROBE_SHAPE[1], PROBE_SHAPE[1])
        ids = torch.randint(0, vocab, (PROBE_SHAPE[0], T), generator=torch.Generator().manual_seed(0))
        return ids.to(ctx.device)

    def _guard(self, model: nn.Module, x: torch.Tensor, whole: list[torch.Tensor], mesh: Any, ctx: Context) -> None:
        """Raise ValueError, on every rank alike, unless the sharded model computes what the whole one computed on
        ``x``. An attention forward that hard-codes its head count either fails on a rank's share of the heads or,
        worse, silently computes other heads (``view(B, T, n_head, -1)`` halves head_dim): this catches both."""
        failure = ""
        try:
            diff = difference(whole, probe_outputs(model, x))
        except Exception as exc:  # every rank fails alike: the same code on the same shapes
            diff, failure = math.inf, f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        worst = torch.tensor([diff], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=mesh.get_group())
        self._probe_diff = float(worst)
        dtype = whole[0].dtype if whole else torch.float32
        tol = TOLERANCE.get(dtype, 2e-2)
        if self._probe_diff <= tol:
            return
        if failure:
            raise ValueError(f"tp: the sharded model fails on a probe input ({failure}): {_HEADS_HINT}")
        if math.isinf(self._probe_diff):
            raise ValueError(f"tp: the sharded model's output differs in shape from the whole model's on a probe "
                             f"input (or another rank's forward failed): {_HEADS_HINT}")
        raise ValueError(f"tp: the sharded model's output differs from the whole model's on a probe input (largest "
                         f"difference {self._probe_diff:.1e} of its largest value; tolerance {tol:g}): {_HEADS_HINT}, "
                         "or computes math that column/row sharding does not keep")

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

