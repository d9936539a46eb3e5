"""LR range test: pick the learning rate from a short exponential sweep on a fresh copy of the model.

Method card
- What: before the run, a fresh copy of the workload's model (same initial weights, its own AdamW) trains
  ``steps`` steps while the LR grows exponentially from ``min_lr`` to ``max_lr``; the loss is smoothed with an
  exponential moving average (``beta``, bias-corrected) and the sweep stops early once the smoothed loss exceeds
  ``stop_factor`` x its best (Lightning's ``early_stop_threshold``). The suggestion rule is stated and recorded:
  ``steepest`` takes the LR where the smoothed loss falls fastest against log LR before its minimum (Smith 2015;
  Lightning's default rule, which also skips the first ``skip_start`` points but searches past the minimum, where a
  loss falling back after a blow-up picked an LR of 0.43 for the MLP in our runs); ``valley`` takes the middle of
  the longest stretch over which the smoothed loss keeps falling (fastai's ``valley``, more robust to a noisy
  curve's single steep point). The trial
  then trains with that LR (constant, or as the peak of ``lr_schedule`` when both are in the set).
- Cost: the probe's wall time is a one-off cost of the trial (``build.probe_s``), counted in time-to-target with
  one-off costs. On the tiny CPU workloads the default 100-step sweep takes longer than the whole quality run's
  training, so the probe pays off only when the LR it finds beats the workload's tuned default by a lot, or when it
  is amortised over many runs: the report shows both clocks.
- The probe runs in fp32 without the set's other techniques: the LR it finds is the model's, not a precision's.
  The record keeps the whole curve (LR, raw and smoothed loss) and both rules' suggestions; the report plots it.
- Measured (AMD EPYC (AVX2 only), tiny workloads, 5 seeds, 30 evaluations; reports/example-cpu-convergence): the
  100-step sweep cost 2.0-3.8 s per trial (the training runs take 0.2-1.4 s to target), so with the probe counted
  every median time to target is later than the baseline's (e.g. cnn valley 4.17 s against 1.34 s; the report
  tests no ratio with the one-off cost included). Chosen LRs against the workloads' tuned defaults: steepest
  0.027-0.046 for cnn (default 0.002, about 15 times lower), 0.0025-0.0033 for gpt (0.003), 0.0029-0.0057 for mlp (0.002); valley
  0.0043-0.0115, 0.0012-0.0022, 0.0005-0.0029. Both rules' final metric differences are inconclusive on every
  workload; steepest missed the cnn target in 1 of 5 runs and valley the mlp target in 2 of 5 (its LRs there are
  about 3 times below the default).
- Sources: Smith, "Cyclical Learning Rates for Training Neural Networks", WACV 2017 (arXiv:1506.01186), the LR
  range test; fastai ``LRFinder`` (``valley``, ``steep`` suggestions); PyTorch Lightning ``Tuner.lr_find``.
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
