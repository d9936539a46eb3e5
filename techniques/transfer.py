"""Transfer learning: pretrain the workload's model on another task once, then fine-tune it on the workload.

Method card
- What: before the trial trains, a fresh copy of the workload's model (initialised from a fixed seed, 20000) is
  trained with the workload's optimizer (AdamW), learning rate and batch size for ``steps`` x the workload's quality
  budget on a *source* task of disjoint data; the trial's model then starts from that checkpoint (every weight,
  buffers such as BatchNorm's running statistics included, loaded strictly) and trains the workload as usual, at the
  workload's learning rate or ``lr``. The fine-tune task is always the workload itself, so the sweep's baseline is
  the comparison the method needs: the same model trained from scratch on the fine-tune task to the same target.
- Your own checkpoint, ``transfer:init=/abs/path.pt`` (any model: a user's, a Hugging Face config, a built-in):
  the trial's model starts from the state dict in that file (``torch.save(model.state_dict(), path)``, or a dict
  holding it under ``state_dict``, ``state`` or ``model``; read with ``weights_only``), loaded strictly: a
  checkpoint whose keys or shapes differ is one error listing the missing keys, the unexpected keys and the
  tensors of another shape (the trial fails with it, nothing loaded). Nothing is pretrained; the record holds the
  file's path and sha256 and its load time. The baseline is the same model trained from scratch. The path must be
  absolute (trial processes run in the harness's directory) and may not hold ``,``, ``+`` or ``:`` (the label's
  separators).
- Source tasks, for the models whose description declares one (``ModelStructure.source_task``; without a
  declared task and without ``init`` the set is skipped, saying so):
  - gpt (fine-tune corpus: the pydoc topics, CPython's documentation; ``small`` adds the first 4M characters of the
    standard library's sources): 2M characters of the standard library's ``.py`` sources in the workload's own
    order (``bench.workloads.gpt_chars``: sorted paths, the same files skipped), starting after the largest stdlib
    prefix that any gpt size trains on and that still leaves 2M characters here (CPython 3.11.7's stdlib has about
    12.1M characters: ``tiny`` uses none, ``small`` 4M, ``gpt2-124m`` asks for 16M and so takes all of it; the source
    starts at 4M, and ``gpt2-124m`` is refused with the numbers: no disjoint text is left for it). Files under
    ``pydoc_data/`` are skipped: they hold the topics text, the fine-tune corpus itself. The text is encoded in the
    workload's character vocabulary (characters outside it are dropped and counted) and cut into the workload's
    ``seq_len`` windows. Same model, same vocabulary: every weight transfers, the tied head included.
  - cnn and cnn_aug (Fashion-MNIST): the images of classes 0-4 among the training images the workload does not train
    on (index >= ``n_train``; ``tiny`` trains on the first 6000), normalised as the workload's, without cnn_aug's
    augmentation. ``small`` trains on all 60000, so its source is the classes 0-4 of its own training set and the
    record says ``source_overlaps_target: true``. The classifier head is not transferred (a new label space): the
    fine-tune keeps the trial model's own head, nn.Linear's default initialisation drawn under the trial's seed,
    the very head the baseline starts from, so the trunk is the only difference.
- Why it helps: features learned on a related task (character statistics of Python code; edges and shapes of
  clothes) give the fine-tune a head start, so it reaches the workload's target in fewer steps (Yosinski et al.
  2014; ULMFiT, Howard & Ruder 2018). Kornblith et al. 2019 found that better source models transfer better
  (fine-tuned accuracy correlates with ImageNet accuracy, r = 0.96) and that on small fine-grained sets networks
  trained from scratch long enough matched the pretrained ones' accuracy: there the gain is speed, which is what the
  sweep's time-to-target measures.
- Costs: the pretraining is a one-off cost amortised over every fine-tune that starts from the checkpoint. It runs
  once per sweep: the checkpoint is cached in the sweep's reference directory as ``pretrain-<key>.pt`` (key: sha256
  of workload, size parameters, source, pretraining steps, batch, lr, seed and dataset sha256) and every trial and
  seed of the sweep loads it; its time goes to the probe's ``shared_s`` (not the trial's one-off ``probe_s``) and is
  reported as ``pretrain_s`` (also on a cache hit, from the checkpoint's record). Time-to-target in the report
  therefore excludes it: add ``pretrain_s`` to compare against training from scratch on a single fine-tune.
  One checkpoint for every seed means the trials' spread does not include the pretraining's own seed variation.
- CPU vs GPU: the pretraining is ordinary training of the same model, so its cost scales like the workload's own
  steps; the fine-tune's step is unchanged (same model, same FLOPs).
- Order in a set: transfer loads the workload's own model in phase SURGERY, so a surgery technique that changes the
  model's parameters (extra heads, another architecture) must come after it in the set's label
  (``transfer+mtp``, not ``mtp+transfer``, which fails with that reason); ``freeze`` works in either order.
- Not implemented: discriminative (per-layer) learning rates and slanted triangular schedules (ULMFiT), multi-process
  runs (every rank would write the cache: refused), source tasks for models that declare none (give ``init``).
- Measured (2-core AMD EPYC, AVX2; tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques):
  gpt, pretrained 150 steps on stdlib sources once (4.8 s): val_loss -0.339 [-0.593, -0.085] at equal samples,
  inconclusive (p = 0.029 alone, not after Holm's correction over the report's 10 comparisons; the same at equal
  time, where its 3 faster runs are scored where they ended: no continuation recorded), the target 0.12x [0.03,
  0.41] sooner: 0.29 s against the baseline's 2.71 s (0.60 s with the checkpoint's loading). cnn, pretrained on
  classes 0-4 once (3.8 s): +0.027 [-0.098, +0.152] at equal samples and +0.044 [+0.016, +0.073] at equal time, both
  inconclusive (the latter p = 0.021 alone, not after Holm over 8), the target in 0.97 s against 1.51 s (0.65x
  [0.40, 1.05], inconclusive).
- Sources: Yosinski, Clune, Bengio, Lipson, "How transferable are features in deep neural networks?", NeurIPS 2014
  (arXiv:1411.1792); Howard & Ruder, "Universal Language Model Fine-tuning for Text Classification", ACL 2018
  (arXiv:1801.06146); Kornblith, Shlens, Le, "Do Better ImageNet Models Transfer Better?", CVPR 2019
  (arXiv:1805.08974).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bench.files import save_torch_atomic
from techniques._model import once
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, model_structure, register

PRETRAIN_SEED = 20_000  # the pretrained model's initialisation and batch order: one checkpoint per workload size
SOURCE_CHARS = 2_000_000  # gpt: characters of stdlib sources in the source task
EXCLUDED_DIRS = ("pydoc_data",)  # stdlib files holding the pydoc topics, the gpt fine-tune corpus itself
SOURCE_CLASSES = (0, 1, 2, 3, 4)  # cnn: the classes of the source task
# The source tasks a workload may declare (``ModelStructure.source_task``), and whether the model's head transfers:
# a character corpus keeps the vocabulary; other classes are a new label space (the head is re-initialised).
SOURCE_TASKS = {"stdlib_chars": True, "fashion_classes": False}
HEAD = "head"  # the built-in classifiers' head (their descriptions name it)
FORMAT = 1  # bump when the checkpoint's content changes meaning


# ---- the gpt source: standard-library sources after every size's corpus ---------------------------------------


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[tuple[str, str], ...]:
    """(path relative to the stdlib, text) of the standard library's .py files in the order and with the skips of
    ``bench.workloads.gpt_chars._stdlib_sources``: concatenated, they are the stream its corpora take prefixes of."""
    from bench.workloads.gpt_chars import _SKIP_DIRS

    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    return tuple((os.path.relpath(p, root), Path(p).read_text(encoding="utf-8", errors="replace"))
                 for p in sorted(paths))


def corpus_ends() -> dict[str, int]:
    """Characters of the stdlib stream each gpt size's corpus takes (its ``corpus_mb`` cap, as the workload reads it)."""
    from bench.workloads.gpt_chars import GPTChars

    return {size: int(p["corpus_mb"] * 1e6) for size, p in GPTChars.sizes.items()}


