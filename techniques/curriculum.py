"""Curriculum learning: short sequences first (language models), or easy examples first (classifiers).

Method card
- What, sequences: a length warm-up. Over ``warmup`` of the planned steps the sequences grow linearly from ``start`` x
  the full length (Li et al. 2022; Composer's ``SeqLengthWarmup``): samples per step stay, tokens per step shrink,
  and throughput and FLOPs count the real lengths.
- What, classifiers: each example's difficulty is its loss under a scorer (the workload's model trained once per
  sweep, cached, its time reported apart); batches are drawn from the easiest examples, their pool growing to the
  whole set over ``warmup`` (Hacohen & Weinshall 2019).
- ``order``: ``easy_first``, ``hard_first`` or ``random`` (the control: same pacing, same lengths). Wu et al. 2021
  found the three often indistinguishable.
- When it should pay: early steps of a length warm-up are cheaper on any device; compare at equal samples.
- Sources: Bengio et al., "Curriculum Learning", ICML 2009; Hacohen & Weinshall, ICML 2019 (arXiv:1904.03626); Li
  et al., NeurIPS 2022 (arXiv:2108.06084); Wu et al., "When Do Curricula Work?", ICLR 2021 (arXiv:2012.03107).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-curriculum (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-convergence`: cnn:tiny, gpt:tiny, mlp:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from bench.core.files import save_torch_atomic
from techniques import _reading as rd
from techniques.base import Context, Kind, Probe, Technique, TrainConfig, register

SCORER_SEED = 10_000  # the scorer's initialisation and batch order: one scorer per workload, whatever the trial seed


def paced_fraction(step: int, warmup_steps: int, start: float) -> float:
    """Linear pacing: ``start`` at step 0, 1.0 from ``warmup_steps`` on."""
    if warmup_steps <= 0:
        return 1.0
    return start + (1.0 - start) * min(step / warmup_steps, 1.0)


def length_schedule(full: int, warmup_steps: int, start: float, step_len: int, order: str, seed: int) -> list[int]:
    """The sequence length of each warm-up step (after it: ``full``), in the chosen order."""
    lowest = min(full, max(step_len, int(start * full)))
    lengths = []
    for s in range(warmup_steps):
        wanted = lowest + (full - lowest) * s / warmup_steps
        lengths.append(min(full, max(step_len, int(wanted) // step_len * step_len)))
    if order == "hard_first":
        lengths.reverse()
    elif order == "random":
        perm = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
        lengths = [lengths[i] for i in perm]
    return lengths


def pool_order(difficulty: torch.Tensor, order: str, seed: int) -> torch.Tensor:
    """Example indices in the order the pool grows: easiest first, hardest first, or a seeded random order."""
    if order == "random":
        return torch.randperm(len(difficulty), generator=torch.Generator().manual_seed(seed))
    return torch.argsort(difficulty, descending=order == "hard_first", stable=True)


@register
class Curriculum(Technique):
    name = "curriculum"
    summary = "sequence-length warm-up (language models) or easy-first pacing by a scorer's loss (classifiers)"
    kind = Kind.ALGORITHMIC
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "curriculum"

    @dataclass(frozen=True)
    class Options:
        order: Literal["easy_first", "hard_first", "random"] = "easy_first"
        start: float = 0.125  # the first step's length (or pool) as a fraction of the full one
        warmup: float = 0.3  # fraction of the planned steps over which it grows to the full length (Composer: 0.3)
        step_len: int = 8  # sequences: lengths are multiples of this

        def __post_init__(self) -> None:
            if not 0 < self.start <= 1 or not 0 <= self.warmup <= 1:
                raise ValueError("start must be in (0, 1] and warmup in [0, 1]")
            if self.step_len < 1:
                raise ValueError(f"step_len must be >= 1, got {self.step_len}")

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        if not ctx.sequence_length:  # classifiers: score every training example once (cached per sweep)
            if ctx.world_size > 1:
                raise ValueError("curriculum on a classifier runs on one process: each rank would score the "
                                 "examples itself and could order them differently")
            self._difficulty, self._scorer, self._train_data = difficulty_scores(probe, ctx.cache_dir)
        return cfg

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        warmup_steps = math.ceil(self.options.warmup * ctx.total_steps)
        if ctx.sequence_length:
            return self._shortened(batches, ctx, warmup_steps)
        return self._paced(batches, ctx, warmup_steps)

    def _shortened(self, batches: Iterator[Any], ctx: Context, warmup_steps: int) -> Iterator[Any]:
        o = self.options
        lengths = length_schedule(ctx.sequence_length, warmup_steps, o.start, o.step_len, o.order, ctx.seed)
        self._lengths = lengths
        for x, y in batches:
            if ctx.step < len(lengths):
                n = lengths[ctx.step]
                x, y = x[:, :n], y[:, :n]
            yield x, y

    def _paced(self, batches: Iterator[Any], ctx: Context, warmup_steps: int) -> Iterator[Any]:
        x_first, _ = next(batches)  # the batch size; the trial notes the workload's first batch as its full shape
        size = len(x_first)
        x_all, y_all = self._train_data  # set by tune, which scores the examples
        order = pool_order(self._difficulty, self.options.order, ctx.seed)
        gen = torch.Generator().manual_seed(ctx.seed)
        while True:
            pool = max(size, math.ceil(len(order) * paced_fraction(ctx.step, warmup_steps, self.options.start)))
            idx = order[torch.randperm(pool, generator=gen)[:size]]
            yield x_all[idx], y_all[idx]

    def continuation_blocker(self, ctx: Context) -> str | None:
        if self.options.warmup == 0:
            return None  # no pacing: every step trains the full length or pool
        return (f"curriculum's pacing grows over {self.options.warmup:g} of the planned steps: a longer run would "
                "pace over more of them")

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        out: dict[str, Any] = {"order": o.order, "start": o.start, "warmup": o.warmup}
        if ctx.sequence_length and hasattr(self, "_lengths"):
            full, lengths, planned = ctx.sequence_length, self._lengths, ctx.total_steps
            tokens = sum(lengths) + full * max(planned - len(lengths), 0)  # per sample, over the planned steps
            out.update(full_length=full, warmup_steps=len(lengths),
                       warmup_lengths={str(n): lengths.count(n) for n in sorted(set(lengths))},
                       tokens_fraction_of_plan=tokens / (full * planned) if planned else None)
        elif hasattr(self, "_scorer"):
            out["scorer"] = self._scorer
        return out

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The lengths and steps of a sequence-length warm-up, or the pacing and the scorer that ranks difficulty
        (its cost, shared by the sweep)."""
        first = found[0]
        if "full_length" in first:
            lengths = [int(k) for k in first.get("warmup_lengths") or {}]
            if not lengths:
                return f"order {first['order']}: no length warm-up (warmup=0): every step at {first['full_length']}"
            share = first.get("tokens_fraction_of_plan")
            return (f"order {first['order']}: lengths {min(lengths)}-{max(lengths)} of {first['full_length']} over "
                    f"{first['warmup_steps']} steps" + (f"; {share:.0%} of the plan's tokens" if share is not None else ""))
        scorer = first.get("scorer") or {}
        cost = max((f.get("scorer") or {}).get("scorer_train_s") or 0 for f in found)
        return (f"order {first['order']}, pool from {first['start']:.0%} to all over {first['warmup']:.0%} of the steps; "
                f"difficulty = loss of a scorer trained {scorer.get('steps')} steps once ({rd.fmt_secs(cost)}, cached and "
                "shared by every trial of the sweep)")


