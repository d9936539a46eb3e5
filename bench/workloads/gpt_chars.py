"""GPT-style decoder on character-level text that ships with every CPython.

The model follows nanoGPT (Karpathy, https://github.com/karpathy/nanoGPT ``model.py``) and GPT-2 (Radford et al.
2019, "Language Models are Unsupervised Multitask Learners"): token + learned position embeddings, pre-LayerNorm
blocks of causal self-attention (``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP, a final
LayerNorm and a linear head tied to the token embedding. The blocks are ``model.blocks``. Dropout defaults to 0,
so a run is deterministic for its seed.

Corpus: ``pydoc_data.topics`` (the help texts of CPython's ``pydoc``), its values joined in key order. It differs
between Python releases, so ``dataset`` records its sha256 and the Python version. ``small`` and ``gpt2-124m``
append the standard library's own ``.py`` sources (sorted paths under ``sysconfig.get_paths()["stdlib"]``, without
``site-packages`` and test suites), capped at ``corpus_mb`` million characters. The vocabulary is the sorted set of
the corpus's characters; the first 90% is for training, the last 10% is held out.

Source task (``stdlib_chars``, ``BuiltWorkload.source_task``: what transfer learning pretrains on): ``SOURCE_CHARS``
(2M) characters of the standard library's ``.py`` sources in the corpora's own order (sorted paths, the same files
skipped), starting after the largest stdlib prefix that any size trains on and that still leaves 2M characters here
(CPython 3.11.7's stdlib has about 12.1M characters: ``tiny`` uses none, ``small`` 4M, ``gpt2-124m`` asks for 16M
and so takes all of it; the source starts at 4M, and ``gpt2-124m`` is refused with the numbers: no disjoint text is
left for it). Files under ``pydoc_data/`` are skipped: they hold the topics text, the corpus every size trains on.
The text is encoded in the size's character vocabulary (characters outside it are dropped and counted) and cut into
the size's ``seq_len`` windows. Same model, same vocabulary: every weight carries over, the tied head included.

``gpt2-124m`` is GPT-2-124M-class in shape (12 layers, 12 heads, d_model 768, context 1024: about 85M parameters
outside the embeddings) but not in vocabulary: GPT-2 uses 50257 BPE tokens, this model a few hundred characters.
It is meant for a GPU. ``gpt2-124m-b32`` is the same model, LR and corpus at batch 32 (32 x 1024 tokens a step),
the batch at which an independent hand-written loop on an H200 reached 42.5% of the datasheet's dense bf16 peak with
bf16, torch.compile and fused AdamW (reports/example-h200-first/bare-loop.jsonl; batch 8 leaves the GPU mostly
idle): the ``gpu`` preset's transformer. It is ``gpt2-124m`` changed by ``at_batch``, so it keeps whatever
``gpt2-124m`` declares (an LR warm-up included, over the same number of tokens: a quarter of the steps). Its
quality budget, 120 steps with 10 evaluations, is sized so that the slowest set, the fp32 baseline, trains it in
about a minute on an H200 (an estimate from FLOPs and the first H200 run's fp32 throughput: docs/gpu.md); no target
yet, as for ``gpt2-124m``.

Quality budgets and validation targets (``quality_steps`` at ``batch_size``; see docs/methodology.md): each target is
the less demanding of the median over seeds of the baseline's val_loss at the evaluation nearest 70% of the budget
and the worst seed's best evaluation, from ``scripts/calibrate_targets.py`` on the project's 2-core CPU machine.

- ``tiny``: 150 steps, 10 evaluations; seeds 0-6 at step 105: 2.359, 2.589, 2.636, 2.345, 2.326, 2.363, 2.354
  (median 2.359), but seeds 1 and 2 never get below 2.420 and 2.474 in the budget. Target 2.48 (2.474 rounded in
  the lenient direction), which every seed reaches (the median seed at about step 90).
- ``small``: 300 steps, 10 evaluations; seeds 0-4 at step 210: 2.407, 2.607, 2.429, 2.299, 2.364 (median 2.407);
  their best evaluations 2.163-2.280. Target 2.41.
- ``gpt2-124m``: no target yet: calibrating it needs a GPU (run ``scripts/calibrate_targets.py --workloads
  gpt:gpt2-124m`` there), and it waits for that run with the warm-up below; until then its time-to-target is not
  measured.

LR warm-up (``lr_warmup_steps``): ``gpt2-124m`` warms its learning rate up linearly over its first 100 optimizer
steps (LR x (step + 1) / 100, then the constant 6e-4), as real GPT-2 training does. Without it, on the first H200
sweep (reports/example-h200-first, 2026-12-04), the fp32 reference's loss rose from 5.1-5.4 to 7.2-9.4 within its
first 3 steps on all three seeds, and parity's loss check failed on seed 1 for bf16, bf16+compile and bf16+fp8
(tf32 drifted 2.0e-2 there, within 5e-2). 100 steps is nanoGPT's warm-up for its character-level model
(``config/train_shakespeare_char.py``: ``warmup_iters = 100`` at 64 x 256 tokens per step; this size trains
8 x 1024): 10% of the quality budget. GPT-2 124M on 0.5M-token batches warms up longer (nanoGPT ``train.py`` 2000
steps, llm.c 700; GPT-3 over 375M tokens), which at this size's batch would outlast its 1000-step budget. Not yet
run on a GPU with the warm-up.
``tiny`` and ``small`` have none: their losses do not spike in their first 8 steps (seeds 0-2 on CPU: no loss more
than 8.4% above the one before it; ``scripts/parity_calibration.py --spikes``, reports/parity-calibration-cpu), and
their targets were calibrated without one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.data import cached_arrays, digest, window_pipeline
from bench.core.structure import MLP as MLPPart
from bench.core.structure import Attention, ModelStructure, Scaling
from bench.core.structure import Block as BlockPart
from bench.workloads.base import Batch, BuiltWorkload, Size, SourceTask, Workload, dataset_cache, register

TRAIN_FRACTION = 0.9
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
SOURCE_TASK = "stdlib_chars"  # the source task the model's description declares (``ModelStructure.source_task``)
SOURCE_CHARS = 2_000_000  # characters of stdlib sources in the source task
EXCLUDED_DIRS = ("pydoc_data",)  # stdlib files holding the pydoc topics, the corpus itself: never in the source
_CODE_SHA = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # in the dataset cache's key: how it decodes


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    d_model: int
    dropout: float = 0.0
    tie_weights: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0, "d_model must be divisible by n_head"
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Decoder-only transformer: ``model(idx)`` with idx (B, T) int64 returns logits (B, T, vocab_size)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        # GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def trainbench_structure(self) -> ModelStructure:
        return gpt_structure(self.cfg.n_layer, self.cfg.n_head, self.cfg.d_model, self.cfg.tie_weights)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; ``non_embedding`` leaves out the token and position embeddings (and an untied head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel() + self.wpe.weight.numel()
            if not self.cfg.tie_weights:
                n -= self.head.weight.numel()
        return n


def gpt_structure(n_layer: int, n_head: int, d_model: int, tied: bool = True) -> ModelStructure:
    """The GPT's parts: pre-LayerNorm blocks of fused-qkv attention and a GELU MLP, token and position
    embeddings (summed, then dropout: ``GPT.forward`` before its blocks), the final LayerNorm and the (tied) head; a teacher scales ``d_model`` (whole heads) and ``n_layer``."""
    attention = Attention(heads=n_head, kv_heads=n_head, head_dim=d_model // n_head, module="attn", qkv="attn.qkv",
                          out="attn.proj")
    return ModelStructure(
        blocks="blocks", n_blocks=n_layer,
        block=BlockPart(attention=attention, mlp=MLPPart(up="mlp.fc", down="mlp.proj", hidden=4 * d_model),
                        norms=("ln1", "ln2")),
        embedding="wte", position_embedding="wpe", pre_blocks=("drop",), final_norm="ln_f", head="head", tied=tied,
        causal=True, convolutional=False,
        calls_sdpa=True, scaling=Scaling(width=("d_model",), depth=("n_layer",), multiple_of=(("d_model", "n_head"),)),
        source_task=SOURCE_TASK, source="declared")


def _stdlib_paths() -> list[str]:
    """The standard library's .py files (without ``_SKIP_DIRS``) in sorted path order: concatenated, they are the
    stream the corpora take prefixes of and the source task a later stretch of."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    return sorted(paths)


