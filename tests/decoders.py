"""Small decoders the built-in workloads do not contain, for the model-parallel tests (tp, pp) and their workers.

``build``: a Llama-style decoder (RMSNorm, separate q/k/v projections with rotary embeddings applied inside the
attention, grouped key/value heads, a gated SwiGLU MLP, a head tied to the embedding) whose attention reads its head
count from the projections' width (``view(B, T, -1, hd)``, Llama's way), so it runs on a rank's share of the heads.
Three variants a model-parallel technique must refuse rather than train wrongly:

- ``build_silent``: the attention hard-codes its head count as ``view(B, T, n_heads, -1)``: on half the heads it
  silently computes heads of half the width (no error, other math);
- ``build_fails``: it hard-codes ``view(B, T, n_heads, head_dim)``, which fails on half the heads;
- ``build_outside``: the model computes the rotary tables once and passes them to every block (as Hugging Face
  Llama does), so a block cannot run on the hidden state alone.

Each is a user's build (``--model tests/decoders.py:build``) returning its structure; none declares more than that.

``build_inferred``: a GPT-2-style decoder (a fused ``c_attn`` split into q, k, v, causal SDPA, a GELU MLP, LayerNorm)
that returns no structure: the harness infers its blocks, attention and MLP, the one description every technique
reads (tp shards the MLP that prune:mode=structured shrinks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, D, HEADS, KV_HEADS, HIDDEN, LAYERS, T, BATCH, LR = 23, 32, 4, 2, 48, 2, 12, 8, 3e-3


def rotary_tables(T: int, hd: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, hd) of rotary position embeddings (Su et al. 2021): pair (i, i + hd/2) turns by t * theta_i."""
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    angles = torch.arange(T, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    cos, sin = tables
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class Attention(nn.Module):
    """Causal self-attention with rotary q and k. ``heads``: how the forward finds the head count: ``"width"`` (from
    the projection, -1), ``"silent"`` (``view(B, T, n_heads, -1)``) or ``"fails"`` (``view(B, T, n_heads, hd)``)."""

    def __init__(self, heads: str = "width") -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.hd, self.heads = HEADS, KV_HEADS, D // HEADS, heads
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, KV_HEADS * self.hd, bias=False)
        self.v_proj = nn.Linear(D, KV_HEADS * self.hd, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)

    def _split(self, t: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = t.shape
        shape = {"width": (-1, self.hd), "silent": (n, -1), "fails": (n, self.hd)}[self.heads]
        return t.view(B, T, *shape).transpose(1, 2)

    def forward(self, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self._split(self.q_proj(x), self.n_heads)
        k, v = self._split(self.k_proj(x), self.n_kv_heads), self._split(self.v_proj(x), self.n_kv_heads)
        tables = tables if tables is not None else rotary_tables(T, q.shape[-1], x.device)
        q, k = rotate(q, tables), rotate(k, tables)
        r = q.shape[1] // k.shape[1]  # query heads per key/value head, from the widths
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, HIDDEN, bias=False)
        self.up_proj = nn.Linear(D, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, heads: str) -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(D)
        self.attn = Attention(heads)
        self.post_norm = nn.RMSNorm(D)
        self.mlp = GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x))
        return x + self.mlp(self.post_norm(x))


class TablesLayer(Layer):
    """A layer that must be given the rotary tables (``tables`` is required, as Hugging Face Llama's
    ``position_embeddings`` effectively is)."""

    def forward(self, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), tables)
        return x + self.mlp(self.post_norm(x))


class Decoder(nn.Module):
    def __init__(self, heads: str = "width", outside: bool = False) -> None:
        super().__init__()
        self.outside = outside
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList((TablesLayer if outside else Layer)(heads) for _ in range(LAYERS))
        self.norm = nn.RMSNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        tables = rotary_tables(idx.shape[1], D // HEADS, idx.device) if self.outside else None
        for layer in self.layers:
            x = layer(x, tables) if self.outside else layer(x)
        return self.lm_head(self.norm(x))


STRUCTURE = {
    "blocks": "layers", "n_blocks": LAYERS,
    "block": {"attention": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": D // HEADS, "module": "attn",
                            "q": "attn.q_proj", "k": "attn.k_proj", "v": "attn.v_proj", "out": "attn.o_proj",
                            "rotary": True},
              "mlp": {"up": "mlp.up_proj", "gate": "mlp.gate_proj", "down": "mlp.down_proj", "hidden": HIDDEN},
              "norms": ["input_norm", "post_norm"]},
    "embedding": "embed", "final_norm": "norm", "head": "lm_head", "tied": True, "causal": True,
    "convolutional": False, "calls_sdpa": True,
}


class FusedAttention(nn.Module):
    """GPT-2's attention as nanoGPT writes it: one c_attn projection split into q, k, v; the heads from its width."""

    def __init__(self) -> None:
        super().__init__()
        # no bias: a key bias gets no gradient (softmax ignores a constant per query), so AdamW moves it by rounding
        # noise alone, which no two runs share
        self.c_attn = nn.Linear(D, 3 * D, bias=False)
        self.c_proj = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T_, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T_, -1, D // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T_, C))


class GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(D, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(D), FusedAttention(), nn.LayerNorm(D), GeluMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class InferredGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.h = nn.ModuleList(GPTBlock() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _spec(model: nn.Module, structure: dict | None = STRUCTURE) -> dict:
    data = torch.randint(0, VOCAB, (256, T + 1), generator=torch.Generator().manual_seed(5))

    def batches(batch_size: int, bseed: int):
        gen = torch.Generator().manual_seed(bseed)
        while True:
            rows = data[torch.randint(0, len(data), (batch_size,), generator=gen)]
            yield rows[:, :-1], rows[:, 1:]

    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"val_loss": float(loss(m(data[:32, :-1]), data[:32, 1:]))}

    return {"model": model, "train_data": batches, "loss": loss, "evaluate": evaluate, "metric": "val_loss",
            "higher_is_better": False, "batch_size": BATCH, "lr": LR, "quality_steps": 10, "tokens_per_sample": T,
            **({"structure": structure} if structure else {})}


def build(seed: int = 0) -> dict:
    return _spec(Decoder())


def build_silent(seed: int = 0) -> dict:
    return _spec(Decoder(heads="silent"))


def build_fails(seed: int = 0) -> dict:
    return _spec(Decoder(heads="fails"))


def build_outside(seed: int = 0) -> dict:
    return _spec(Decoder(outside=True))


def build_inferred(seed: int = 0) -> dict:
    return _spec(InferredGPT(), structure=None)


def workload(fn: str = "build"):
    """``fn`` of this file as a registered user workload (what ``--model tests/decoders.py:fn`` makes)."""
    from pathlib import Path

    from bench.plan.user_models import parse_model, register_model

    return register_model(parse_model(f"decoder_{fn}={Path(__file__).resolve()}:{fn}"))()