def gpt_source_offset(own_end: int, available: int) -> int:
    """Where the source starts in the stdlib stream: after the largest corpus of any size that leaves
    ``SOURCE_CHARS`` behind it. Refused when the trial's own corpus (``own_end`` characters) reaches past it."""
    offset = max((e for e in corpus_ends().values() if e + SOURCE_CHARS <= available), default=0)
    if own_end > offset:
        raise ValueError(f"transfer: this size's corpus takes the first {own_end:,} characters of the standard "
                         f"library's sources and this Python's stdlib has {available:,}: no {SOURCE_CHARS:,} "
                         "characters disjoint from it are left for a source task")
    return offset


def gpt_source_text(offset: int, n_chars: int = SOURCE_CHARS) -> tuple[str, list[str]]:
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
    raise ValueError(f"transfer: the standard library's sources end {n_chars - taken:,} characters short of a "
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


def gpt_source(fresh: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """The gpt source task's token ids and its description."""
    from bench.workloads.gpt_chars import load_corpus

    p = fresh.params
    available = sum(len(t) for _, t in stdlib_files())
    offset = gpt_source_offset(int(p["corpus_mb"] * 1e6), available)
    text, files = gpt_source_text(offset)
    _, vocab, _ = load_corpus(p["corpus_mb"])
    ids, dropped = encode(text, vocab)
    return ids, {"task": "standard-library .py sources", "python_version": sys.version.split()[0],
                 "offset_chars": offset, "chars": len(text), "first_file": files[0], "last_file": files[-1],
                 "skipped": [f"{d}/" for d in EXCLUDED_DIRS], "tokens": len(ids), "dropped_out_of_vocab": dropped,
                 "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "overlaps_target": False}


# ---- the cnn source: classes 0-4 of the training images the workload does not train on ------------------------


def cnn_source(fresh: Any) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, Any]]:
    """The cnn source task's (images, labels), normalised as the workload's, and its description."""
    from bench.workloads.cnn_fashion import data_dir, load_fashion_mnist

    arrays, _ = load_fashion_mnist(data_dir())
    n_train, total = fresh.params["n_train"], len(arrays["train_x"])
    first = n_train if n_train < total else 0  # a size training on every image leaves none unused: overlap
    labels = arrays["train_y"][first:]
    keep = np.flatnonzero(np.isin(labels, SOURCE_CLASSES)) + first
    mean, std = fresh.dataset["normalize_mean"], fresh.dataset["normalize_std"]
    x = ((torch.from_numpy(arrays["train_x"][keep]).float() / 255 - mean) / std).unsqueeze(1)
    y = torch.from_numpy(arrays["train_y"][keep].astype(np.int64))
    return (x, y), {"task": f"fashion-mnist training images of classes {SOURCE_CLASSES[0]}-{SOURCE_CLASSES[-1]}",
                    "index_from": first, "images": len(keep), "first_index": int(keep[0]),
                    "overlaps_target": first == 0}


# ---- the checkpoint ----------------------------------------------------------------------------------------------


def pretrained(workload: str, probe: Probe, steps: float, cache_dir: Path | None, task: str = "stdlib_chars"
               ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The pretrained state dict (on the CPU) and its record, from ``cache_dir`` when it holds it; else trained
    now on a fresh copy of the workload (``workload``, a name for the cache key) on the source ``task`` its
    description declares (``SOURCE_TASKS``), and cached."""
    from bench.workloads.gpt_chars import window_batches
    from bench.workloads.mlp_mnist1d import shuffled_batches

    fresh = probe.fresh(PRETRAIN_SEED)
    if task not in SOURCE_TASKS:
        raise ValueError(f"transfer: no source task {task!r} (known: {', '.join(SOURCE_TASKS)})")
    if task == "stdlib_chars":
        ids, source = gpt_source(fresh)
        seq_len = fresh.params["seq_len"]

        def batches() -> Any:
            return window_batches(ids, fresh.batch_size, seq_len, PRETRAIN_SEED)
    else:
        (x, y), source = cnn_source(fresh)

        def batches() -> Any:
            return shuffled_batches(x, y, fresh.batch_size, PRETRAIN_SEED)
    n_steps = max(1, math.ceil(steps * fresh.quality_steps))
    config = {"format": FORMAT, "workload": workload, "params": fresh.params, "source": source, "steps": n_steps,
              "batch": fresh.batch_size, "lr": fresh.lr, "seed": PRETRAIN_SEED,
              "dataset": fresh.dataset.get("sha256")}
    key = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir / f"pretrain-{key}.pt" if cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        return saved["state"], {**json.loads(saved["meta"]), "cached": True}
    started = time.perf_counter()
    loop = probe.loop(fresh, fresh.lr)
    source_batches = batches()
    losses = [loop.step(next(source_batches)) for _ in range(n_steps)]
    last = torch.stack(losses[-10:]).float().mean().item()
    state = {k: v.detach().to("cpu", copy=True) for k, v in fresh.model.state_dict().items()}
    elapsed = time.perf_counter() - started
    probe.shared_s += elapsed  # paid once for the sweep: not this trial's one-off cost
    meta = {"key": key, "source": source, "pretrain_steps": n_steps, "batch_size": fresh.batch_size,
            "lr": fresh.lr, "seed": PRETRAIN_SEED, "pretrain_s": round(elapsed, 3),
            "source_first_loss": round(float(losses[0]), 4), "source_final_loss": round(last, 4)}
    if path is not None:
        save_torch_atomic(path, {"state": state, "meta": json.dumps(meta)})
    return state, {**meta, "cached": False}


def load_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (``torch.save`` of ``model.state_dict()``, or of a dict holding it under
    ``state_dict``, ``state`` or ``model``), on the CPU, loaded with ``weights_only`` (no code runs)."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a missing, truncated or pickled-object file: one line, its reason
        raise ValueError(f"transfer:init={path}: cannot be read as a torch checkpoint ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from None
    for key in ("state_dict", "state", "model"):
        if isinstance(saved, dict) and isinstance(saved.get(key), dict):
            saved = saved[key]
            break
    if not (isinstance(saved, dict) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in saved.items())):
        raise ValueError(f"transfer:init={path}: holds a {type(saved).__name__}, not a state dict (name -> tensor); "
                         "save it with torch.save(model.state_dict(), path)")
    return saved


def _listed(keys: list[str], limit: int = 6) -> str:
    shown_keys = ", ".join(keys[:limit])
    return f"{shown_keys} and {len(keys) - limit} more" if len(keys) > limit else shown_keys


def key_mismatch(state: dict[str, torch.Tensor], model: nn.Module) -> str | None:
    """What a strict load of ``state`` into ``model`` would find wrong, in one line (missing keys, unexpected keys,
    tensors of another shape), or None when it matches."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} for {tuple(own[k].shape)}" for k in own
              if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {_listed(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}")
    if shapes:
        parts.append(f"{len(shapes)} of another shape: {_listed(shapes, 3)}")
    return "; ".join(parts) or None


@register
class Transfer(Technique):
    name = "transfer"
    summary = ("start from pretrained weights: a checkpoint you give (init=PATH.pt), or a disjoint source task the "
               "workload declares, pretrained once (cached per sweep); then fine-tune on the workload")
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "initialisation"
    # efficient_arch draws its leaner attention (or convs) afresh: the pretrained weights would be discarded silently
    conflicts = frozenset({"efficient_arch"})

    @dataclass(frozen=True)
    class Options:
        steps: float = 1.0  # pretraining steps as a multiple of the workload's quality budget (source tasks)
        lr: float | None = None  # the fine-tune's learning rate (None: the workload's)
        init: str | None = None  # an absolute path of a checkpoint (the model's state_dict) to start from instead

        def __post_init__(self) -> None:
            if not (self.steps > 0 and math.isfinite(self.steps)):
                raise ValueError(f"steps must be > 0 (a multiple of the workload's quality steps), got {self.steps}")
            if self.lr is not None and not (self.lr > 0 and math.isfinite(self.lr)):
                raise ValueError(f"lr must be > 0 or none (the workload's), got {self.lr}")
            if self.init is not None and not os.path.isabs(self.init):
                raise ValueError(f"init must be an absolute path (trials run in the harness's directory), got "
                                 f"{self.init!r}: write init={os.path.abspath(self.init)}")

    def check(self, ctx: Context) -> str | None:
        if ctx.world_size > 1:
            return "runs on one process: every rank would pretrain and write the cached checkpoint"
        if self.options.init is not None:
            if not os.path.isfile(self.options.init):
                return f"init={self.options.init}: no such file (a checkpoint saved with torch.save(model.state_dict()))"
            return None
        s = ctx.structure
        if s is not None and s.source_task is None:
            return ("needs pretrained weights: give transfer:init=/abs/path.pt (a checkpoint of this model's "
                    "state_dict, loaded strictly); the model's description declares no source task to pretrain on")
        return None

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        return cfg if self.options.lr is None else replace(cfg, lr=self.options.lr)

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        reason = self.check(ctx)
        if reason:
            raise ValueError(f"transfer {reason}")
        path = self.options.init
        if path is not None:
            started = time.perf_counter()
            self._state = load_checkpoint(path)
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            self._meta = {"source": {"task": "checkpoint", "path": path, "sha256": digest, "tensors": len(self._state),
                                     "overlaps_target": None},
                          "load_s": round(time.perf_counter() - started, 3), "cached": None}
            return cfg
        s = ctx.structure or probe.fresh().structure
        task = s.source_task if s is not None else None
        if task is None:
            raise ValueError("transfer: the model's description declares no source task; give init=PATH.pt")
        self._state, self._meta = pretrained(ctx.workload, probe, self.options.steps, ctx.cache_dir, task)
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        state = getattr(self, "_state", None)
        if state is None:
            raise RuntimeError("transfer: no pretrained checkpoint (tune() builds or loads it before the model, once)")
        s = model_structure(model, ctx)
        self._head = self.options.init is None and not SOURCE_TASKS.get(s.source_task or "", True)
        if self.options.init is not None:
            problem = key_mismatch(state, model)
            if problem:
                others = [n for n in ctx.technique_names if n != self.name]
                order = (f" (a transform listed before transfer changes the model: list transfer first, before "
                         f"{', '.join(others)})") if others else ""
                raise ValueError(f"transfer:init={self.options.init} does not match the model: {problem}{order}")
        if self._head:  # a new label space: keep the trial model's own freshly initialised head
            head = s.head
            own = {k: v.detach().clone() for k, v in model.state_dict().items() if head and k.startswith(f"{head}.")}
            if not own:
                raise RuntimeError(f"transfer: the model has no head ({head!r}) to re-initialise")
            state = {**state, **own}
        try:
            model.load_state_dict(state, strict=True)  # in place: a frozen parameter (freeze) stays frozen
        except RuntimeError as exc:
            others = [n for n in ctx.technique_names if n != self.name]
            raise RuntimeError(f"transfer: the checkpoint holds the workload's own model, and a transform before "
                               f"transfer changed its parameters; list transfer before {', '.join(others) or 'it'} "
                               f"in the set ({str(exc).splitlines()[0]})") from exc
        del self._state  # loaded: a second copy of the weights would stay resident through the memory stage
        return model

    def results(self, ctx: Context) -> dict[str, Any] | None:
        meta = getattr(self, "_meta", None)
        if meta is None:
            return None
        return {**meta, "steps": self.options.steps if self.options.init is None else None,
                "init": self.options.init, "fine_tune_lr": ctx.state.get("lr"),
                "head_reinitialised": getattr(self, "_head", None),
                "source_overlaps_target": meta["source"]["overlaps_target"]}

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The report's line of what the technique found (the shared ``summarize`` interface): the checkpoint a
        user gave, or the source task's pretraining and what it cost per trial."""
        first = found[0]
        source = first.get("source") or {}
        if first.get("init"):
            return (f"started from {first['init']} (sha256 {str(source.get('sha256'))[:12]}, "
                    f"{source.get('tensors')} tensors, loaded strictly); nothing pretrained")
        text = (f"pretrained {first.get('pretrain_steps')} steps on {source.get('task')} (loss "
                f"{_g(first.get('source_first_loss'))} -> {_g(first.get('source_final_loss'))}), "
                + once(found, "pretrain_s", "trained"))
        if first.get("head_reinitialised"):
            text += "; classifier head re-initialised"
        if first.get("source_overlaps_target"):
            text += "; the source images overlap the fine-tune's training set"
        return text


def _g(x: float | None) -> str:
    return "-" if x is None else str(x) if isinstance(x, int) else f"{x:.3g}"

