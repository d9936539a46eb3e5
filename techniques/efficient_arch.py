"""efficient_arch: a leaner model of the same build (grouped-query attention, depthwise-separable convs).

Method card
- Which variant is the model's description's answer (``bench.core.structure``), never its workload's name: a model whose
  blocks' attention is described gets grouped-query attention; else one whose blocks hold plain kxk ``nn.Conv2d``
  layers gets depthwise-separable convolutions; any other is skipped, the missing part named.
- What, attention: grouped-query attention (GQA, Ainslie et al. 2023); multi-query attention (MQA, Shazeer 2019)
  when ``kv_heads=1``. In every block the key and value projections are cut from ``K`` heads (the model's key/value
  heads, ``n_head`` for multi-head attention) to ``g = kv_heads``: separate ``k``/``v`` projections (Llama's
  ``k_proj``, ``v_proj``) become ``SharedHeads`` (a Linear(d, g hd), its heads repeated), a fused ``[q; k; v]``
  projection (the gpt workload's ``attn.qkv``, GPT-2's transposed Conv1D ``c_attn``) becomes ``GroupedQKV`` (a
  Linear(d, n_head hd) for q and a Linear(d, 2 g hd) for k and v). Each repeats its heads ``K / g`` times, in place
  (output head ``i`` is kept head ``i // (K / g)``: query head ``i`` reads its group's key/value head), so the
  attention module's own forward, its kernel, masks and rotary embeddings (which act per head, after the
  projection: a repeated head rotates as its original would) are unchanged: the same math as GQA. Per block the
  projections' parameters go from ``3d^2 + 3d`` (qkv, biased) to ``d^2 + d + 2d g hd + 2 g hd``; the output
  projection and the MLP are unchanged. ``kv_heads = n_head`` is the control: the baseline's parameter count and
  math exactly (a test checks the outputs are equal).
- What, convolutions: depthwise-separable convolutions, MobileNet-style (Howard et al. 2017). Every plain kxk
  ``nn.Conv2d`` under the model's blocks (one group, no bias or dilation, zero padding: the cnn workload's and
  examples/small_resnet.py's BasicBlock ``conv1`` and ``conv2``) becomes ``DepthwiseSeparableConv``: a depthwise kxk
  conv (``groups = c_in``, the same stride and padding, no bias), BatchNorm, ReLU and a pointwise 1x1 conv to
  ``c_out`` (no bias); what followed the conv follows as before. A stem before the blocks, 1x1 shortcuts and the
  head are unchanged. A 3x3 conv's ``9 c_in c_out`` weights become ``9 c_in + c_out c_in`` (plus the inner
  BatchNorm's ``2 c_in``); its FLOPs per output position ``2 * 9 c_in c_out`` become ``2 * (9 c_in + c_in c_out)``.
- Initialisation: the kept key/value heads keep their current values (each group's first head), the query and
  output projections are untouched: no random draw, so a run is reproducible and the trial draws what it would
  without the technique (the model is freshly initialised when it runs, so the kept heads are drawn as the
  model's own init draws them). The convolutions are drawn with PyTorch's default (uniform in +-1/sqrt(fan_in),
  what ``kaiming_uniform_(a=sqrt(5))`` gives) and BatchNorm's (weight 1, bias 0), from a generator of their own
  seeded from the trial's seed. The new layers take the replaced layer's device, dtype and (for convs) memory
  format. ``gqa_from_mha`` converts a *trained* fused multi-head attention into ``GroupedQueryAttention``
  (Ainslie et al.'s uptraining recipe: each group's key and value heads mean-pooled); the technique does not use
  it.
- ``kv_heads`` (default 1, MQA) must divide the model's key/value heads (gpt:tiny 2, small 4, gpt2-124m 12;
  hf:tiny and hf:llama-tiny 2). Where the plan knows the head count (a described model) a ``kv_heads`` that does
  not divide is skipped with the valid values; else refused when the model is transformed. The convolution variant
  has no options (``kv_heads`` other than 1 is refused there by ``check``, so no two labels name the same trial).
- Why: fewer parameters and FLOPs per step at, one hopes, nearly the same quality; the harness compares it
  with the baseline at equal wall-clock (time-to-target) and on its final metric. GQA's gain is mostly at
  inference: the KV cache a decoder keeps per token shrinks by ``n_head / kv_heads`` (``results``:
  ``kv_cache_bytes_per_token``, ``2 * n_layer * kv_heads * hd`` values in fp32), and decoding, which is bound
  by reading that cache, speeds up. In training only the K/V projections shrink: ``d^2 (2 - 2g / n_head)``
  multiply-adds per token and block out of the block's ``12 d^2`` (plus attention): for MQA on gpt:tiny 7.8%
  of the counted forward FLOPs and 7.5% of the parameters (``results``); the attention itself (QK^T, AV) still
  runs for all ``n_head`` query heads. Depthwise-separable convs cut a 3x3 conv's FLOPs to
  ``1 / c_out + 1 / 9`` of them (8 to 9 times fewer at MobileNet's widths, 4 to 7 times at cnn:tiny's 8-32
  channels; cnn:tiny's whole forward and its parameters 4.5 times fewer: counts, exact).
- Sources and their published numbers: Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebron, Sanghai, "GQA: Training
  Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", EMNLP 2023 (arXiv:2305.13245):
  uptrained T5-XXL with GQA-8 reaches quality close to multi-head attention (47.1 against 47.2 average over
  their tasks) at a decoding time per sample close to MQA's (0.28 s against 0.24 s MQA and 1.51 s MHA, TPUv4).
  Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need", 2019 (arXiv:1911.02150): MQA decoding
  about 12x faster per token than MHA (incremental decoding on TPUv2) at a small quality loss. Howard et al.,
  "MobileNets: Efficient Convolutional Neural Networks for Mobile Vision Applications", 2017
  (arXiv:1704.04861): depthwise-separable 3x3 convolutions use 8-9x fewer computations than standard ones at a
  small accuracy cost; published: MobileNet reaches VGG16's ImageNet accuracy within 0.9% (70.6% against 71.5%) with 27x
  fewer mult-adds (569M against 15300M) and 32x fewer parameters. PyTorch docs:
  ``torch.nn.functional.scaled_dot_product_attention`` (``enable_gqa``),
  ``torch.utils.flop_counter.FlopCounterMode``.
- CPU against GPU: fewer FLOPs are not less time. A depthwise conv does 9 multiply-adds per value it reads, so
  it is memory-bound and often slower per FLOP than a dense conv on CPUs and GPUs alike (cuDNN's and oneDNN's
  dense kernels are far better tuned); the split also adds a BatchNorm and a ReLU per conv. Expect the CNN's
  step time to fall much less than its FLOPs, or not at all. GQA's training saving is small (above); on a GPU
  with a long context and at inference it matters more. FLOPs: ``results`` counts one sample's forward before
  and after with ``FlopCounterMode`` (the trial's ``flops_per_step`` counts the converted model's step,
  ``own_flops``). On CPU torch has no FLOP formula for its attention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu``), so there the count holds the projections and MLP
  but not QK^T and AV, before and after alike (``attention_flops_counted`` says which); CUDA's attention
  kernels are counted, GQA's at ``n_head`` query heads.
- Grouped convs' backward in FlopCounterMode (torch 2.13): its ``convolution_backward`` formula ignores
  ``groups``, so a depthwise conv's weight gradient came out ``c_in`` times over (a fix is proposed in
  pytorch/pytorch PR #183405). ``bench/measure/flops.py`` corrects the formula: on cnn:tiny (batch 32) the
  variant's forward and backward count 26.6 MFLOP (torch's own formula: 58.9), the baseline 123.0 MFLOP.
- Cost of the general form: the repeated key/value heads are materialised (``repeat_interleave``) before the
  attention kernel, so attention's activations and FLOPs are multi-head attention's (what ``enable_gqa`` would save
  in memory is not saved); the saving in training is the projections'. The FLOPs before and after are counted once,
  on one training sample ``tune`` draws from a fresh copy of the workload (a one-off probe, outside the steps).
- Not implemented: models without described attention or kxk convs in their blocks (an MLP; an LSTM) are refused
  with the part named; ``nn.MultiheadAttention`` (its projections are parameters inside its forward) is refused; no
  sliding-window or latent attention, no inverted residuals (MobileNetV2), no width multiplier. Refused with ``tp``
  (it shards the fused ``qkv`` by head) and ``pp`` (its stages would receive the FLOP count's whole-model input).
- Measured (AMD EPYC (AVX2 only); tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques;
  before the port to the model description, with a ``GroupedQueryAttention`` module drawn afresh and SDPA's
  ``enable_gqa``: the parameter and FLOP counts are the same now, the speed and quality not re-measured):
  gpt with multi-query attention (1 KV head for 2): 102,464 parameters (-7.5%), forward FLOPs x0.922, 0.92x
  [0.41, 2.05] samples/s and -0.024 [-0.322, +0.274] val_loss (both inconclusive), 0.95x memory (less), KV cache per
  token 1,024 -> 512 bytes. cnn depthwise-separable: 4,394 parameters (0.22x) and x0.222 FLOPs, yet 0.78x samples/s
  (no verdict: one window contended, 2 pairs left), 1.46x memory (more: more, smaller activations), MFU 1.0% against
  6.2%, accuracy -0.085 [-0.129, -0.041] (inconclusive: p = 0.014 alone, not after Holm's correction over the
  report's 8 comparisons) and 3/3 missed the target: whether fewer FLOPs buy time on this CPU is not decided.
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
