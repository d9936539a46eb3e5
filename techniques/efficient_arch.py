"""efficient_arch: a leaner model of the same workload (grouped-query attention, depthwise-separable convs).

Method card
- What, ``gpt``: grouped-query attention (GQA, Ainslie et al. 2023); multi-query attention (MQA, Shazeer 2019)
  when ``kv_heads=1``. Every block's ``attn`` (the workload's ``CausalSelfAttention``: one fused ``qkv``
  Linear(d, 3d) and ``proj`` Linear(d, d)) is replaced by ``GroupedQueryAttention``: ``q`` Linear(d, d),
  ``kv`` Linear(d, 2 * g * hd) and ``proj`` Linear(d, d), with ``n_head`` query heads of dimension
  ``hd = d / n_head`` and ``g = kv_heads`` key/value heads; query head ``i`` attends with key/value head
  ``i // (n_head / g)``. ``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)``
  broadcasts the shared heads (on a torch without ``enable_gqa``, before 2.5, k and v are
  ``repeat_interleave``d instead: the same result). Per block the attention's parameters go from ``3d^2 + 3d``
  (qkv) to ``d^2 + d + 2d g hd + 2 g hd`` (q and kv); ``proj`` and the MLP are unchanged.
  ``kv_heads = n_head`` is the control: plain multi-head attention with the projections unfused, the
  baseline's parameter count and math (other initial draws).
- What, ``cnn`` and ``cnn_aug``: depthwise-separable convolutions, MobileNet-style (Howard et al. 2017). Each
  BasicBlock's 3x3 ``conv1`` and ``conv2`` become ``DepthwiseSeparableConv``: a depthwise 3x3 conv
  (``groups = c_in``, the same stride and padding, no bias), BatchNorm, ReLU and a pointwise 1x1 conv to
  ``c_out`` (no bias); the block's own ``bn1``/``bn2`` follow as before. The stem, the 1x1 shortcuts and the
  head are unchanged. A 3x3 conv's ``9 c_in c_out`` weights become ``9 c_in + c_out c_in`` (plus the inner
  BatchNorm's ``2 c_in``); its FLOPs per output position ``2 * 9 c_in c_out`` become
  ``2 * (9 c_in + c_in c_out)``.
- Initialisation: the new layers are drawn as the workload draws its own: GPT-2's N(0, 0.02) for ``q`` and
  ``kv``, N(0, 0.02 / sqrt(2 n_layer)) for ``proj``, zero biases; the CNN's PyTorch default for convolutions
  (uniform in +-1/sqrt(fan_in), what ``kaiming_uniform_(a=sqrt(5))`` gives) and BatchNorm's (weight 1, bias
  0). The draws come from a generator of their own seeded from the trial's seed (not the global RNG, which the
  trial's later stages use), so a run is reproducible and the rest of the trial draws what it would without
  the technique. The new layers take the replaced layer's device, dtype and (for convs) memory format.
  ``gqa_from_mha`` converts a *trained* multi-head attention instead (Ainslie et al.'s uptraining recipe: each
  group's key and value heads mean-pooled); the technique does not use it, since the workload's model is
  freshly initialised when it runs.
- ``kv_heads`` (GPT only; default 1, MQA) must divide the model's ``n_head`` (gpt:tiny 2, small 4, gpt2-124m
  12). The plan does not know a workload's size, so a ``kv_heads`` that does not divide is refused when the
  model is transformed: a ValueError naming the valid values (the trial fails with it). The CNN variant has no
  options (``kv_heads`` other than 1 is refused there by ``check``, so no two labels name the same trial).
- Why: fewer parameters and FLOPs per step at, one hopes, nearly the same quality; the harness compares it
  with the baseline at equal wall-clock (time-to-target) and on its final metric. GQA's gain is mostly at
  inference: the KV cache a decoder keeps per token shrinks by ``n_head / kv_heads`` (``results``:
  ``kv_cache_bytes_per_token``, ``2 * n_layer * kv_heads * hd`` values in fp32), and decoding, which is bound
  by reading that cache, speeds up. In training only the K/V projections shrink: ``d^2 (2 - 2g / n_head)``
  multiply-adds per token and block out of the block's ``12 d^2`` (plus attention): for MQA on gpt:tiny 7.8%
  of the counted forward FLOPs and 7.5% of the parameters (``results``); the attention itself (QK^T, AV) still
  runs for all ``n_head`` query heads. Depthwise-separable convs cut a 3x3 conv's FLOPs to
  ``1 / c_out + 1 / 9`` of them (8-9x fewer at MobileNet's widths; 4-7x at cnn:tiny's 8-32 channels;
  cnn:tiny's whole forward 4.5x fewer, its parameters 4.5x fewer).
- Sources and their numbers: Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebron, Sanghai, "GQA: Training
  Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", EMNLP 2023 (arXiv:2305.13245):
  uptrained T5-XXL with GQA-8 reaches quality close to multi-head attention (47.1 against 47.2 average over
  their tasks) at a decoding time per sample close to MQA's (0.28 s against 0.24 s MQA and 1.51 s MHA, TPUv4).
  Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need", 2019 (arXiv:1911.02150): MQA decoding
  about 12x faster per token than MHA (incremental decoding on TPUv2) at a small quality loss. Howard et al.,
  "MobileNets: Efficient Convolutional Neural Networks for Mobile Vision Applications", 2017
  (arXiv:1704.04861): depthwise-separable 3x3 convolutions use 8-9x fewer computations than standard ones at a
  small accuracy cost; MobileNet reaches VGG16's ImageNet accuracy within 0.9% (70.6% against 71.5%) with 27x
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
- Not implemented: other workloads (``mlp``, ``hf``, users' models) are refused; no sliding-window or latent
  attention, no inverted residuals (MobileNetV2), no width multiplier. Refused with ``tp`` (it shards the
  fused ``qkv`` by head) and ``pp`` (its stages would receive the FLOP count's whole-model input).
- Measured (2-core AMD EPYC, AVX2; tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques):
  gpt with multi-query attention (1 KV head for 2): 102,464 parameters (-7.5%), forward FLOPs x0.922, 0.92x
  [0.41, 2.05] samples/s and -0.024 [-0.322, +0.274] val_loss (both inconclusive), 0.95x memory (less), KV cache per
  token 1,024 -> 512 bytes. cnn depthwise-separable: 4,394 parameters (0.22x) and x0.222 FLOPs, yet 0.78x samples/s
  (no verdict: one window contended, 2 pairs left), 1.46x memory (more: more, smaller activations), MFU 1.0% against
  6.2%, accuracy -0.085 [-0.129, -0.041] (inconclusive: p = 0.014 alone, not after Holm's correction over the
  report's 8 comparisons) and 3/3 missed the target: fewer FLOPs did not buy time on this CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from techniques import _reading as rd
from techniques._model import gpt2_init_, n_params
from techniques.base import Context, Kind, Phase, Technique, model_blocks, register

GPT_WORKLOADS = ("gpt",)
CNN_WORKLOADS = ("cnn", "cnn_aug")
IMAGE_SIZE = 28  # Fashion-MNIST's 28 x 28 images: the CNN workloads' one sample for the FLOP count
INIT_STD = 0.02  # GPT-2's initialisation (bench/workloads/gpt_chars.py)
KV_CACHE_BYTES = 4  # the KV cache counted in fp32, the workload's parameter dtype
SEED_MIX = 0x9E3779B97F4A7C15  # the new layers' draws apart from the workload's (seeded with the same seed)


def _sdpa_has_gqa() -> bool:
    """Whether this torch's SDPA broadcasts key/value heads itself (``enable_gqa``, torch >= 2.5)."""
    q, kv = torch.zeros(1, 2, 1, 2), torch.zeros(1, 1, 1, 2)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


