"""efficient_arch: a leaner model of the same build (grouped-query attention, depthwise-separable convs).

Method card
- What: the model's description decides. Blocks with described attention get grouped-query attention: the key and
  value projections cut to ``kv_heads`` heads (default 1: multi-query), each repeated to the query heads in place, so
  the attention's own forward, masks and rotary embeddings are unchanged. Else blocks with plain kxk ``nn.Conv2d``
  get depthwise-separable convolutions (a depthwise kxk conv, BatchNorm, ReLU, a pointwise 1x1). Anything else is
  skipped, the missing part named.
- When it should pay: fewer parameters and FLOPs per step. GQA's gain is mostly at inference (a smaller KV cache);
  in training only the key/value projections shrink. A depthwise conv is memory-bound, often slower per FLOP than a
  dense one, so time falls less than FLOPs, if at all. Not measured on a GPU. The record counts parameters, FLOPs
  and KV-cache bytes before and after.
- Refused with ``tp`` and ``pp``, and for ``nn.MultiheadAttention``.
- Sources: Ainslie et al., "GQA", EMNLP 2023 (arXiv:2305.13245); Shazeer, "Fast Transformer Decoding", 2019
  (arXiv:1911.02150); Howard et al., "MobileNets", 2017 (arXiv:1704.04861).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-efficient_arch (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny 0.78x [0.13, 4.78] (no verdict: 2 pairs: a verdict needs 3), memory 1.46x more.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny 0.92x [0.41, 2.05] inconclusive, memory 0.95x less.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-user-models-structure`: small_resnet:small 0.78x [0.49, 1.23] inconclusive, memory 1.52x more.
<!-- end generated -->
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bench.core.structure import HOW_TO_DESCRIBE, Attention, ModelStructure
from techniques import _reading as rd
from techniques._model import n_params
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, model_structure, register

KV_CACHE_BYTES = 4  # the KV cache counted in fp32, the workload's parameter dtype
SEED_MIX = 0x9E3779B97F4A7C15  # the new layers' draws apart from the workload's (seeded with the same seed)


SDPA_GQA: bool | None = None  # sdpa_gqa()'s answer, once asked


def sdpa_gqa() -> bool:
    """Whether this torch's SDPA broadcasts key/value heads itself (``enable_gqa``, torch >= 2.5).

    Asked on first use, not at import: a tensor op at import starts torch's OpenMP thread pool, and the fork server
    (``bench.forkserver``) imports this module and must fork trials from a process without one."""
    global SDPA_GQA
    if SDPA_GQA is None:
        q, kv = torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2)
        try:
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            SDPA_GQA = True
        except TypeError:
            SDPA_GQA = False
    return SDPA_GQA


def init_generator(seed: int) -> torch.Generator:
    """The CPU generator the new layers are drawn from (one per trial seed)."""
    return torch.Generator().manual_seed((seed * SEED_MIX + 1) % 2**63)


@torch.no_grad()
def _uniform_(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    t.copy_((torch.rand(t.shape, generator=gen) * 2 - 1) * bound)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with ``n_head`` query heads sharing ``kv_heads`` key/value heads (MQA when 1)."""

    def __init__(self, d_model: int, n_head: int, kv_heads: int, dropout: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if d_model % n_head or n_head % kv_heads:
            raise ValueError(f"d_model ({d_model}) must divide into n_head ({n_head}) heads and n_head into "
                             f"kv_heads ({kv_heads}) groups")
        self.n_head, self.kv_heads, self.head_dim, self.dropout = n_head, kv_heads, d_model // n_head, dropout
        factory = {"device": device, "dtype": dtype}
        self.q = nn.Linear(d_model, d_model, **factory)
        self.kv = nn.Linear(d_model, 2 * kv_heads * self.head_dim, **factory)
        self.proj = nn.Linear(d_model, d_model, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        H, G, hd = self.n_head, self.kv_heads, self.head_dim
        q = self.q(x).view(B, T, H, hd).transpose(1, 2)
        k, v = (t.view(B, T, G, hd).transpose(1, 2) for t in self.kv(x).split(G * hd, dim=2))
        extra = {}
        if G != H:
            if sdpa_gqa():
                extra["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True, **extra)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def _empty_gqa(attn: nn.Module, kv_heads: int) -> GroupedQueryAttention:
    """A GQA module shaped for ``attn``'s model, on its device and dtype, its values unset (no RNG drawn)."""
    weight = attn.qkv.weight
    d, n_head = attn.qkv.in_features, attn.n_head
    if n_head % kv_heads:
        valid = ", ".join(str(k) for k in range(1, n_head + 1) if n_head % k == 0)
        raise ValueError(f"efficient_arch: kv_heads={kv_heads} does not divide the model's {n_head} "
                         f"attention heads (valid: {valid})")
    new = GroupedQueryAttention(d, n_head, kv_heads, float(getattr(attn, "dropout", 0.0)), device="meta",
                                dtype=weight.dtype)
    return new.to_empty(device=weight.device)


@torch.no_grad()
def gqa_from_mha(attn: nn.Module, kv_heads: int) -> GroupedQueryAttention:
    """``attn`` (fused multi-head attention) converted to GQA the way Ainslie et al. uptrain a checkpoint: the
    query and output projections copied, each group's key and value heads mean-pooled (weights, biases). With
    ``kv_heads == n_head`` it computes exactly what ``attn`` computes."""
    new = _empty_gqa(attn, kv_heads)
    d, H, hd = attn.qkv.in_features, attn.n_head, attn.qkv.in_features // attn.n_head
    group = H // kv_heads
    w, b = attn.qkv.weight, attn.qkv.bias
    new.q.weight.copy_(w[:d])
    k_w, v_w = (w[i * d : (i + 1) * d].view(kv_heads, group, hd, d).mean(1).reshape(-1, d) for i in (1, 2))
    new.kv.weight.copy_(torch.cat([k_w, v_w]))
    if b is not None:
        new.q.bias.copy_(b[:d])
        k_b, v_b = (b[i * d : (i + 1) * d].view(kv_heads, group, hd).mean(1).reshape(-1) for i in (1, 2))
        new.kv.bias.copy_(torch.cat([k_b, v_b]))
    else:
        new.q.bias.zero_()
        new.kv.bias.zero_()
    new.proj.load_state_dict(attn.proj.state_dict())
    return new


def _kv_problem(kv_heads: int, heads: int, current: int) -> str | None:
    if current % kv_heads == 0:
        return None
    valid = ", ".join(str(k) for k in range(1, current + 1) if current % k == 0)
    what = "attention" if current == heads else "key/value"
    return f"kv_heads={kv_heads} does not divide the model's {current} {what} heads (valid: {valid})"


def _valid_kv(kv_heads: int, heads: int, current: int) -> None:
    problem = _kv_problem(kv_heads, heads, current)
    if problem:
        raise ValueError(f"efficient_arch: {problem}")


def _repeat_heads(t: torch.Tensor, head_dim: int, repeats: int) -> torch.Tensor:
    """(..., g * hd) -> (..., g * repeats * hd): each head repeated ``repeats`` times in place (head i of the
    output is head i // repeats of the input: query head i reads its group's key/value head)."""
    if repeats == 1:
        return t
    return t.unflatten(-1, (-1, head_dim)).repeat_interleave(repeats, dim=-2).flatten(-2)


class GroupedQKV(nn.Module):
    """A fused [q; k; v] projection whose key/value heads are shared in groups: ``q`` computes the query heads,
    ``kv`` ``kv_heads`` key and value heads, each repeated to the ``heads_out`` heads the attention's own forward
    splits its input into. The attention module itself (rotary embeddings, masks, its kernel) is unchanged."""

    def __init__(self, q: nn.Linear, kv: nn.Linear, kv_heads: int, heads_out: int, head_dim: int) -> None:
        super().__init__()
        self.q, self.kv = q, kv
        self.kv_heads, self.heads_out, self.head_dim = kv_heads, heads_out, head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, v = self.kv(x).split(self.kv_heads * self.head_dim, dim=-1)
        r = self.heads_out // self.kv_heads
        return torch.cat([self.q(x), _repeat_heads(k, self.head_dim, r), _repeat_heads(v, self.head_dim, r)], dim=-1)


class SharedHeads(nn.Module):
    """A key or value projection to ``kv_heads`` heads, each repeated to the ``heads_out`` the attention expects."""

    def __init__(self, proj: nn.Linear, kv_heads: int, heads_out: int, head_dim: int) -> None:
        super().__init__()
        self.proj, self.kv_heads, self.heads_out, self.head_dim = proj, kv_heads, heads_out, head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _repeat_heads(self.proj(x), self.head_dim, self.heads_out // self.kv_heads)


def _linear_from(weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> nn.Linear:
    """An nn.Linear holding ``weight`` (out, in) and ``bias`` (copied, on their device and dtype); ``transposed``:
    ``weight`` is stored (in, out), as GPT-2's Conv1D."""
    w = weight.detach().t() if transposed else weight.detach()
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, dtype=w.dtype)
    lin.to_empty(device=w.device)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias.detach())
    return lin


def _kept_rows(kv_heads: int, current: int, head_dim: int, offset: int = 0) -> torch.Tensor:
    """Output rows of each group's first head (``current`` heads in ``kv_heads`` groups), from row ``offset``."""
    step = current // kv_heads
    return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in range(0, current, step)]) + offset


@torch.no_grad()
def share_kv_heads(block: nn.Module, attention: Attention, kv_heads: int) -> None:
    """Grouped-query attention on one block, in place: its key and value projections (separate, or the k and v
    rows of a fused qkv) cut to ``kv_heads`` heads, each group's first head kept with its current values, and
    repeated to the heads the attention computes, so its own forward (rotary embeddings included: they act per head,
    after the projection) is unchanged. The query and output projections are untouched."""
    H, K, hd = attention.heads, attention.kv_heads, attention.head_dim
    _valid_kv(kv_heads, H, K)
    if attention.projections == "fused":
        fused = block.get_submodule(attention.qkv)
        w = fused.weight.t() if attention.transposed else fused.weight  # (out, in)
        b = getattr(fused, "bias", None)
        q_rows = torch.arange(H * hd, device=w.device)
        kv_rows = torch.cat([_kept_rows(kv_heads, K, hd, H * hd), _kept_rows(kv_heads, K, hd, H * hd + K * hd)])
        kv_rows = kv_rows.to(w.device)
        q = _linear_from(w[q_rows], b[q_rows] if b is not None else None, False)
        kv = _linear_from(w[kv_rows], b[kv_rows] if b is not None else None, False)
        new: nn.Module = GroupedQKV(q, kv, kv_heads, K, hd)
        new.train(fused.training)
        _set_submodule(block, attention.qkv, new)
        return
    for rel in (attention.k, attention.v):
        proj = block.get_submodule(rel)
        w = proj.weight.t() if attention.transposed else proj.weight
        b = getattr(proj, "bias", None)
        rows = _kept_rows(kv_heads, K, hd).to(w.device)
        new = SharedHeads(_linear_from(w[rows], b[rows] if b is not None else None, False), kv_heads, K, hd)
        new.train(proj.training)
        _set_submodule(block, rel, new)


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def apply_gqa(model: nn.Module, structure: ModelStructure, kv_heads: int) -> int:
    """Grouped-query attention (``share_kv_heads``) in every block the description names; returns how many. Raises
    ValueError, the model untouched, when ``kv_heads`` does not divide the key/value heads or the attention's
    projections are not modules."""
    attention = structure.attention
    if attention is None or attention.projections is None:
        raise ValueError(f"efficient_arch: {structure.lacks('attention')}" if structure.attention is None else
                         "efficient_arch: the attention's projections are computed inside its forward "
                         "(nn.MultiheadAttention), so its key/value heads cannot be shared")
    _valid_kv(kv_heads, attention.heads, attention.kv_heads)
    blocks = model.get_submodule(structure.blocks)
    for block in blocks:
        share_kv_heads(block, attention, kv_heads)
    return len(blocks)


class DepthwiseSeparableConv(nn.Sequential):
    """Depthwise kxk conv (groups = c_in), BatchNorm, ReLU, pointwise 1x1 conv: MobileNet's replacement of a
    kxk conv from ``c_in`` to ``c_out`` channels (same stride and padding; no biases)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int, padding: int,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        self.depthwise = nn.Conv2d(c_in, c_in, kernel_size, stride, padding, groups=c_in, bias=False,
                                   **factory)
        self.bn = nn.BatchNorm2d(c_in, **factory)
        self.act = nn.ReLU()
        self.pointwise = nn.Conv2d(c_in, c_out, 1, bias=False, **factory)


def _convertible(conv: Any) -> bool:
    """A plain kxk convolution that ``separable_from`` converts (one group, no bias or dilation, zero padding)."""
    return (isinstance(conv, nn.Conv2d) and conv.groups == 1 and conv.kernel_size[0] > 1 and conv.bias is None
            and conv.dilation == (1, 1) and conv.padding_mode == "zeros" and isinstance(conv.padding, tuple))


def apply_depthwise_separable(blocks: nn.Module, gen: torch.Generator) -> int:
    """Replace every plain kxk Conv2d under ``blocks`` (the model's repeated blocks: a stem before them and 1x1
    shortcuts stay) by a depthwise-separable one; returns how many were replaced."""
    targets = [(parent, name) for parent in blocks.modules() for name, child in parent.named_children()
               if _convertible(child)]
    if not targets:
        raise ValueError("efficient_arch: the model's blocks hold no plain kxk Conv2d (one group, no bias) to make "
                         "depthwise-separable")
    for parent, name in targets:
        setattr(parent, name, separable_from(getattr(parent, name), gen))
    return len(targets)


@torch.no_grad()
def separable_from(conv: nn.Conv2d, gen: torch.Generator) -> DepthwiseSeparableConv:
    """A freshly initialised depthwise-separable replacement of ``conv`` (PyTorch's default initialisation,
    drawn from ``gen``), on its device, dtype and memory format."""
    if conv.bias is not None or conv.dilation != (1, 1) or conv.padding_mode != "zeros":
        raise ValueError("efficient_arch: only bias-free, undilated, zero-padded convs are converted (the "
                         "CNN workload's BasicBlock)")
    w = conv.weight
    with torch.device("meta"):
        new = DepthwiseSeparableConv(conv.in_channels, conv.out_channels, conv.kernel_size[0], conv.stride[0],
                                     conv.padding[0], dtype=w.dtype)
    new.to_empty(device=w.device)
    for layer in (new.depthwise, new.pointwise):
        fan_in = layer.weight[0].numel()  # c_in / groups * k * k: 9 (depthwise), c_in (pointwise)
        _uniform_(layer.weight, 1 / math.sqrt(fan_in), gen)  # kaiming_uniform_(a=sqrt(5)): Conv2d's default
    new.bn.reset_parameters()  # weight 1, bias 0, running mean 0 and variance 1 (to_empty left them unset)
    if w.dim() == 4 and not w.is_contiguous() and w.is_contiguous(memory_format=torch.channels_last):
        new.to(memory_format=torch.channels_last)  # channels_last ran first: keep the model in one format
    new.train(conv.training)
    return new


def forward_flops(model: nn.Module, example: torch.Tensor) -> tuple[int, bool]:
    """FlopCounterMode's count of one forward of ``example`` (no gradients, eval mode so BatchNorm's running
    statistics stay as they are; every module's mode and the RNG restored), and whether an attention op was
    among the ops counted."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    devices = [example.device] if example.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            with FlopCounterMode(display=False) as counter:
                model(example)
    finally:
        for m, training in modes:
            m.training = training
    ops = counter.get_flop_counts().get("Global", {})
    attention = any("scaled_dot_product" in str(op) and n > 0 for op, n in ops.items())
    return int(counter.get_total_flops()), attention


@register
class EfficientArch(Technique):
    name = "efficient_arch"
    summary = ("a leaner model of the same build: grouped-query attention (models with described attention, "
               "kv_heads) or depthwise-separable convolutions (convolutional blocks)")
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "architecture"
    # tp shards the fused qkv projection by head; pp splits the model into stages, while the own-FLOP count
    # runs the loop's model (one stage under pp) on whole-model inputs.
    conflicts = frozenset({"tp", "pp"})
    own_flops = True
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        kv_heads: int = 1  # key/value heads the query heads share (1: multi-query); must divide the model's

        def __post_init__(self) -> None:
            if isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int) or self.kv_heads < 1:
                raise ValueError(f"kv_heads must be an integer >= 1 dividing the model's n_head, "
                                 f"got {self.kv_heads!r}")

    def check(self, ctx: Context) -> str | None:
        s = ctx.structure
        if s is None:  # no model named (a device-level listing): nothing to refuse yet
            return None
        return self._problem(s)

    def _problem(self, s: ModelStructure) -> str | None:
        variant = _variant(s)
        if variant == "gqa":
            a = s.attention
            if a.projections is None:
                return ("shares key/value heads by replacing the attention's key and value "
                        "projections; this model's attention (nn.MultiheadAttention) computes them inside its forward")
            return _kv_problem(self.options.kv_heads, a.heads, a.kv_heads)
        if variant == "separable":
            if self.options.kv_heads != 1:
                return ("kv_heads applies to attention; the model's variant (depthwise-separable convolutions) has "
                        "no options")
            return None
        return (f"needs the model's attention (its projections and heads: grouped-query attention) or "
                f"Conv2d layers in its blocks (depthwise-separable convolutions); its description "
                f"({s.source or 'unknown source'}) has neither: {HOW_TO_DESCRIBE}")

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        s = model_structure(model, ctx)
        problem = self._problem(s)
        if problem is not None:  # the model untouched
            raise ValueError(f"efficient_arch: {problem}")
        example = getattr(self, "_example", None)  # one training sample, drawn by tune from a fresh copy
        self._model, self._original = model, (copy.deepcopy(model) if example is None else None)
        before = forward_flops(model, example.to(_device(model))) if example is not None else None
        before_params = n_params(model)
        found: dict[str, Any] = {}
        if _variant(s) == "gqa":
            a, kv = s.attention, self.options.kv_heads
            n_layer = apply_gqa(model, s, kv)
            found.update(variant="grouped-query attention", kv_heads=kv, n_head=a.heads, head_dim=a.head_dim,
                         n_layer=n_layer, rotary=a.rotary, projections=a.projections,
                         kv_cache_bytes_per_token_before=2 * n_layer * a.kv_heads * a.head_dim * KV_CACHE_BYTES,
                         kv_cache_bytes_per_token_after=2 * n_layer * kv * a.head_dim * KV_CACHE_BYTES,
                         kv_cache_dtype="float32")
        else:
            found.update(variant="depthwise-separable convolutions",
                         convs_replaced=apply_depthwise_separable(model.get_submodule(s.blocks),
                                                                  init_generator(ctx.seed)))
        after_params = n_params(model)
        found.update(n_params_before=before_params, n_params_after=after_params,
                     params_ratio=after_params / before_params)
        self._found = found
        if before is not None:
            self._record_flops(before, forward_flops(model, example.to(_device(model)))[0], example)
        return model

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        """Draw one training sample from a fresh copy of the workload: the example the FLOPs per sample are counted
        on before and after the conversion (a one-off cost, outside the trial's steps)."""
        built = probe.fresh()
        x = next(built.batches(built.batch_size, ctx.seed))[0]
        self._example = x[:1].clone() if torch.is_tensor(x) else None
        return cfg

    def _record_flops(self, before: tuple[int, bool], after: int, example: torch.Tensor) -> None:
        self._found.update(forward_flops_per_sample_before=before[0], forward_flops_per_sample_after=after,
                           flops_ratio=after / before[0] if before[0] else None, example_shape=list(example.shape))
        if "kv_heads" in self._found:
            self._found["attention_flops_counted"] = before[1]

    def measure(self, example: torch.Tensor) -> dict[str, Any]:
        """Count one sample's forward FLOPs before and after the conversion (``example``: one sample as the model
        trains it) when ``tune`` drew none (the technique used without the harness): on a copy of the unconverted
        model kept until then, freed after."""
        original = getattr(self, "_original", None)
        if original is None:
            return self._found
        example = example.to(_device(self._model))
        before = forward_flops(original, example)
        self._original = None
        self._record_flops(before, forward_flops(self._model, example)[0], example)
        return self._found

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        if getattr(self, "_original", None) is None:  # counted already (tune drew the example): untouched
            return batches
        return self._measuring(batches)

    def _measuring(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            if getattr(self, "_original", None) is not None:
                x = batch[0] if isinstance(batch, tuple | list) and batch else None
                if torch.is_tensor(x):
                    self.measure(x[:1])
                else:  # inputs the harness cannot slice to one sample: no FLOP count
                    self._original = None
            yield batch

    def results(self, ctx: Context) -> dict[str, Any] | None:
        return dict(self._found) if hasattr(self, "_found") else None

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """Parameters and forward FLOPs before and after; KV heads and KV-cache bytes per token, or the convolutions
        replaced."""
        first = found[0]
        text = (f"params {rd.n(first.get('n_params_before'))} -> {rd.n(first.get('n_params_after'))}, forward FLOPs per sample "
                f"x{rd.g(first.get('flops_ratio'))}")
        if "kv_heads" in first:
            text = (f"{first['kv_heads']} KV head(s) for {first.get('n_head')} query heads: " + text +
                    f"; KV cache per token {rd.small_bytes(first.get('kv_cache_bytes_per_token_before'))} -> "
                    f"{rd.small_bytes(first.get('kv_cache_bytes_per_token_after'))}")
            if first.get("attention_flops_counted") is False:
                text += " (attention's own FLOPs not counted on this device)"
        else:
            text = f"{first.get('convs_replaced')} 3x3 convs depthwise-separable: " + text
        return text

def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _variant(s: ModelStructure) -> str | None:
    """Which leaner variant the description allows: grouped-query attention where attention is described, else
    depthwise-separable convolutions in convolutional blocks, else None."""
    if s.attention is not None:
        return "gqa"
    if s.convolutional and s.blocks:
        return "separable"
    return None
