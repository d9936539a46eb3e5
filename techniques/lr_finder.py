"""LR range test: pick the learning rate from a short exponential sweep on a fresh copy of the model.

Method card
- What: before the run, a fresh copy of the model trains ``steps`` steps while the LR grows exponentially from
  ``min_lr`` to ``max_lr``; the smoothed loss picks the LR by ``rule``: ``steepest`` (fastest fall before the minimum,
  Smith's and Lightning's) or ``valley`` (fastai's: the middle of the longest fall, robust to one steep point). The
  trial then trains at it (``lr_schedule``'s peak when both are in the set). The record keeps the curve.
- When it should pay: when the default LR is far off, or when one probe serves many runs. Its time is the trial's
  one-off cost, on any device; on the tiny workloads the probe takes longer than the run it tunes, and time to target
  with one-off costs shows it.
- Sources: Smith, "Cyclical Learning Rates", WACV 2017 (arXiv:1506.01186); fastai ``LRFinder``; Lightning
  ``Tuner.lr_find``.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-lr_finder (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-convergence`: cnn:tiny, gpt:tiny, mlp:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from techniques import _reading as rd
from techniques.base import Context, Kind, Probe, ResultCurve, Technique, TrainConfig, register


@dataclass(frozen=True)
class RangeTest:
    """The curve of one LR range test and what each rule suggests."""

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    stopped_early: bool

    def suggest(self, rule: str, skip_start: int = 10, skip_end: int = 1) -> float | None:
        return steepest(self.lrs, self.smoothed, skip_start, skip_end) if rule == "steepest" else valley(
            self.lrs, self.smoothed)


def smooth(losses: list[float], beta: float) -> list[float]:
    """Bias-corrected exponential moving average (the range test's smoothing)."""
    avg, out = 0.0, []
    for i, loss in enumerate(losses, start=1):
        avg = beta * avg + (1 - beta) * loss
        out.append(avg / (1 - beta**i))
    return out


def steepest(lrs: list[float], losses: list[float], skip_start: int = 10, skip_end: int = 1) -> float | None:
    """The LR at the most negative slope of loss against log LR, between the first ``skip_start`` points and the
    loss's minimum: past the minimum the loss has diverged, and a fall after a blow-up (measured: AdamW on the MLP
    at LR 0.4) is no advice."""
    lowest = min(range(len(losses)), key=losses.__getitem__)
    lo, hi = max(skip_start, 1), min(len(lrs) - skip_end, lowest + 1)
    if hi - lo < 2:
        return None
    logs = [math.log(x) for x in lrs]
    slopes = {i: (losses[i + 1] - losses[i - 1]) / (logs[i + 1] - logs[i - 1]) for i in range(lo, hi)
              if i + 1 < len(lrs)}
    if not slopes:
        return None
    return lrs[min(slopes, key=slopes.__getitem__)]


def valley(lrs: list[float], losses: list[float]) -> float | None:
    """The middle of the valley: the longest decreasing subsequence of the loss, taken as the stretch of its length
    that ends where it ends (so a flat start before the fall does not widen it), and its middle point's LR."""
    n = len(losses)
    if n < 3:
        return None
    length = [1] * n  # the longest decreasing subsequence ending at i
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j]:
                length[i] = max(length[i], length[j] + 1)
    end = max(range(n), key=lambda i: (length[i], -i))
    start = end - length[end] + 1
    return lrs[(start + end) // 2]


def range_test(loop: Any, batches: Any, min_lr: float, max_lr: float, steps: int, beta: float,
               stop_factor: float) -> RangeTest:
    """Exponential LR sweep: step k trains at min_lr * (max_lr/min_lr)^(k/(steps-1))."""
    lrs, losses, smoothed = [], [], []
    best, avg, stopped = math.inf, 0.0, False
    for k in range(steps):
        lr = min_lr * (max_lr / min_lr) ** (k / max(steps - 1, 1))
        for group in loop.optimizer.param_groups:
            group["lr"] = lr
        loss = float(loop.step(next(batches)))
        lrs.append(lr)
        losses.append(loss)
        avg = beta * avg + (1 - beta) * loss
        current = avg / (1 - beta ** len(losses))
        smoothed.append(current)
        if not math.isfinite(current) or current > stop_factor * best:
            stopped = True
            break
        best = min(best, current)
    return RangeTest(lrs, losses, smoothed, stopped)


@register
class LRFinder(Technique):
    name = "lr_finder"
    summary = "LR range test on a fresh copy before the run (Smith 2015); the run trains at the suggested LR"
    kind = Kind.ALGORITHMIC
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "lr_finder"
    result_curve = ResultCurve(
        "lr_range", "LR range tests",
        "Smoothed training loss of each range test's exponential LR sweep on a fresh copy of the model; dotted: the "
        "LR the trial then trained with. A sweep ends early once the loss passes 4x its best.",
        key="curve", x=0, y=2, xlabel="learning rate (log scale)", ylabel="training loss (smoothed)", xlog=True,
        mark="chosen_lr")

    @dataclass(frozen=True)
    class Options:
        rule: Literal["steepest", "valley"] = "steepest"
        min_lr: float = 1e-6
        max_lr: float = 1.0
        steps: int = 100
        beta: float = 0.98  # smoothing of the loss
        stop_factor: float = 4.0  # stop the sweep once the smoothed loss exceeds this multiple of its best
        skip_start: int = 10  # steepest: points ignored at the start (the EMA is still settling)

        def __post_init__(self) -> None:
            if not 0 < self.min_lr < self.max_lr:
                raise ValueError(f"need 0 < min_lr < max_lr, got {self.min_lr} and {self.max_lr}")
            if self.skip_start < 0 or self.steps < max(10, self.skip_start + 3):
                raise ValueError(f"need skip_start >= 0 and steps >= max(10, skip_start + 3), got steps={self.steps}, "
                                 f"skip_start={self.skip_start}")
            if not 0 <= self.beta < 1 or self.stop_factor <= 1:
                raise ValueError("beta must be in [0, 1) and stop_factor > 1")

    def check(self, ctx: Context) -> str | None:
        if ctx.world_size > 1:
            return "lr_finder probes on one process; with several ranks each would find its own LR"
        return None

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        o = self.options
        fresh = probe.fresh()
        loop = probe.loop(fresh, o.min_lr, cfg.micro_batches)
        test = range_test(loop, fresh.batches(cfg.batch_size, probe.seed + 7919), o.min_lr, o.max_lr, o.steps,
                          o.beta, o.stop_factor)
        suggestions = {"steepest": test.suggest("steepest", o.skip_start), "valley": test.suggest("valley")}
        chosen = suggestions[o.rule]
        self._found = {"rule": o.rule, "suggestions": suggestions, "default_lr": cfg.lr, "chosen_lr": chosen or cfg.lr,
                       "fell_back": chosen is None, "steps": len(test.lrs), "stopped_early": test.stopped_early,
                       "curve_columns": ["lr", "loss", "smoothed"],
                       "curve": [[a, b, c] for a, b, c in zip(test.lrs, test.losses, test.smoothed, strict=True)]}
        return replace(cfg, lr=chosen) if chosen else cfg

    def results(self, ctx: Context) -> dict[str, Any] | None:
        return getattr(self, "_found", None)

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The LR the range test chose, what the other rule would have chosen, and the workload's default."""
        rule = found[0].get("rule")
        chosen = rd.values([f.get("chosen_lr") for f in found])
        other = "valley" if rule == "steepest" else "steepest"
        alt = rd.values([(f.get("suggestions") or {}).get(other) for f in found])
        fell = sum(bool(f.get("fell_back")) for f in found)
        text = (f"chosen LR ({rule} rule): {chosen}; the {other} rule would give {alt}; the workload's default "
                f"{rd.g(found[0].get('default_lr'))}")
        return text + (f"; {fell} probe(s) found no suggestion and kept the default" if fell else "")