def _stdlib_sources(max_chars: int) -> str:
    """The standard library's .py files in sorted path order, concatenated, up to ``max_chars`` characters."""
    parts, total = [], 0
    for path in _stdlib_paths():
        if total >= max_chars:
            break
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        parts.append(text[: max_chars - total])
        total += len(parts[-1])
    return "".join(parts)


@lru_cache(maxsize=4)
def load_corpus(corpus_mb: float = 0.0) -> tuple[np.ndarray, list[str], dict[str, Any]]:
    """(token ids int64, vocabulary, dataset record): pydoc topics plus ``corpus_mb`` M chars of stdlib sources.

    The text is read every time (its hash is the cache's key); its encoding, a sort of every character, is read
    from the sweep's dataset cache when a process of the sweep has done it (``cached_arrays``)."""
    from pydoc_data.topics import topics

    text = "".join(v for _, v in sorted(topics.items()))
    topics_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    source = "pydoc_data.topics"
    if corpus_mb > 0:
        text += _stdlib_sources(int(corpus_mb * 1e6))
        source += f" + stdlib .py sources (sorted, first {corpus_mb:g}M chars)"
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    head = {"name": "python-chars", "source": source, "sha256": sha, "pydoc_topics_sha256": topics_sha,
            "python_version": sys.version.split()[0], "unit": "characters"}

    def encode_all() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        uniq, ids = np.unique(codes, return_inverse=True)
        n_train = int(len(ids) * TRAIN_FRACTION)
        record = {**head, "n_train": n_train, "n_eval": len(ids) - n_train, "vocab_size": len(uniq)}
        small = np.uint16 if len(uniq) <= 1 << 16 else np.uint32  # a quarter of int64's bytes on disk
        return {"ids": ids.astype(small), "vocab": uniq}, {"record": record}

    arrays, meta = cached_arrays(dataset_cache(), "gpt-corpus", digest(sha, corpus_mb, _CODE_SHA), encode_all)
    return arrays["ids"].astype(np.int64), [chr(c) for c in arrays["vocab"]], meta["record"]


