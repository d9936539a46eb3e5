"""Early stopping: end the quality run when the workload's metric stops improving, diverges, or reaches a threshold.

Method card
- What: at every evaluation of the quality run the workload's held-out metric is checked, with PyTorch Lightning's
  ``EarlyStopping`` semantics: ``check_finite`` stops at once on NaN/inf; ``stopping_threshold`` stops once the
  metric is better than that; ``divergence_threshold`` stops once it is worse than that; otherwise an evaluation
  improves when it beats the best so far by more than ``min_delta`` (in the metric's direction, taken from the
  workload), and ``patience`` evaluations in a row without improvement stop the run. Patience counts evaluations,
  not steps (the quality run evaluates ``eval_points`` times over its budget).
- What it reports: where it stopped (step, samples, evaluation), why, and the samples and training time it did not
  spend against the full budget; the report sets the metric at its stop beside the full run of the same seed (the
  baseline trial of that seed), so what it gave up is paired seed by seed.
- When it helps: long runs that plateau or overfit, where the last evaluations buy nothing. It never makes a step
  faster and cannot reach a target sooner than the same run without it: its saving is the budget after the stop.
  On the tiny CPU workloads (150 steps, 10 evaluations) the metric still improves at the end of the budget for
  most seeds, so expect it to stop rarely, or to stop on noise and give up quality: the numbers say which.
- Measured (AMD EPYC (AVX2 only), tiny workloads, 5 seeds, 30 evaluations; reports/example-cpu-convergence): with
  the default patience of 3 evaluations (15 steps apart) it stopped 5/5 cnn and 5/5 mlp runs, saving 13-70% of the
  steps; the accuracy at the stop against the full run of the same seed is inconclusive (cnn -0.034 [-0.092,
  +0.025], mlp -0.076 [-0.191, +0.039]), and 4/5 cnn runs stopped before the target. The tiny curves are noisy
  enough for three evaluations without a new best to happen mid-climb: raise patience or min_delta for short runs.
- Sources: Prechelt, "Early Stopping - But When?", in Neural Networks: Tricks of the Trade, 1998; PyTorch Lightning
  ``lightning.pytorch.callbacks.EarlyStopping`` (monitor, min_delta, patience, mode, stopping_threshold,
  divergence_threshold, check_finite).

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
import math

patience, best, wait = 3, math.inf, 0  # stop after 3 evaluations without a new best (a lower validation loss)
for step, (x, y) in enumerate(batches):
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if step % 2 == 1:  # every evaluation
        metric = evaluate(model)
        if not math.isfinite(metric):
            break  # diverged
        best, wait = (metric, 0) if metric < best else (best, wait + 1)
        if wait >= patience:
            break
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from techniques import _reading as rd
from techniques.base import Context, Kind, Technique, register


@dataclass
class StopRule:
    """Lightning's early-stopping decision on a sequence of metric values (pure: testable on scripted values)."""

    higher_is_better: bool
    min_delta: float = 0.0
    patience: int = 3
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    check_finite: bool = True
    best: float | None = None
    wait: int = 0
    seen: list[float] = field(default_factory=list)

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b

    def update(self, value: float) -> str | None:
        """Record one evaluation; the reason to stop now, or None to go on."""
        self.seen.append(value)
        if self.check_finite and not math.isfinite(value):
            return f"the metric is {value}: not finite"
        if self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            return f"the metric {value:.4g} reached stopping_threshold={self.stopping_threshold:g}"
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            return f"the metric {value:.4g} is worse than divergence_threshold={self.divergence_threshold:g}"
        shifted = value - self.min_delta if self.higher_is_better else value + self.min_delta
        if math.isfinite(value) and (self.best is None or self._better(shifted, self.best)):
            self.best, self.wait = value, 0
            return None
        self.wait += 1
        if self.wait >= self.patience:
            return (f"no improvement over {self.best:.4g} by more than min_delta={self.min_delta:g} in "
                    f"{self.wait} evaluations (patience={self.patience})")
        return None


@register
class EarlyStopping(Technique):
    name = "early_stopping"
    summary = "stop the quality run when the metric stops improving (Lightning's EarlyStopping semantics)"
    kind = Kind.ALGORITHMIC
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "early_stopping"

    @dataclass(frozen=True)
    class Options:
        patience: int = 3  # evaluations without improvement before stopping
        min_delta: float = 0.0  # an improvement must beat the best by more than this
        mode: Literal["auto", "min", "max"] = "auto"  # auto: the workload metric's direction
        stopping_threshold: float | None = None  # stop once the metric is better than this
        divergence_threshold: float | None = None  # stop once the metric is worse than this
        check_finite: bool = True  # stop at once on a NaN or infinite metric

        def __post_init__(self) -> None:
            if self.patience < 1:
                raise ValueError(f"patience must be >= 1, got {self.patience}")
            if not self.min_delta >= 0:
                raise ValueError(f"min_delta must be >= 0, got {self.min_delta}")

    def _rule(self, ctx: Context) -> StopRule:
        rule = ctx.state.get("early_stopping")
        if rule is None:
            o = self.options
            higher = ctx.higher_is_better if o.mode == "auto" else o.mode == "max"
            rule = ctx.state["early_stopping"] = StopRule(higher, o.min_delta, o.patience, o.stopping_threshold,
                                                          o.divergence_threshold, o.check_finite)
        return rule

    def on_eval(self, metrics: dict[str, float], ctx: Context) -> bool:
        rule = self._rule(ctx)
        reason = rule.update(metrics[ctx.metric])
        if reason is not None:
            ctx.state["early_stopping_stop"] = {"reason": reason, "step": ctx.step, "evaluation": len(rule.seen)}
        return reason is not None

    def continuation_blocker(self, ctx: Context) -> str | None:
        stop = ctx.state.get("early_stopping_stop")
        if stop is None:
            return None  # not stopped: training on keeps watching the metric, and may stop there
        return f"early_stopping stopped the run at step {stop['step']} ({stop['reason']}): it ends where it stopped"

    def results(self, ctx: Context) -> dict[str, Any] | None:
        rule, stop = self._rule(ctx), ctx.state.get("early_stopping_stop")
        if not rule.seen:
            return None  # no quality run: nothing was judged
        out: dict[str, Any] = {"monitor": ctx.metric, "higher_is_better": rule.higher_is_better,
                               "evaluations": len(rule.seen), "best": rule.best, "stopped": stop is not None}
        if stop is not None:
            out.update(stop)
            if ctx.total_steps and stop["step"] <= ctx.total_steps:  # not a stop in a continuation past the plan
                out["steps_saved_frac"] = 1 - stop["step"] / ctx.total_steps
        return out

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """How many runs stopped early and the share of the planned steps they saved."""
        ran = [f for f in found if f.get("evaluations")]
        if not ran:
            return "no evaluation in these trials (speed only): nothing to stop"
        stopped = [f for f in ran if f.get("stopped")]
        if not stopped:
            return f"never stopped ({len(ran)} runs): the metric kept improving within the patience"
        saved = rd.values([f.get("steps_saved_frac") for f in stopped])
        return f"stopped {len(stopped)}/{len(ran)} runs, saving {saved} of the planned steps"
