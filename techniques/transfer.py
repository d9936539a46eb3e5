"""Transfer learning: pretrain the workload's model on another task once, then fine-tune it on the workload.

Method card
- What: a fresh copy of the model trains ``steps`` x the workload's quality budget on a source task of disjoint data
  that the workload declares (gpt: Python standard-library sources; cnn: Fashion-MNIST classes 0-4, the head not
  carried over); the trial starts from that checkpoint, loaded strictly, and trains the workload. The baseline is the
  same model from scratch. ``init=/abs/path.pt`` starts any model from your own state dict instead (a mismatched
  checkpoint is one error).
- When it should pay: features from a related task give the fine-tune a head start to the target, on any device. The
  pretraining runs once per sweep, is cached, and is reported apart (``pretrain_s``): time to target excludes it, so
  add it when one fine-tune must carry it.
- Caveats: one checkpoint serves every seed, so the spread leaves out the pretraining's. Surgery techniques follow
  it in a label (``transfer+mtp``). Refused on several processes.
- Sources: Yosinski et al., NeurIPS 2014 (arXiv:1411.1792); Howard & Ruder, "ULMFiT", ACL 2018 (arXiv:1801.06146);
  Kornblith et al., "Do Better ImageNet Models Transfer Better?", CVPR 2019 (arXiv:1805.08974).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-transfer (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny 1.03x [0.87, 1.23] inconclusive, memory 1.00x equivalent.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny 0.90x [0.68, 1.19] inconclusive, memory 1.00x equivalent.
<!-- end generated -->
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.core.files import save_torch_atomic
from techniques._model import once
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, model_structure, register

PRETRAIN_SEED = 20_000  # the pretrained model's initialisation and batch order: one checkpoint per workload size
FORMAT = 1  # bump when the checkpoint's content changes meaning


# ---- the checkpoint ----------------------------------------------------------------------------------------------


def source_task(fresh: Any) -> Any:
    """The source task (a ``SourceTask``: batches, what it is, whether the head carries over) that the built workload
    ``fresh`` provides; refused when it provides none. The workload picks the data: only it knows what the trials
    train on, and so what is disjoint from it."""
    make = fresh.source_task
    if make is None:
        s = fresh.structure
        declared = f"declares the source task {s.source_task!r}" if s is not None and s.source_task else "declares none"
        raise ValueError(f"transfer: the workload provides no source task to pretrain on (the model's description "
                         f"{declared}); give init=PATH.pt")
    try:
        return make()
    except ValueError as exc:  # no disjoint data for this size: the workload says why, the technique says who asked
        raise ValueError(f"transfer: {exc}") from None


def pretrained(workload: str, probe: Probe, steps: float, cache_dir: Path | None
               ) -> tuple[dict[str, torch.Tensor], dict[str, Any], bool]:
    """The pretrained state dict (on the CPU), its record and whether the head is new (another label space), from
    ``cache_dir`` when it holds it; else trained now on a fresh copy of the workload (``workload``, a name for the
    cache key) on the source task the workload provides (``source_task``), and cached."""
    fresh = probe.fresh(PRETRAIN_SEED)
    task = source_task(fresh)
    source = task.info
    n_steps = max(1, math.ceil(steps * fresh.quality_steps))
    config = {"format": FORMAT, "workload": workload, "params": fresh.params, "source": source, "steps": n_steps,
              "batch": fresh.batch_size, "lr": fresh.lr, "seed": PRETRAIN_SEED,
              "dataset": fresh.dataset.get("sha256")}
    key = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir / f"pretrain-{key}.pt" if cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        return saved["state"], {**json.loads(saved["meta"]), "cached": True}, task.new_head
    started = time.perf_counter()
    loop = probe.loop(fresh, fresh.lr)
    source_batches = task.batches(fresh.batch_size, PRETRAIN_SEED)
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
    return state, {**meta, "cached": False}, task.new_head


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
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
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
        self._state, self._meta, self._new_head = pretrained(ctx.workload, probe, self.options.steps, ctx.cache_dir)
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        state = getattr(self, "_state", None)
        if state is None:
            raise RuntimeError("transfer: no pretrained checkpoint (tune() builds or loads it before the model, once)")
        s = model_structure(model, ctx)
        self._head = self.options.init is None and getattr(self, "_new_head", False)
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