def corpus_split(corpus_mb: float, seq_len: int, eval_windows: int
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], list[str], dict[str, Any]]:
    """(training ids, held-out (inputs, targets), vocabulary, dataset record). The held-out windows are fixed and
    evenly spaced: the same for every trial, no RNG involved."""
    ids, vocab, record = load_corpus(corpus_mb)
    data = torch.from_numpy(ids)
    train, held_out = data[: record["n_train"]], data[record["n_train"] :]
    starts = torch.linspace(0, len(held_out) - seq_len - 1, eval_windows).long()
    windows = held_out[starts[:, None] + torch.arange(seq_len + 1)]
    return train, (windows[:, :-1], windows[:, 1:]), vocab, record


# ---- the source task: standard-library sources after every size's corpus -----------------------------------------


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[tuple[str, str], ...]:
    """(path relative to the stdlib, text) of the stream ``_stdlib_sources`` takes prefixes of, whole."""
    root = sysconfig.get_paths()["stdlib"]
    return tuple((os.path.relpath(p, root), Path(p).read_text(encoding="utf-8", errors="replace"))
                 for p in _stdlib_paths())


def corpus_ends() -> dict[str, int]:
    """Characters of the stdlib stream each size's corpus takes (its ``corpus_mb`` cap, as ``load_corpus`` reads it)."""
    return {size: int(p.corpus_mb * 1e6) for size, p in GPTChars.sizes.items()}


def source_offset(own_end: int, available: int) -> int:
    """Where the source starts in the stdlib stream: after the largest corpus of any size that leaves
    ``SOURCE_CHARS`` behind it. Refused when the size's own corpus (``own_end`` characters) reaches past it."""
    offset = max((e for e in corpus_ends().values() if e + SOURCE_CHARS <= available), default=0)
    if own_end > offset:
        raise ValueError(f"this size's corpus takes the first {own_end:,} characters of the standard library's "
                         f"sources and this Python's stdlib has {available:,}: no {SOURCE_CHARS:,} characters "
                         "disjoint from it are left for a source task")
    return offset


