"""Multi-token prediction (MTP): train the GPT to predict several future tokens at each position, evaluate it on the
next token alone.

Method card
- What, both variants: at training time the model also predicts tokens further ahead, through modules added to the
  trial's own model (``model.mtp``, in its parameters, optimizer and state dict; ``model.blocks`` and the
  initialisation of everything else unchanged). The instance's class is swapped for a generated subclass (the way
  torch's FSDP2 ``fully_shard`` swaps ``module.__class__``) whose forward, in training mode, returns a
  ``TrainOutput``: the next-token logits for the workload's loss, and the extra depths' logits for this technique's
  ``loss`` hook. In eval mode it is the GPT's own forward (embeddings, every block, ``ln_f``, head): evaluation and
  every other caller see the original model, and the added modules are ignored there. Sequences are t_0..t_T,
  inputs x_i = t_i and targets y_i = t_{i+1} for i = 0..T-1; "t+d" below is the token d steps after the position's
  input token (t+1: the next token, the workload's own target).
- ``variant=heads`` (Gloeckle et al. 2024): a shared trunk (the embeddings and ``blocks[:-1]``) feeds n independent
  heads, each one transformer block followed by the shared ``ln_f`` and unembedding (the head tied to ``wte``).
  Head 1 is the model's own last block (the next token); heads 2..n are new blocks of the same configuration
  (GPT-2 initialisation: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorms 1/0, from
  a generator seeded by the trial's seed). Head k at position i predicts t_{i+k}, so positions i <= T-k have a
  target: head k runs on the trunk's first T-k+1 positions (causal attention: the same values as on all T).
  L = CE_1 + w * sum_{k=2..n} CE_k, each CE the mean over its valid positions; w = 1 is the paper's sum of the n
  losses. Needs n_layer >= 2.
- ``variant=sequential`` (DeepSeek-V3, section 2.2): D = n - 1 modules in a causal chain. h^0 is the main model's
  final hidden state (after the last block, before ``ln_f``); for k = 1..D,
  h'^k_i = M_k [RMSNorm(h^{k-1}_i); RMSNorm(Emb(t_{i+k}))] (M_k a bias-free Linear(2d, d), Emb the shared ``wte``,
  eps 1e-6), h^k = TRM_k(h'^k) (a new GPT block), and logits^k_i = head(ln_f(h^k_i)) predict t_{i+k+1}. Inside one
  sequence of T inputs, t_{i+k} is an input and t_{i+k+1} a target for i = 0..T-1-k: depth k runs on T-k positions.
  L = L_main + (w / D) * sum_k L^k; w = 0.3 is DeepSeek-V3's lambda for its first 10T tokens (0.1 after).
  Depth-k logits at position i see inputs up to x_{i+k}, never their target x_{i+k+1} (a test checks the bound).
- ``weight`` (w) defaults to the paper's value for the variant; ``n`` counts every predicted token, the next one
  included (heads: n heads; sequential: n - 1 modules).
- Costs: (n - 1) extra transformer blocks of parameters (plus, sequential, a 2d x d projection and two RMSNorms
  each), their forward and backward on T - d positions, and n - 1 more unembeddings and cross-entropies. Counted
  on gpt:tiny (2 blocks, 103-character vocabulary; FlopCounterMode, forward + backward): heads n = 2 1.52x the
  baseline's FLOPs per step, sequential n = 2 1.60x, heads n = 4 2.54x. The record's FLOPs per step count the
  added modules (``own_flops``). All n logits tensors are kept for one backward (Gloeckle et al.'s memory-efficient
  order, a forward and backward per head, is not implemented: with a character vocabulary the logits are small).
- What the papers report, on GPUs: Gloeckle et al. (Meta, 2024): at 13B parameters on code, 4-token prediction
  solves 12% more HumanEval and 17% more MBPP problems than next-token prediction, and the extra heads give up to
  3x faster inference by self-speculative decoding; but small models get *worse* (the benefit appears only from
  about 1-3B parameters on), and their comparisons hold the parameter count fixed (n - 1 trunk layers removed for
  the n - 1 added heads), unlike this technique, which adds the heads to the workload's model. A 7B byte-level
  model with 8-byte prediction solved 67% more MBPP problems (the character-level setting here is the closest to
  it). DeepSeek-V3 (D = 1): MTP improved most benchmarks in ablations on 15.7B and 228.7B-parameter MoE models; the
  MTP module is discarded at inference or drives speculative decoding (85-90% acceptance of the second token,
  1.8x tokens per second).
- What to expect here: the models here are tiny (about 0.1M parameters): by the papers' scaling, MTP may well make
  the next-token val_loss worse, and each step costs more. The record shows the step-time cost and the aux losses.
- CPU vs GPU: the same math and the same FLOP ratio on both. On a compute-bound CPU the step time should grow
  about like the FLOPs; on a GPU the tiny models are launch-bound, so the extra kernels, not their FLOPs, set the
  cost, and the time ratio can differ from the FLOP ratio.
- Not implemented: parameter-matched trunks, self-speculative decoding, the memory-efficient head order, DeepSeek's
  lambda schedule (one constant weight), tensor/pipeline parallel or FSDP sharding of the added modules (tp and pp
  conflict; with several processes only ddp is accepted), per-block transforms of the added blocks (checkpointing
  wraps ``model.blocks`` only).
- Functional form: ``apply_mtp(model, variant, n, seed)`` and ``mtp_losses(aux_logits, y)``.
- Measured (2-core AMD EPYC, AVX2; tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques):
  independent heads, n=2: 0.57x [0.31, 1.06] samples/s, inconclusive (1.52x the FLOPs), 1.49x memory (more),
  val_loss +0.22 [+0.02, +0.42] at equal samples, inconclusive (p = 0.040 alone, not after Holm's correction over
  the report's 10 comparisons), and 3/3 missed the target: consistent with the small-model result Gloeckle et al.
  report, not a confirmation of it. Sequential (DeepSeek-V3, lambda 0.3): 0.47x [0.27, 0.80] slower, 1.63x memory
  (more), -0.124 [-0.411, +0.162] at equal samples and +0.086 [-0.274, +0.446] at equal time (both inconclusive),
  the target in 3.08 s against the baseline's 2.71 s (1.27x [0.53, 3.05], inconclusive).
- Sources: Gloeckle, Youbi Idrissi, Roziere, Lopez-Paz, Synnaeve, "Better & Faster Large Language Models via
  Multi-token Prediction", ICML 2024 (arXiv:2404.19737); DeepSeek-AI, "DeepSeek-V3 Technical Report", sections 2.2,
  4.5.1 and 5.4.3 (arXiv:2412.19437); torch.distributed.fsdp ``fully_shard`` (the class swap); nanoGPT ``model.py``
  (GPT-2 initialisation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from bench.workloads.gpt_chars import GPT, Block, lm_loss
from techniques import _reading as rd
from techniques._model import gpt2_init_
from techniques.base import Context, Kind, Phase, Technique, TrainOutput, register, registry

PAPER_WEIGHT = {"heads": 1.0, "sequential": 0.3}  # Gloeckle et al. sum the n losses; DeepSeek-V3's lambda (first 10T)
RMS_EPS = 1e-6  # DeepSeek-V3's RMSNorm epsilon


def _embed(gpt: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The GPT's input: token + position embeddings, dropout (as ``GPT.forward`` computes it)."""
    pos = torch.arange(idx.shape[1], device=idx.device)
    return gpt.drop(gpt.wte(idx) + gpt.wpe(pos))


