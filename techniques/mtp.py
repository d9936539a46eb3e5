"""Multi-token prediction (MTP): train a decoder to predict several future tokens at each position, evaluate it on
the next token alone.

Method card
- What: at training time the model also predicts tokens further ahead, through modules added to it (``model.mtp``:
  in its parameters, optimizer and state dict); in eval mode it is the model's own forward, so evaluation sees the
  next token only. ``variant=heads`` (Gloeckle et al. 2024): the trunk (``blocks[:-1]``) feeds ``n`` heads, each a
  transformer block followed by the shared final norm and unembedding; head 1 is the model's own last block, the
  others are copies of it with freshly drawn weights; loss ``CE_1 + w * sum_k CE_k``. ``variant=sequential``
  (DeepSeek-V3): ``n - 1`` modules in a causal chain, each merging the previous depth's hidden state with the
  embedding of the next token (two RMSNorms and a projection) before a new block; loss ``L_main + (w / D) * sum_k
  L_k``. Any causal token model whose description names its blocks, token embedding and head: gpt, Hugging Face
  GPT-2 and Llama, a user's decoder (`examples/lstm_lm.py`, found by tracing); the parts are reached through hooks on
  the last block, and an undeclared causality is checked on the model. Kind algorithmic.
- When it should pay: not in step time. Each step adds ``n - 1`` blocks' forward and backward and ``n - 1`` more
  unembeddings and cross-entropies (the record's FLOPs per step count them); a compute-bound CPU pays about the added
  FLOPs, while on a GPU tiny models are launch-bound and the added kernels, not their FLOPs, set the cost. In
  quality, Gloeckle et al. report gains from about 1-3B parameters up and worse small models, with the parameter
  count held fixed; here the heads are added to tiny models, so expect the next-token val_loss to get worse.
- Options and caveats: ``variant`` (heads), ``n`` (2, the next token included), ``weight`` (the paper's: heads 1.0,
  sequential 0.3). heads needs 2 or more blocks. Refused with ``tp``, ``pp`` and ``distill``, with several
  processes other than under ``ddp``, and for a model that computes its own loss in its forward. Not implemented:
  parameter-matched trunks, self-speculative decoding, the memory-efficient head order, DeepSeek's schedule of the
  weight. The gpt:tiny rows of `reports/example-cpu-model-techniques` below predate the move to the model's
  description (the new blocks then had GPT-2's initialisation and the extra depths ran on fewer positions); not
  re-measured since.
- Functional form: ``apply_mtp(model, variant, n, seed)`` and ``mtp_losses(aux_logits, y)``.
- Sources: Gloeckle et al., "Better & Faster Large Language Models via Multi-token Prediction", ICML 2024
  (arXiv:2404.19737); DeepSeek-AI, "DeepSeek-V3 Technical Report", sec. 2.2 (arXiv:2412.19437).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-mtp (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny mtp:variant=sequential 0.47x [0.27, 0.80] slower, memory 1.63x more; gpt:tiny 0.57x [0.31, 1.06] inconclusive, memory 1.49x more.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-user-models-structure`: lstm_lm:small 0.66x [0.43, 1.02] inconclusive, memory 1.49x more.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.structure import ModelStructure, describe
from techniques import _reading as rd
from techniques.base import (
    Context,
    Kind,
    Phase,
    Technique,
    TrainOutput,
    model_structure,
    own_loss_problem,
    register,
    registry,
)

PAPER_WEIGHT = {"heads": 1.0, "sequential": 0.3}  # Gloeckle et al. sum the n losses; DeepSeek-V3's lambda (first 10T)
RMS_EPS = 1e-6  # DeepSeek-V3's RMSNorm epsilon
MERGE_STD = 0.02  # the sequential modules' merge projection: GPT-2's initial scale
PARTS = {"heads": ("blocks", "embedding", "head"), "sequential": ("blocks", "embedding", "head")}


def _first(out: Any) -> torch.Tensor:
    """A block's hidden states (a block returning a tuple, as some Hugging Face layers do, puts them first)."""
    return out[0] if isinstance(out, tuple | list) else out