SDPA_GQA = _sdpa_has_gqa()


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
            if SDPA_GQA:
                extra["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True, **extra)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def is_fused_attention(module: Any) -> bool:
    """Whether ``module`` looks like the GPT workload's ``CausalSelfAttention`` (fused qkv, proj, n_head)."""
    qkv, proj = getattr(module, "qkv", None), getattr(module, "proj", None)
    heads = getattr(module, "n_head", None)
    return (isinstance(qkv, nn.Linear) and isinstance(proj, nn.Linear) and isinstance(heads, int)
            and qkv.out_features == 3 * qkv.in_features)


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


def apply_gqa(blocks: Iterable[nn.Module], kv_heads: int, gen: torch.Generator) -> int:
    """Replace every block's ``attn`` by a freshly initialised ``GroupedQueryAttention`` (GPT-2's
    initialisation, drawn from ``gen``); returns how many were replaced. Raises ValueError (the model
    untouched) when a block has no fused attention or ``kv_heads`` does not divide its heads."""
    blocks = list(blocks)
    n_layer = len(blocks)
    for i, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if not is_fused_attention(attn):
            raise ValueError(f"efficient_arch: block {i} has no GPT attention (attn with a fused qkv "
                             f"Linear(d, 3d), proj and n_head); got {type(attn).__name__}")
        _empty_gqa(attn, kv_heads)  # refuses a kv_heads that does not divide n_head before anything changes
    for block in blocks:
        attn = block.attn
        new = _empty_gqa(attn, kv_heads)
        gpt2_init_(new, n_layer, gen)  # q, kv N(0, 0.02); proj scaled by 1/sqrt(2 n_layer); biases 0
        new.train(attn.training)
        block.attn = new
    return n_layer


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


def _is_plain_conv(conv: Any) -> bool:
    return isinstance(conv, nn.Conv2d) and conv.groups == 1 and conv.kernel_size[0] > 1


def is_basic_block(module: nn.Module) -> bool:
    """The CNN workload's ResNet ``BasicBlock``: plain kxk ``conv1``, ``conv2`` with ``bn1``, ``bn2``."""
    return (_is_plain_conv(getattr(module, "conv1", None)) and _is_plain_conv(getattr(module, "conv2", None))
            and hasattr(module, "bn1") and hasattr(module, "bn2"))


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


def apply_depthwise_separable(model: nn.Module, gen: torch.Generator) -> int:
    """Replace ``conv1`` and ``conv2`` of every BasicBlock under ``model``; returns how many were replaced."""
    blocks = [m for m in model.modules() if is_basic_block(m)]
    if not blocks:
        raise ValueError(f"efficient_arch: {type(model).__name__} has no ResNet BasicBlock (conv1, bn1, "
                         "conv2, bn2 with plain kxk convs) to make depthwise-separable")
    for block in blocks:
        block.conv1 = separable_from(block.conv1, gen)
        block.conv2 = separable_from(block.conv2, gen)
    return 2 * len(blocks)


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


def example_input(model: nn.Module, family: str) -> torch.Tensor:
    """One sample as the workload trains it: a (1, seq_len) token sequence or a (1, C, 28, 28) image."""
    device = next(model.parameters()).device
    if family == "gpt":
        seq_len = model.cfg.seq_len if hasattr(model, "cfg") else model.wpe.num_embeddings
        return torch.zeros(1, seq_len, dtype=torch.long, device=device)
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    return torch.zeros(1, first.in_channels, IMAGE_SIZE, IMAGE_SIZE, device=device, dtype=first.weight.dtype)


@register
class EfficientArch(Technique):
    name = "efficient_arch"
    summary = ("a leaner model of the same workload: grouped-query attention (gpt, kv_heads) or "
               "depthwise-separable convolutions (cnn, cnn_aug)")
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "architecture"
    # tp shards the fused qkv projection by head; pp splits the model into stages, while the own-FLOP count
    # runs the loop's model (one stage under pp) on whole-model inputs.
    conflicts = frozenset({"tp", "pp"})
    own_flops = True

    @dataclass(frozen=True)
    class Options:
        kv_heads: int = 1  # gpt: key/value heads the query heads share (1: multi-query); must divide n_head

        def __post_init__(self) -> None:
            if isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int) or self.kv_heads < 1:
                raise ValueError(f"kv_heads must be an integer >= 1 dividing the model's n_head, "
                                 f"got {self.kv_heads!r}")

    def check(self, ctx: Context) -> str | None:
        if ctx.workload and ctx.workload not in GPT_WORKLOADS + CNN_WORKLOADS:
            return (f"efficient_arch has leaner variants of gpt (grouped-query attention), cnn and cnn_aug "
                    f"(depthwise-separable convolutions) only; workload '{ctx.workload}' has none")
        if ctx.workload in CNN_WORKLOADS and self.options.kv_heads != 1:
            return (f"kv_heads applies to gpt's attention; the {ctx.workload} variant (depthwise-separable "
                    "convolutions) has no options")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        family = "gpt" if ctx.workload in GPT_WORKLOADS else "cnn"
        example = example_input(model, family)
        before_params = n_params(model)
        before_flops, attention_counted = forward_flops(model, example)
        gen = init_generator(ctx.seed)
        found: dict[str, Any] = {"variant": "grouped-query attention" if family == "gpt"
                                 else "depthwise-separable convolutions"}
        if family == "gpt":
            blocks = model_blocks(model, ctx)
            if blocks is None:
                raise ValueError("efficient_arch: the gpt model has no blocks")
            kv = self.options.kv_heads
            n_layer = apply_gqa(blocks, kv, gen)
            n_head, head_dim = blocks[0].attn.n_head, blocks[0].attn.head_dim
            found.update(kv_heads=kv, n_head=n_head, head_dim=head_dim, n_layer=n_layer,
                         kv_cache_bytes_per_token_before=2 * n_layer * n_head * head_dim * KV_CACHE_BYTES,
                         kv_cache_bytes_per_token_after=2 * n_layer * kv * head_dim * KV_CACHE_BYTES,
                         kv_cache_dtype="float32", attention_flops_counted=attention_counted)
        else:
            found["convs_replaced"] = apply_depthwise_separable(model, gen)
        after_params = n_params(model)
        after_flops, _ = forward_flops(model, example)
        found.update(n_params_before=before_params, n_params_after=after_params,
                     params_ratio=after_params / before_params,
                     forward_flops_per_sample_before=before_flops, forward_flops_per_sample_after=after_flops,
                     flops_ratio=after_flops / before_flops if before_flops else None,
                     example_shape=list(example.shape))
        self._found = found
        return model

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