def source_text(offset: int, n_chars: int = SOURCE_CHARS) -> tuple[str, list[str]]:
    """``n_chars`` characters of the stdlib stream from position ``offset`` on, files under ``EXCLUDED_DIRS``
    skipped (positions still count them), and the files they come from."""
    parts, files, pos, taken = [], [], 0, 0
    for rel, text in stdlib_files():
        start, pos = pos, pos + len(text)
        if pos <= offset or rel.split(os.sep)[0] in EXCLUDED_DIRS:
            continue
        piece = text[max(offset - start, 0):][: n_chars - taken]
        parts.append(piece)
        files.append(rel)
        taken += len(piece)
        if taken >= n_chars:
            return "".join(parts), files
    raise ValueError(f"the standard library's sources end {n_chars - taken:,} characters short of a "
                     f"{n_chars:,}-character source task from position {offset:,}")


def encode(text: str, vocab: list[str]) -> tuple[torch.Tensor, int]:
    """Token ids of ``text`` in the sorted character vocabulary ``vocab`` (characters outside it dropped), and how
    many were dropped."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    known = np.array([ord(c) for c in vocab], dtype=np.uint32)
    idx = np.searchsorted(known, codes)
    inside = idx < len(known)
    inside[inside] = known[idx[inside]] == codes[inside]
    return torch.from_numpy(idx[inside].astype(np.int64)), int((~inside).sum())


def stdlib_source_task(p: dict[str, Any], vocab: list[str]) -> SourceTask:
    """The source task of the size whose parameters are ``p`` and whose vocabulary is ``vocab`` (module docstring):
    its token ids, cut into random ``seq_len`` windows as the corpus is."""
    available = sum(len(t) for _, t in stdlib_files())
    offset = source_offset(int(p["corpus_mb"] * 1e6), available)
    text, files = source_text(offset)
    ids, dropped = encode(text, vocab)
    T = p["seq_len"]
    info = {"task": "standard-library .py sources", "python_version": sys.version.split()[0],
            "offset_chars": offset, "chars": len(text), "first_file": files[0], "last_file": files[-1],
            "skipped": [f"{d}/" for d in EXCLUDED_DIRS], "tokens": len(ids), "dropped_out_of_vocab": dropped,
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "overlaps_target": False}
    return SourceTask(SOURCE_TASK, ids, lambda batch_size, seed: window_batches(ids, batch_size, T, seed), info,
                      new_head=False)


# The equivalence margin of val_loss at equal samples: 0.02 nats per character (a 2% change of perplexity), about a
# fifth of the seed-to-seed spread of gpt:tiny's final val_loss (0.10) and a tenth of what its budget's last half
# gains; a change this small does not decide between recipes.
VAL_LOSS_MARGIN = 0.02


def lm_workload(model: nn.Module, train: torch.Tensor, held_out: tuple[torch.Tensor, torch.Tensor],
                p: dict[str, Any], record: dict[str, Any], **extra: Any) -> BuiltWorkload:
    """A character language model's BuiltWorkload: random training windows of ``p["seq_len"]``, mean cross-entropy,
    held-out val_loss (lower is better), and the size's budget (``p``)."""
    T = p["seq_len"]
    x_eval, y_eval = held_out
    return BuiltWorkload(
        model=model,
        batches=lambda batch_size, bseed: window_batches(train, batch_size, T, bseed),
        loss_fn=lm_loss,
        evaluate=lambda m: lm_metrics(m, x_eval, y_eval, chunk=p["batch_size"]),
        metric="val_loss",
        higher_is_better=False,
        batch_size=p["batch_size"],
        tokens_per_sample=T,
        lr=p["lr"],
        target=p["target"],
        margin=VAL_LOSS_MARGIN,
        quality_steps=p["quality_steps"],
        eval_points=p["eval_points"],
        dataset=dict(record),
        params=p,
        pipeline=window_pipeline(train, T),  # the same windows as a Dataset, for ``loader``
        **extra,
    )