def difficulty_scores(probe: Probe, cache_dir: Path | None) -> tuple[torch.Tensor, dict[str, Any], Any]:
    """Each training example's loss under the scorer (from the cache when it has them), what the scorer was, and
    the training set (inputs, labels) the losses index."""
    fresh = probe.fresh(SCORER_SEED)
    if fresh.train_data is None:
        raise ValueError("curriculum needs the workload's training set (BuiltWorkload.train_data) or sequences")
    key = hashlib.sha256(json.dumps({"dataset": fresh.dataset.get("sha256"), "params": fresh.params,
                                     "steps": fresh.quality_steps, "batch": fresh.batch_size, "lr": fresh.lr,
                                     "seed": SCORER_SEED}, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = cache_dir / f"difficulty-{key}.pt" if cache_dir else None
    if path is not None and path.exists():
        saved = torch.load(path, weights_only=True)
        return saved["scores"], {**json.loads(saved["meta"]), "cached": True}, fresh.train_data
    started = time.perf_counter()
    loop = probe.loop(fresh, fresh.lr)
    batches = fresh.batches(fresh.batch_size, SCORER_SEED)
    for _ in range(fresh.quality_steps):
        loop.step(next(batches))
    scores = per_example_loss(fresh.model, *fresh.train_data, probe.device)
    elapsed = time.perf_counter() - started
    probe.shared_s += elapsed  # paid once for the sweep: not this trial's one-off cost
    meta = {"seed": SCORER_SEED, "steps": fresh.quality_steps, "batch_size": fresh.batch_size,
            "scorer_train_s": round(elapsed, 3), "key": key,
            "loss_quantiles": [round(float(q), 4) for q in torch.quantile(scores, torch.tensor([0.1, 0.5, 0.9]))]}
    if path is not None:
        save_torch_atomic(path, {"scores": scores, "meta": json.dumps(meta)})
    return scores, {**meta, "cached": False}, fresh.train_data


@torch.no_grad()
def per_example_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device,
                     chunk: int = 500) -> torch.Tensor:
    model.eval()
    out = [F.cross_entropy(model(x[i : i + chunk].to(device)).float(), y[i : i + chunk].to(device), reduction="none")
           for i in range(0, len(x), chunk)]
    model.train()
    return torch.cat(out).cpu()
