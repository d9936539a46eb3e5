"""Early stopping: end the quality run when the metric stops improving, diverges, or reaches a threshold.

Method card
- What: Lightning's ``EarlyStopping`` rules at each evaluation: stop on a non-finite metric, a threshold, or
  ``patience`` evaluations without beating the best by ``min_delta``. The report sets the metric at the stop beside
  the full run of the same seed.
- When it should pay: long runs that plateau or overfit; its saving is the budget after the stop, on any device. On
  short, noisy curves a pause mid-climb stops it: raise ``patience`` or ``min_delta`` there.
- Sources: Prechelt, "Early Stopping - But When?", 1998; PyTorch Lightning ``EarlyStopping``.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-early_stopping (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-convergence`: cnn:tiny, gpt:tiny, mlp:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

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