class _LastBlock:
    """Hooks on the model's last block for one forward: its inputs (positional and keyword) and its output."""

    def __init__(self, block: nn.Module) -> None:
        self.block, self.args, self.kwargs, self.output = block, (), {}, None

    def __enter__(self) -> _LastBlock:
        def before(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            self.args, self.kwargs = args, kwargs

        def after(_m: nn.Module, _args: tuple, _kwargs: dict, out: Any) -> None:
            self.output = _first(out)

        self.handles = [self.block.register_forward_pre_hook(before, with_kwargs=True),
                        self.block.register_forward_hook(after, with_kwargs=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()

    def run(self, block: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """``block`` on ``hidden`` with the other inputs the last block got (masks, rotary embeddings, ...)."""
        if self.args:
            return _first(block(hidden, *self.args[1:], **self.kwargs))
        return _first(block(**{**self.kwargs, "hidden_states": hidden}))


class _MTP(nn.ModuleList):
    """The added modules and the paths of the parts they read (from the model's description)."""

    def configure(self, s: ModelStructure) -> None:
        self.blocks_path, self.embedding_path = s.blocks, s.embedding
        self.final_norm_path, self.head_path = s.final_norm, s.head

    def parts(self, model: nn.Module) -> tuple[nn.Module, nn.Module, Any, nn.Module]:
        blocks = model.get_submodule(self.blocks_path)
        norm = model.get_submodule(self.final_norm_path) if self.final_norm_path else nn.Identity()
        return blocks[-1], model.get_submodule(self.embedding_path), norm, model.get_submodule(self.head_path)


def _last_block(blocks: nn.Module) -> nn.Module:
    """The last block itself, inside a wrapper that a later transform put around it (checkpointing, compile)."""
    block = blocks[-1]
    for attr in ("block", "_checkpoint_wrapped_module", "_orig_mod"):
        inner = getattr(block, attr, None)
        if isinstance(inner, nn.Module):
            return inner
    return block


class MTPHeads(_MTP):
    """Heads 2..n of Gloeckle et al.: one transformer block each on the shared trunk (head 1 is ``blocks[-1]``),
    each a copy of the last block's configuration, on the trunk's output (the last block's input)."""

    def outputs(self, model: nn.Module, forward: Any, idx: torch.Tensor, args: tuple, kwargs: dict) -> TrainOutput:
        blocks = model.get_submodule(self.blocks_path)
        _, _, norm, head = self.parts(model)
        with _LastBlock(_last_block(blocks)) as last:
            logits = forward(model, *args, **kwargs)
        T = idx.shape[1]
        # head d + 1 predicts t_{i+d+1} = y[:, i+d]: positions 0..T-1-d have a target (causal: the first T-d
        # positions computed on all T are what they would be on T-d)
        trunk = last.args[0] if last.args else last.kwargs["hidden_states"]
        aux = [head(norm(last.run(block, trunk)))[:, : T - d] for d, block in enumerate(self, 1) if d < T]
        return TrainOutput(logits, {"mtp_logits": aux})


class MTPModule(nn.Module):
    """One depth of DeepSeek-V3's MTP: h'_i = M [RMSNorm(h_i); RMSNorm(e_i)], then a block (a copy of the last)."""

    def __init__(self, d_model: int, block: nn.Module) -> None:
        super().__init__()
        self.norm_h = nn.RMSNorm(d_model, eps=RMS_EPS)
        self.norm_e = nn.RMSNorm(d_model, eps=RMS_EPS)
        self.merge = nn.Linear(2 * d_model, d_model, bias=False)
        self.block = block

    def merged(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.merge(torch.cat((self.norm_h(h), self.norm_e(e)), dim=-1))


class MTPSequential(_MTP):
    """DeepSeek-V3's D sequential MTP modules on the main model's final hidden state (the last block's output)."""

    def outputs(self, model: nn.Module, forward: Any, idx: torch.Tensor, args: tuple, kwargs: dict) -> TrainOutput:
        blocks = model.get_submodule(self.blocks_path)
        _, embedding, norm, head = self.parts(model)
        with _LastBlock(_last_block(blocks)) as last:
            logits = forward(model, *args, **kwargs)
        h = last.output
        T, aux = idx.shape[1], []
        for k, module in enumerate(self, 1):
            if k >= T:
                break
            # positions i = 0..T-1-k: h^{k-1}_i with the embedding of t_{i+k} = x[:, i+k]; predicts t_{i+k+1}. The
            # last k positions get a zero embedding and are cut from the logits (causal: they reach no earlier one).
            e = embedding(idx[:, k:])
            e = torch.cat([e, e.new_zeros(e.shape[0], k, e.shape[2])], dim=1)
            h = last.run(module.block, module.merged(h, e))
            aux.append(head(norm(h))[:, : T - k])
        return TrainOutput(logits, {"mtp_logits": aux})


_CLASSES: dict[type, type] = {}


def _mtp_class(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of ``cls`` whose training-mode forward also runs ``self.mtp``; one per class, cached."""
    if cls not in _CLASSES:

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.training:
                idx = args[0] if args else next(iter(kwargs.values()))
                return self.mtp.outputs(self, cls.forward, idx, args, kwargs)
            return cls.forward(self, *args, **kwargs)

        doc = f"{cls.__name__} with multi-token prediction in training (``self.mtp``); its own forward in eval mode."
        _CLASSES[cls] = type(f"MTP{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__, "__doc__": doc})
    return _CLASSES[cls]


@torch.no_grad()
def _redraw_(module: nn.Module, gen: torch.Generator) -> None:
    """Every weight matrix of ``module`` drawn afresh from N(0, its current standard deviation) (the scale the model's
    own initialisation gave the block it copies), from ``gen``; vectors (norm scales, biases) kept."""
    for p in module.parameters():
        if p.dim() >= 2:
            std = float(p.float().std()) if p.numel() > 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype) * std)


def apply_mtp(model: nn.Module, variant: str = "heads", n: int = 2, seed: int = 0,
              structure: ModelStructure | None = None) -> nn.Module:
    """Add the MTP modules to ``model`` as ``model.mtp`` and swap its class; returns the model. ``structure`` (default:
    the model's own description or the inferred one) names its blocks, token embedding, final norm and head."""
    s = structure if structure is not None else describe(model, None)
    reason = s.lacks(*PARTS.get(variant, ()))
    if reason:
        raise ValueError(f"mtp: {reason}")
    if s.causal is False:
        raise ValueError("mtp: needs a causal model (a decoder): its description says position i sees later tokens")
    if hasattr(model, "mtp"):
        raise ValueError("the model already has multi-token prediction modules (model.mtp)")
    if n < 2:
        raise ValueError(f"n must be >= 2 (tokens predicted at each position, the next one included), got {n}")
    blocks = model.get_submodule(s.blocks)
    last = _last_block(blocks)
    embedding = model.get_submodule(s.embedding)
    d_model = embedding.weight.shape[1]
    gen = torch.Generator().manual_seed(seed)
    if variant == "heads":
        if len(blocks) < 2:
            raise ValueError(f"mtp heads share a trunk of blocks[:-1]: the model needs n_layer >= 2, has {len(blocks)}")
        mtp: _MTP = MTPHeads(copy.deepcopy(last) for _ in range(n - 1))
    elif variant == "sequential":
        with torch.device("meta"):  # no draw from the global RNG: the trial's other randomness stays as it was
            modules = [MTPModule(d_model, nn.Identity()) for _ in range(n - 1)]
        for m in modules:
            m.to_empty(device="cpu")
            m.norm_h.reset_parameters()
            m.norm_e.reset_parameters()
            with torch.no_grad():
                m.merge.weight.copy_(torch.randn(m.merge.weight.shape, generator=gen) * MERGE_STD)
            m.block = copy.deepcopy(last)
        mtp = MTPSequential(modules)
    else:
        raise ValueError(f"variant must be heads or sequential, got {variant!r}")
    for module in mtp:
        _redraw_(module.block if variant == "sequential" else module, gen)
    mtp.configure(s)
    ref = embedding.weight
    model.__class__ = _mtp_class(type(model))
    model.mtp = mtp.to(device=ref.device, dtype=ref.dtype)
    mtp.train(model.training)
    return model


@torch.no_grad()
def causality_problem(model: nn.Module, vocab: int, length: int) -> str | None:
    """Why ``model`` is not causal (a later token changed an earlier position's logits), or None: two sequences
    that differ in their second half, through the model in eval mode (its mode and the RNG restored)."""
    training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, vocab, (1, length), generator=gen)
    b = a.clone()
    half = length // 2
    b[:, half:] = torch.randint(0, vocab, (1, length - half), generator=gen)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            out_a, out_b = (model(t.to(device)) for t in (a, b))
    finally:
        model.train(training)
    if not torch.allclose(out_a[:, :half], out_b[:, :half], rtol=1e-4, atol=1e-5):
        return (f"mtp: needs a causal model (a decoder): the logits of positions before {half} changed when only "
                "later tokens did; declare `causal` in the structure build returns if this is wrong")
    return None


def mtp_losses(aux_logits: list[torch.Tensor], y: torch.Tensor) -> list[torch.Tensor]:
    """Cross-entropy of each extra depth d = 1, 2, ... (predicting t+d+1) against ``y[:, d:]``, the mean over its
    valid positions (the logits of depth d cover positions 0..T-1-d)."""
    return [F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, d:].reshape(-1))
            for d, logits in enumerate(aux_logits, 1)]


@register
class MTP(Technique):
    name = "mtp"
    summary = "multi-token prediction: extra heads (Gloeckle) or sequential MTP modules (DeepSeek-V3), next token evaluated"
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "output_heads"
    conflicts = frozenset({"tp", "pp"})  # they shard or cut the model's blocks, which the heads read
    own_flops = True
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        variant: Literal["heads", "sequential"] = "heads"
        n: int = 2  # tokens predicted at each position, the next one included (heads: n heads; sequential: n-1 modules)
        weight: float | None = None  # the auxiliary losses' weight; None: the paper's (heads 1.0, sequential 0.3)

        def __post_init__(self) -> None:
            if self.variant not in PAPER_WEIGHT:
                raise ValueError(f"variant must be one of {', '.join(PAPER_WEIGHT)}, got {self.variant!r}")
            if self.n < 2:
                raise ValueError(f"n must be >= 2 (tokens predicted at each position, the next one included), "
                                 f"got {self.n}")
            if self.weight is not None and not (math.isfinite(self.weight) and self.weight >= 0):
                raise ValueError(f"weight must be a finite number >= 0 (or none: the paper's), got {self.weight}")

    @property
    def weight(self) -> float:
        o = self.options
        return PAPER_WEIGHT[o.variant] if o.weight is None else o.weight

    @property
    def aux_scale(self) -> float:
        """What multiplies the sum of the extra depths' losses: w (heads), w / D (sequential)."""
        return self.weight if self.options.variant == "heads" else self.weight / (self.options.n - 1)

    def check(self, ctx: Context) -> str | None:
        s = ctx.structure
        if s is not None:  # None: no model named (`bench list` asks in general)
            reason = s.lacks(*PARTS[self.options.variant])
            if reason:
                return reason
            if s.causal is False:
                return "needs a causal model (a decoder); the model's description says it is not"
            if self.options.variant == "heads" and s.n_blocks == 1:
                return "mtp heads share a trunk of blocks[:-1]: the model needs 2 or more blocks, has 1"
        if ctx.world_size > 1:
            known = registry()
            others = sorted(n for n in ctx.technique_names
                            if n not in ("ddp", self.name) and n in known and known[n].multi_process)
            if others or "ddp" not in ctx.technique_names:
                what = ", ".join(others) or "no ddp"
                return (f"with several processes mtp runs under ddp only (got {what}): other sharding would need "
                        "the added heads sharded too")
        own = own_loss_problem(ctx, "adds prediction heads whose losses it computes beside the model's own from the hidden states")
        if own:
            return own
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        o = self.options
        s = model_structure(model, ctx)
        if s.causal is None and s.embedding:  # not declared: checked on the model (a later token must not matter)
            problem = causality_problem(model, model.get_submodule(s.embedding).weight.shape[0],
                                        max(4, min(ctx.sequence_length or 16, 64)))
            if problem:
                raise ValueError(problem)
        model = apply_mtp(model, o.variant, o.n, ctx.seed, s)
        self._extra_params = sum(p.numel() for p in model.mtp.parameters())
        return model

    def loss(self, out: Any, batch: Any, base_loss: torch.Tensor, ctx: Context) -> torch.Tensor:
        if not isinstance(out, TrainOutput) or "mtp_logits" not in out.extra:
            raise TypeError("mtp's loss hook needs the TrainOutput of a model mtp transformed, in training mode")
        aux = mtp_losses(out.extra["mtp_logits"], batch[1])
        self._last = [a.detach() for a in aux]  # floats only in results(): no device sync per step
        if not aux:
            return base_loss
        return base_loss + self.aux_scale * torch.stack(aux).sum()

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        last = getattr(self, "_last", [])
        return {
            "variant": o.variant,
            "n": o.n,
            "weight": self.weight,
            "aux_scale": self.aux_scale,
            "extra_params": getattr(self, "_extra_params", None),
            "aux_loss_last": {f"t+{d + 1}": float(v) for d, v in enumerate(last, 1)},
            "note": "only the next-token head is evaluated (eval mode runs the model's own forward)",
        }

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The variant, the extra heads' parameters, and the last auxiliary losses (evaluation reads the next-token
        head only)."""
        first = found[0]
        depths = sorted({k for f in found for k in (f.get("aux_loss_last") or {})})
        last = "; ".join(f"{d} {rd.values([(f.get('aux_loss_last') or {}).get(d) for f in found])}" for d in depths)
        return (f"{first.get('variant')}, n={first.get('n')}, weight {rd.g(first.get('weight'))}: "
                f"{rd.n(first.get('extra_params'))} extra params, evaluated on the next-token head only; last auxiliary "
                f"losses {last}")