class MTPHeads(nn.ModuleList):
    """Heads 2..n of Gloeckle et al.: one transformer block each on the shared trunk (head 1 is ``blocks[-1]``)."""

    def outputs(self, gpt: GPT, idx: torch.Tensor) -> TrainOutput:
        *trunk, last = gpt.blocks
        x = _embed(gpt, idx)
        for block in trunk:
            x = block(x)
        logits = gpt.head(gpt.ln_f(last(x)))
        T = idx.shape[1]
        # head d + 1 predicts t_{i+d+1} = y[:, i+d]: positions 0..T-1-d have a target
        aux = [gpt.head(gpt.ln_f(head(x[:, : T - d]))) for d, head in enumerate(self, 1) if d < T]
        return TrainOutput(logits, {"mtp_logits": aux})


class MTPModule(nn.Module):
    """One depth of DeepSeek-V3's MTP: h'_i = M [RMSNorm(h_i); RMSNorm(e_i)], then a transformer block."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.norm_h = nn.RMSNorm(cfg.d_model, eps=RMS_EPS)
        self.norm_e = nn.RMSNorm(cfg.d_model, eps=RMS_EPS)
        self.merge = nn.Linear(2 * cfg.d_model, cfg.d_model, bias=False)
        self.block = Block(cfg)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.block(self.merge(torch.cat((self.norm_h(h), self.norm_e(e)), dim=-1)))


class MTPSequential(nn.ModuleList):
    """DeepSeek-V3's D sequential MTP modules on the main model's final hidden state."""

    def outputs(self, gpt: GPT, idx: torch.Tensor) -> TrainOutput:
        h = _embed(gpt, idx)
        for block in gpt.blocks:
            h = block(h)
        logits = gpt.head(gpt.ln_f(h))
        T, aux = idx.shape[1], []
        for k, module in enumerate(self, 1):
            if k >= T:
                break
            # positions i = 0..T-1-k: h^{k-1}_i with the embedding of t_{i+k} = x[:, i+k]; predicts t_{i+k+1}
            h = module(h[:, : T - k], gpt.wte(idx[:, k:]))
            aux.append(gpt.head(gpt.ln_f(h)))
        return TrainOutput(logits, {"mtp_logits": aux})


_CLASSES: dict[type, type] = {}


def _mtp_class(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of ``cls`` whose training-mode forward also runs ``self.mtp``; one per class, cached."""
    if cls not in _CLASSES:

        def forward(self: Any, idx: torch.Tensor) -> Any:
            if self.training:
                return self.mtp.outputs(self, idx)
            return cls.forward(self, idx)

        doc = f"{cls.__name__} with multi-token prediction in training (``self.mtp``); its own forward in eval mode."
        _CLASSES[cls] = type(f"MTP{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__, "__doc__": doc})
    return _CLASSES[cls]


def apply_mtp(model: nn.Module, variant: str = "heads", n: int = 2, seed: int = 0) -> nn.Module:
    """Add the MTP modules to ``model`` (a gpt_chars.GPT) as ``model.mtp`` and swap its class; returns the model."""
    if not isinstance(model, GPT):
        raise TypeError(f"mtp needs the gpt workload's GPT model, got {type(model).__name__}")
    if hasattr(model, "mtp"):
        raise ValueError("the model already has multi-token prediction modules (model.mtp)")
    if n < 2:
        raise ValueError(f"n must be >= 2 (tokens predicted at each position, the next one included), got {n}")
    cfg = model.cfg
    if variant == "heads":
        if cfg.n_layer < 2:
            raise ValueError(f"mtp heads share a trunk of blocks[:-1]: the model needs n_layer >= 2, has {cfg.n_layer}")
        factory, container = (lambda: Block(cfg)), MTPHeads
    elif variant == "sequential":
        factory, container = (lambda: MTPModule(cfg)), MTPSequential
    else:
        raise ValueError(f"variant must be heads or sequential, got {variant!r}")
    with torch.device("meta"):  # no draw from the global RNG: the trial's other randomness stays as it was
        mtp = container(factory() for _ in range(n - 1))
    mtp.to_empty(device="cpu")
    gpt2_init_(mtp, cfg.n_layer, torch.Generator().manual_seed(seed))
    ref = model.wte.weight
    model.__class__ = _mtp_class(type(model))
    model.mtp = mtp.to(device=ref.device, dtype=ref.dtype)
    return model


def mtp_losses(aux_logits: list[torch.Tensor], y: torch.Tensor) -> list[torch.Tensor]:
    """Cross-entropy of each extra depth d = 1, 2, ... (predicting t+d+1) against ``y[:, d:]``, the mean over its
    valid positions (the logits of depth d cover positions 0..T-1-d)."""
    return [lm_loss(logits, y[:, d:]) for d, logits in enumerate(aux_logits, 1)]


@register
class MTP(Technique):
    name = "mtp"
    summary = "multi-token prediction: extra heads (Gloeckle) or sequential MTP modules (DeepSeek-V3), next token evaluated"
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "output_heads"
    conflicts = frozenset({"tp", "pp"})  # they shard or cut the GPT's blocks, which the heads read
    own_flops = True

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
        if ctx.workload and ctx.workload != "gpt":  # no workload: `bench list` asks in general
            return f"multi-token prediction needs the gpt workload's GPT (got workload '{ctx.workload}')"
        if ctx.world_size > 1:
            known = registry()
            others = sorted(n for n in ctx.technique_names
                            if n not in ("ddp", self.name) and n in known and known[n].multi_process)
            if others or "ddp" not in ctx.technique_names:
                what = ", ".join(others) or "no ddp"
                return (f"with several processes mtp runs under ddp only (got {what}): other sharding would need "
                        "the added heads sharded too")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        o = self.options
        model = apply_mtp(model, o.variant, o.n, ctx.seed)
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
            "note": "only the next-token head is evaluated (eval mode runs the GPT's own forward)",
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
