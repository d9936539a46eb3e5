"""A nanoGPT-style character model brought as it is: an outside model, its own loss, optimizer and LR schedule.

Written for trainbench against the public interface of Andrej Karpathy's nanoGPT (``model.py``: ``GPTConfig``,
``GPT(config)``, ``forward(idx, targets=None)`` returning ``(logits, loss)`` and, without targets, the last
position's logits only; ``configure_optimizers`` with weight-decay groups and betas (0.9, 0.95); the training
script's linear warm-up then cosine decay of the LR). Nothing here is copied from it: it is a from-scratch model of
the same shape, so that a sweep measures a model the way such a repository hands it over, without an adapter class.

Run it with::

    python -m bench sweep --model examples/nanogpt_chars.py:build --techniques grad_accum:steps=2,checkpointing

What ``build`` declares beyond the required keys (docs/models.md):

- ``forward_targets="targets"``: the model computes its own loss. The harness calls ``model(idx, targets=y)`` in
  training and takes the loss from the ``(logits, loss)`` it returns (the one scalar tensor of the tuple), so no
  ``loss`` function is given. Its ``evaluate`` calls the model with targets too, for the loss at every position.
- ``optimizer``: AdamW on two parameter groups, every matrix (dim >= 2) with weight decay and the rest (biases,
  norms) without, betas (0.9, 0.95), as nanoGPT's ``configure_optimizers`` makes it. The harness builds it on the
  trainable parameters, so a technique that freezes some leaves them out.
- ``schedule``: the LR of nanoGPT's training script, a linear warm-up over ``warmup_iters`` steps and a cosine decay
  to ``min_lr`` at ``lr_decay_iters``, as a ``LambdaLR`` stepped once per optimizer step.

Which techniques apply to it (``python -m bench list --model examples/nanogpt_chars.py:build``): its forward does
not trace symbolically (the ``assert`` on the sequence length turns a traced size into a Python bool), so the
harness finds no embedding or head in it, and techniques that need them (``pp``, ``mtp``) are skipped naming that
line. Each block traces, so its attention (a fused ``c_attn`` split into q, k, v, causal SDPA) and MLP are found,
and ``tp`` and ``prune:mode=structured`` run on them. ``pp``, ``mtp`` and ``distill`` compute a loss from the
model's logits, which a model that computes its own loss does not hand over: they are skipped with that reason too.
``freeze`` freezes the token embedding with the first block, and the head's weight with it (they are tied).

Corpus: ``pydoc_data.topics`` (the help texts that ship with CPython), its values joined in key order, one token per
character; the first 90% trains (random windows, seeded), fixed windows of the last 10% evaluate. Nothing is
downloaded. The sizes are small enough for a 2-core CPU; no target is set (this model is not calibrated: its time to
target is not measured).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

TRAIN_FRACTION = 0.9
N_EVAL_WINDOWS = 64


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in the Linears and LayerNorms, as GPT-2 has them


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch's has none to switch off)."""

    def __init__(self, ndim: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, -1, C // self.n_head).transpose(1, 2)  # (B, heads, T, head size)
        k = k.view(B, T, -1, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, -1, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one matrix embeds and predicts
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the projections into the residual stream
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}, block size is {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:  # generation needs the last position only
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay: float, learning_rate: float, betas: tuple[float, float],
                             device_type: str) -> torch.optim.AdamW:
        """AdamW over this model's trainable parameters, as ``decay_groups`` splits them."""
        return torch.optim.AdamW(decay_groups([p for p in self.parameters() if p.requires_grad], weight_decay),
                                 lr=learning_rate, betas=betas)


def decay_groups(params: list[nn.Parameter], weight_decay: float) -> list[dict]:
    """Two parameter groups: every matrix (embeddings, Linear weights) decays, the vectors (biases, norms) do not."""
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]  # a group can be empty (everything it holds frozen)


def get_lr(it: int, learning_rate: float, min_lr: float, warmup_iters: int, lr_decay_iters: int) -> float:
    """The training script's LR: linear warm-up, then a cosine decay to ``min_lr`` at ``lr_decay_iters``."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


# ---- the data: pydoc's topics, one token per character ------------------------------------------------------


@lru_cache(maxsize=1)
def load_corpus() -> tuple[torch.Tensor, int]:
    """(token ids, vocabulary size) of the pydoc topics text."""
    from pydoc_data.topics import topics

    text = "".join(v for _, v in sorted(topics.items()))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


# Sizes: (layers, heads, width, context, batch, quality steps, peak LR). "small" is the 4 x 128 model.
SIZES = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=32, batch_size=16, steps=120, lr=3e-3),
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=16, steps=400, lr=1e-3),
}


def build(size: str = "small", seed: int = 0, device: torch.device | str = "cpu") -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (sizes: {', '.join(SIZES)})")
    s = SIZES[size]
    data, vocab = load_corpus()
    split = int(TRAIN_FRACTION * len(data))
    train, held_out = data[:split], data[split:]
    T = s["block_size"]
    starts = torch.linspace(0, len(held_out) - T - 2, N_EVAL_WINDOWS).long()
    x_eval = torch.stack([held_out[i: i + T] for i in starts])
    y_eval = torch.stack([held_out[i + 1: i + T + 1] for i in starts])

    config = GPTConfig(block_size=T, vocab_size=vocab, n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"])
    model = GPT(config)

    def batches(batch_size: int, batch_seed: int):
        gen = torch.Generator().manual_seed(batch_seed)
        while True:
            i = torch.randint(0, len(train) - T - 1, (batch_size,), generator=gen)
            yield (torch.stack([train[j: j + T] for j in i]), torch.stack([train[j + 1: j + T + 1] for j in i]))

    def evaluate(m: nn.Module) -> dict[str, float]:
        device_ = next(m.parameters()).device
        _, loss = m(x_eval.to(device_), y_eval.to(device_))
        return {"val_loss": float(loss)}

    lr, steps = s["lr"], s["steps"]
    warmup = max(1, steps // 10)

    return dict(
        model=model, train_data=batches, evaluate=evaluate, metric="val_loss", higher_is_better=False,
        forward_targets="targets",  # forward(idx, targets) returns (logits, loss): the harness takes the loss
        optimizer=lambda params: torch.optim.AdamW(decay_groups(params, 0.1), lr=lr, betas=(0.9, 0.95)),
        schedule=lambda opt: torch.optim.lr_scheduler.LambdaLR(
            opt, lambda it: get_lr(it, lr, lr / 10, warmup, steps) / lr),
        batch_size=s["batch_size"], quality_steps=steps, tokens_per_sample=T, margin=0.02,
    )
