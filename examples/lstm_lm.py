"""Character-level LSTM language model: an example "bring your own model" for trainbench.

Run it with::

    python -m bench sweep --model examples/lstm_lm.py:build --techniques bf16,grad_accum:steps=4,checkpointing,compile

Corpus: the ``.py`` sources of a few standard-library packages (``PACKAGES``; sorted paths, test directories
skipped), read from ``sysconfig.get_paths()["stdlib"]`` and capped at ``MAX_CHARS`` characters, so nothing is
downloaded. It is not the built-in ``gpt`` workload's corpus (``pydoc_data.topics`` plus the stdlib sources taken
in path order from the top). The text differs a little between Python releases. The vocabulary is the sorted set of
the corpus's characters; the first 90% is for training, and evaluation uses fixed, evenly spaced windows from the
last 10%.

The model: a token embedding, ``model.blocks`` (an ``nn.ModuleList`` of residual blocks, each LayerNorm ->
single-layer ``nn.LSTM`` -> add), a final LayerNorm and a linear head. Activation checkpointing and per-block
compile wrap each block.

Measured on a 2-core AMD EPYC machine, torch 2.13 CPU, ``small`` at batch_size 32 and lr 3e-3 (``quality_steps``
250, 10 evaluations, AdamW), step time is the median over the run, forward + backward + optimizer step:
MEASURED
"""

from __future__ import annotations

import math
import os
import sysconfig
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

PACKAGES = ("email", "json", "logging", "http", "urllib", "xml")  # a mix of prose-heavy docstrings and code
MAX_CHARS = 1_000_000
TRAIN_FRACTION = 0.9
N_EVAL_WINDOWS = 64

# d_model (embedding = LSTM hidden size), number of LSTM blocks, sequence length, batch size.
SIZES = {
    "small": dict(d_model=128, n_blocks=2, seq_len=32, batch_size=32),
    "medium": dict(d_model=512, n_blocks=4, seq_len=128, batch_size=64),
}


@lru_cache(maxsize=1)
def load_corpus() -> tuple[torch.Tensor, tuple[str, ...]]:
    """(token ids as an int64 tensor, vocabulary) of the capped, concatenated package sources."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = [d for d in dirnames if d not in {"test", "tests", "__pycache__"}]
            paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    if not paths:
        raise FileNotFoundError(f"no .py sources of {PACKAGES} under {root}")
    parts, total = [], 0
    for path in sorted(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= MAX_CHARS:
            break
    text = "".join(parts)[:MAX_CHARS]
    vocab = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.int64), vocab


@lru_cache(maxsize=1)
def _cpu_bf16_lstm_works() -> bool:
    """Whether nn.LSTM runs under CPU bf16 autocast here. Autocast sends it to oneDNN's bf16 LSTM, which fails
    ("could not create a primitive descriptor") on CPUs without AVX512-BF16, e.g. the 2-core AMD EPYC machine;
    there the LSTM falls back to fp32 and only the embedding, LayerNorms and head see bf16."""
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            nn.LSTM(8, 8, batch_first=True)(torch.zeros(1, 2, 8))
        return True
    except RuntimeError:
        return False


class LSTMBlock(nn.Module):
    """Pre-norm residual LSTM block: x + LSTM(LayerNorm(x))."""

    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.lstm = nn.LSTM(d, d, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not _cpu_bf16_lstm_works():
            with torch.autocast("cpu", enabled=False):  # see _cpu_bf16_lstm_works
                out, _ = self.lstm(h.float())
        else:
            out, _ = self.lstm(h)
        return x + out.to(x.dtype)


class LSTMLM(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, n_blocks: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(LSTMBlock(d_model) for _ in range(n_blocks))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, vocab) logits
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(size: str = "small", seed: int = 0, device: torch.device = torch.device("cpu")) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    cfg = SIZES[size]
    seq_len = cfg["seq_len"]
    ids, vocab = load_corpus()
    split = int(len(ids) * TRAIN_FRACTION)
    train, held_out = ids[:split], ids[split:]

    def batches(batch_size: int, seed: int):
        """Endless random windows of seq_len + 1 characters from the training split (inputs, next-char targets)."""
        gen = torch.Generator().manual_seed(seed)
        offsets = torch.arange(seq_len + 1)
        while True:
            starts = torch.randint(0, len(train) - seq_len - 1, (batch_size, 1), generator=gen)
            window = train[starts + offsets]
            yield window[:, :-1], window[:, 1:]

    # Fixed, evenly spaced held-out windows: the same for every seed and technique.
    starts = torch.linspace(0, len(held_out) - seq_len - 1, N_EVAL_WINDOWS).long()[:, None]
    eval_windows = held_out[starts + torch.arange(seq_len + 1)]

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def evaluate(model: nn.Module) -> dict[str, float]:
        dev = next(model.parameters()).device
        w = eval_windows.to(dev)
        val_loss = loss(model(w[:, :-1]), w[:, 1:]).item()
        return {"val_loss": val_loss, "val_bpc": val_loss / math.log(2)}

    model = LSTMLM(len(vocab), cfg["d_model"], cfg["n_blocks"]).to(device)
    return {
        "model": model,
        "train_data": batches,
        "loss": loss,
        "evaluate": evaluate,
        "metric": "val_loss",
        "higher_is_better": False,
        "batch_size": cfg["batch_size"],
        "lr": 3e-3,
        "target": None,  # CALIBRATE
        "quality_steps": 250,
        "eval_points": 10,
        "tokens_per_sample": seq_len,
        "blocks": "blocks",
    }
