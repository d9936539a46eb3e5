"""Learning-rate schedules: linear warm-up then cosine decay, the one-cycle policy, and a constant control.

Method card
- What: ``warmup_cosine`` (linear warm-up over ``warmup`` of the planned steps, then a half cosine to ``final`` x the
  peak), ``one_cycle`` (torch's ``OneCycleLR``) or ``constant`` (the control: "a schedule" against "another LR").
  The peak is ``peak_lr``, else the trial's LR (``lr_finder``'s when both are in the set).
- When it should pay: warm-up lets an adaptive optimizer start high; the decay lowers the final loss. Neither makes a
  step faster on any device: judge it by time to target and quality at equal samples.
- Sources: Loshchilov & Hutter, "SGDR", ICLR 2017 (arXiv:1608.03983); Goyal et al., "Accurate, Large Minibatch SGD",
  2017; Smith & Topin, "Super-Convergence", 2017 (arXiv:1708.07120).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-lr_schedule (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny no speed answer (its report.md says why), memory 1.00x equivalent.
- AMD EPYC (AVX2 only), `reports/example-cpu-convergence`: cnn:tiny, gpt:tiny, mlp:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
import math

total, warmup = len(batches), max(1, len(batches) // 10)  # the run's planned optimizer steps


def factor(step):  # linear warm-up to the peak LR, then a half cosine down to 0.1 x the peak
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
for x, y in batches:
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()  # once per optimizer step
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch

from techniques import _reading as rd
from techniques.base import Context, Kind, Technique, register


def warmup_cosine_factor(step: int, total: int, warmup: float, final: float) -> float:
    """The multiple of the peak LR at 0-based ``step`` of ``total``: linear warm-up over ``warmup`` x total steps
    (reaching the peak at the last warm-up step), then a half cosine from the peak to ``final`` at the last step."""
    warm = math.ceil(warmup * total)
    if step < warm:
        return (step + 1) / warm
    decay = max(total - 1 - warm, 1)
    progress = min((step - warm) / decay, 1.0)
    return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))


@register
class LRSchedule(Technique):
    name = "lr_schedule"
    summary = "learning-rate schedule over the planned steps: warmup_cosine, one_cycle or constant"
    kind = Kind.ALGORITHMIC
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "lr_schedule"
    owns_lr = True  # a user's own schedule is replaced, and the report says so

    @dataclass(frozen=True)
    class Options:
        schedule: Literal["warmup_cosine", "one_cycle", "constant"] = "warmup_cosine"
        peak_lr: float | None = None  # None: the trial's LR (the workload's, or lr_finder's choice)
        warmup: float = 0.1  # warmup_cosine: fraction of the planned steps spent warming up
        final: float = 0.1  # warmup_cosine: the last step's LR as a fraction of the peak
        pct_start: float = 0.3  # one_cycle: fraction of the planned steps spent rising
        div_factor: float = 25.0  # one_cycle: the first LR is peak / div_factor
        final_div_factor: float = 1e4  # one_cycle: the last LR is first LR / final_div_factor

        def __post_init__(self) -> None:
            if self.peak_lr is not None and not self.peak_lr > 0:
                raise ValueError(f"peak_lr must be > 0, got {self.peak_lr}")
            if not 0 <= self.warmup < 1 or not 0 < self.pct_start < 1:
                raise ValueError("warmup must be in [0, 1) and pct_start in (0, 1)")
            if not 0 <= self.final <= 1:
                raise ValueError(f"final must be in [0, 1], got {self.final}")
            if self.div_factor <= 0 or self.final_div_factor <= 0:
                raise ValueError("div_factor and final_div_factor must be > 0")

    def attach(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        peak = self.options.peak_lr or ctx.state["lr"]
        total = max(ctx.total_steps, 1)
        for group in optimizer.param_groups:
            group["lr"] = peak
            group.pop("initial_lr", None)
        self._total, self._peak, self._lrs = total, peak, []
        o = self.options
        if o.schedule == "one_cycle":
            if o.pct_start * total < 2:  # torch's OneCycleLR divides by (its rising steps - 1)
                raise ValueError(f"lr_schedule one_cycle: pct_start={o.pct_start:g} of {total} planned steps leaves "
                                 "fewer than 2 rising steps; raise pct_start or the steps")
            self._scheduler: Any = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=peak, total_steps=total, pct_start=o.pct_start, anneal_strategy="cos",
                div_factor=o.div_factor, final_div_factor=o.final_div_factor,
                cycle_momentum="betas" in optimizer.defaults or "momentum" in optimizer.defaults)
        elif o.schedule == "warmup_cosine":
            self._scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: warmup_cosine_factor(step, total, o.warmup, o.final))
        else:
            self._scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def after_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        if ctx.step < self._total:
            self._lrs.append(optimizer.param_groups[0]["lr"])  # the LR this step used
        if ctx.step + 1 < self._total:  # past the plan the LR stays at its last value (OneCycleLR would raise)
            self._scheduler.step()

    def continuation_blocker(self, ctx: Context) -> str | None:
        if self.options.schedule == "constant":
            return None
        return (f"lr_schedule's {self.options.schedule} schedule ends at the planned steps: a longer run would "
                "stretch it, not hold its last LR")

    def results(self, ctx: Context) -> dict[str, Any] | None:
        if not self._lrs:
            return None  # no step within the plan (a speed-only trial)
        return {"schedule": self.options.schedule, "peak_lr": self._peak, "planned_steps": self._total,
                "lr_per_step": [round(x, 10) for x in self._lrs]}

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The schedule, its peak LR and the steps it was planned over."""
        first = found[0]
        peaks = rd.values([f.get("peak_lr") for f in found])
        return f"{first['schedule']}, peak LR {peaks} over {first['planned_steps']} steps"