def window_batches(data: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> Iterator[Batch]:
    """Endless random windows: x = data[i : i+T], y = data[i+1 : i+T+1], starts drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq_len + 1)
    while True:
        starts = torch.randint(len(data) - seq_len, (batch_size,), generator=gen)
        windows = data[starts[:, None] + offsets]
        yield windows[:, :-1], windows[:, 1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every sequence."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def lm_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> dict[str, float]:
    """Mean held-out cross-entropy (nats per character) and bits per character, ``chunk`` windows at a time."""
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, len(x), chunk):
        logits = model(x[i : i + chunk].to(device)).float()
        total += float(lm_loss(logits, y[i : i + chunk].to(device))) * len(x[i : i + chunk])
    loss = total / len(x)
    return {"val_loss": loss, "val_bpc": loss / math.log(2)}


@dataclass(frozen=True)
class GptSize(Size):
    """A ``gpt`` size: the decoder's shape, the batch and AdamW's LR, the corpus, and the quality budget and target
    (docstring)."""

    may_be_zero = ("corpus_mb", "lr_warmup_steps")
    derived = ("vocab_size",)  # the corpus's characters: set by the build, recorded in its params

    n_layer: int
    n_head: int
    d_model: int  # a whole number of heads
    seq_len: int  # the context: tokens per sample
    batch_size: int
    lr: float
    corpus_mb: float  # million characters of stdlib sources after the pydoc topics (0: the topics alone)
    eval_windows: int  # held-out windows evaluated
    target: float | None  # validation loss; None: not calibrated
    quality_steps: int
    eval_points: int
    # linear LR warm-up over the first optimizer steps (docstring); 0: none. Keyword-only, so a subclass's sizes
    # (``PrefSize``) add their own fields after it
    lr_warmup_steps: int = field(default=0, kw_only=True)

    def problem(self) -> str | None:
        if self.d_model % self.n_head:
            return f"d_model {self.d_model} is not a whole number of heads (n_head {self.n_head})"
        return None


def at_batch(base: GptSize, batch_size: int, **changes: Any) -> GptSize:
    """``base`` at another batch: the same model, LR and corpus, ``changes`` applied; an LR warm-up, where the size
    declares one, over the same number of tokens (its steps scaled by the batches' ratio)."""
    warmup = getattr(base, "lr_warmup_steps", 0)  # a field of sizes that spike without a warm-up
    if warmup:
        changes.setdefault("lr_warmup_steps", max(1, round(warmup * base.batch_size / batch_size)))
    return dataclasses.replace(base, batch_size=batch_size, **changes)


@register
class GPTChars(Workload):
    name = "gpt"
    summary = "GPT-style decoder (SDPA) on CPython's pydoc topics (+ stdlib sources), characters; metric val_loss"
    sizes = {
        "tiny": GptSize(n_layer=2, n_head=2, d_model=64, seq_len=64, batch_size=16, lr=3e-3, corpus_mb=0,
                        eval_windows=32, target=2.48, quality_steps=150, eval_points=10),
        "small": GptSize(n_layer=4, n_head=4, d_model=256, seq_len=128, batch_size=32, lr=1e-3, corpus_mb=4,
                         eval_windows=64, target=2.41, quality_steps=300, eval_points=10),
        "gpt2-124m": GptSize(n_layer=12, n_head=12, d_model=768, seq_len=1024, batch_size=8, lr=6e-4, corpus_mb=16,
                             eval_windows=32, target=None, quality_steps=1000, eval_points=10,
                             lr_warmup_steps=100),
    }
    sizes["gpt2-124m-b32"] = at_batch(sizes["gpt2-124m"], 32, quality_steps=120)  # the gpu preset's

    def load_data(self, size: str) -> None:
        load_corpus(self.size_params(size)["corpus_mb"])

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        p = GptSize.of(params).params()
        T = p["seq_len"]
        train, (x_eval, y_eval), vocab, record = corpus_split(p["corpus_mb"], T, p["eval_windows"])
        p["vocab_size"] = len(vocab)

        cfg = GPTConfig(vocab_size=len(vocab), seq_len=T, n_layer=p["n_layer"], n_head=p["n_head"],
                        d_model=p["d_model"])
        torch.manual_seed(seed)
        model = GPT(cfg).to(device)

        return lm_workload(model, train, (x_eval, y_eval), p, record, structure=self.structure_from(p),
                           source_task=lambda: stdlib_source_task(p, vocab), lr_warmup_steps=p["lr_warmup_steps"])

    def structure_from(self, params: dict[str, Any]) -> ModelStructure:
        return gpt_structure(params["n_layer"], params["n_head"], params["d_model"])
