"""LR schedules: the LR of every step equals its formula, once per optimizer step, whoever owns the step."""

import math

import pytest

from bench.plan.config import Budget
from techniques.base import OptionError
from techniques.lr_schedule import LRSchedule, warmup_cosine_factor
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("lr_schedule:schedule=one_cycle", "gpt")

BUDGET = Budget(train_steps=20)  # mlp tiny: 20 planned steps at its batch of 64


def lrs_of(label, steps=20, workload="mlp"):
    loop, batches, built = build_loop(workload, label, budget=BUDGET)
    seen = []
    for _ in range(steps):
        seen.append(loop.optimizer.param_groups[0]["lr"])  # the LR the next step will use
        loop.step(next(batches))
    return seen, built.lr, loop


def test_warmup_cosine_follows_its_formula():
    seen, peak, _ = lrs_of("lr_schedule:schedule=warmup_cosine:warmup=0.2:final=0.1")
    # 20 planned steps: 4 warm-up steps to the peak, then a half cosine over the remaining 15 step intervals
    for step in (0, 1, 3, 4, 9, 12, 19):
        if step < 4:
            expected = peak * (step + 1) / 4
        else:
            expected = peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 4) / 15)))
        assert seen[step] == pytest.approx(expected, rel=1e-9), step
    assert seen[3] == pytest.approx(peak) and seen[19] == pytest.approx(0.1 * peak)


def test_one_cycle_follows_smith_and_topins_formula():
    seen, peak, _ = lrs_of("lr_schedule:schedule=one_cycle:pct_start=0.25:div_factor=10:final_div_factor=100")
    first, last = peak / 10, peak / 10 / 100
    up = 0.25 * 20 - 1  # torch's OneCycleLR: the peak is reached at step pct_start * total - 1

    def cos_anneal(a, b, frac):
        return b + (a - b) / 2 * (1 + math.cos(math.pi * frac))

    for step in (0, 2, 4, 10, 19):
        expected = cos_anneal(first, peak, step / up) if step <= up else cos_anneal(peak, last, (step - up) / (19 - up))
        assert seen[step] == pytest.approx(expected, rel=1e-9), step


def test_constant_is_the_peak_throughout():
    seen, peak, _ = lrs_of("lr_schedule:schedule=constant:peak_lr=0.01")
    assert seen == [0.01] * 20


def test_steps_once_per_optimizer_step_with_fp16_and_grad_accum():
    """fp16's scaler owns the optimizer step and grad_accum runs 2 micro-batches: the schedule still moves once
    per optimizer step (after_step), and runs past the plan at its last value."""
    seen, peak, loop = lrs_of("lr_schedule:schedule=warmup_cosine:warmup=0.2:final=0.1+fp16+grad_accum:steps=2",
                              steps=22)
    plain, _, _ = lrs_of("lr_schedule:schedule=warmup_cosine:warmup=0.2:final=0.1", steps=22)
    assert seen == pytest.approx(plain, rel=1e-12)
    assert seen[19] == seen[20] == seen[21] == pytest.approx(0.1 * peak)
    assert loop.ctx.step == 22
    tech = next(t for t in loop.techniques if t.name == "lr_schedule")
    assert len(tech.results(loop.ctx)["lr_per_step"]) == 20


def test_factor_is_exact_at_its_edges():
    assert warmup_cosine_factor(0, 10, 0.0, 0.0) == 1.0
    assert warmup_cosine_factor(9, 10, 0.0, 0.0) == pytest.approx(0.0, abs=1e-12)
    assert warmup_cosine_factor(50, 10, 0.0, 0.25) == 0.25


def test_one_cycle_with_too_few_rising_steps_says_so():
    with pytest.raises(ValueError, match="fewer than 2 rising steps"):
        lrs_of("lr_schedule:schedule=one_cycle:pct_start=0.05")  # 1 rising step of 20


def test_options_validate():
    with pytest.raises(OptionError, match="schedule"):
        LRSchedule.parse_options({"schedule": "linear"})
    with pytest.raises(OptionError, match="peak_lr"):
        LRSchedule.parse_options({"peak_lr": "-1"})
