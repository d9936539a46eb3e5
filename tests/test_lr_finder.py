"""LR range test: each suggestion rule on scripted curves, the early stop, and a real probe on a fresh copy."""

import math

import pytest
import torch

from techniques.base import OptionError
from techniques.lr_finder import LRFinder, range_test, smooth, steepest, valley
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("lr_finder:steps=20", "mlp")

LRS = [1e-5 * (1e5) ** (i / 99) for i in range(100)]  # 1e-5 .. 1, log-spaced


def scripted(i):
    """Flat, a sigmoid-shaped fall steepest at point 50, a floor at 75, then a blow-up."""
    if i <= 75:
        return 2.0 - 1.0 / (1.0 + math.exp(-(i - 50) / 5))
    return scripted(75) + 0.5 * (i - 75)


def test_steepest_finds_the_fastest_fall():
    losses = [scripted(i) for i in range(100)]
    assert steepest(LRS, losses) == LRS[50]


def test_steepest_ignores_a_fall_after_the_blow_up():
    """Measured shape: the loss explodes, then falls back a little (AdamW at LR ~0.4): the steepest point of that
    fall is past the minimum and is no suggestion; the steepest point before the minimum (40) is."""
    fall = [2.0 - 1.0 / (1.0 + math.exp(-(i - 40) / 4)) for i in range(60)]
    losses = fall + [7.0 - 0.1 * k for k in range(40)]  # falls 0.1 per point: steeper than anything before
    assert steepest(LRS, losses) == LRS[40]


def test_valley_takes_the_middle_of_the_longest_fall():
    losses = [scripted(i) for i in range(100)]
    assert valley(LRS, losses) == LRS[(0 + 75) // 2]  # the sigmoid falls (slowly, then fast) from point 0 to 75
    bumpy = [3.0] * 20 + [3.0 - 0.05 * k for k in range(40)] + [5.0] * 40  # a flat start does not count
    assert valley(LRS, bumpy) == LRS[(20 + 59) // 2]  # 40 falling points end at 59


def test_smoothing_is_bias_corrected():
    assert smooth([4.0, 4.0, 4.0], 0.98) == pytest.approx([4.0, 4.0, 4.0])


class ScriptedLoop:
    """Stands in for a TrainLoop: returns a scripted loss per step (the range test only steps and sets LRs)."""

    def __init__(self, losses):
        self.optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        self.losses, self.k = losses, 0

    def step(self, batch):
        self.k += 1
        return torch.tensor(self.losses[self.k - 1])


def test_range_test_stops_once_the_loss_passes_four_times_its_best():
    losses = [1.0] * 30 + [10.0] * 70
    test = range_test(ScriptedLoop(losses), iter(lambda: None, 0), 1e-5, 1.0, 100, 0.0, 4.0)
    assert test.stopped_early and len(test.lrs) == 31  # beta 0: no smoothing; the first 10.0 is past 4 x 1.0
    assert test.lrs[0] == pytest.approx(1e-5) and test.lrs[30] == pytest.approx(LRS[30])


def test_a_real_probe_sets_the_runs_lr_and_keeps_the_curve():
    loop, _, built = build_loop("mlp", "lr_finder:steps=40:max_lr=10")
    found = _finder(loop).results(loop.ctx)
    assert found["chosen_lr"] == loop.optimizer.param_groups[0]["lr"] != built.lr
    assert found["stopped_early"]  # an LR of 10 blows AdamW up long before the 40th step
    assert len(found["curve"]) == found["steps"] < 40
    assert set(found["suggestions"]) == {"steepest", "valley"}


def _finder(loop):
    return next(t for t in loop.techniques if t.name == "lr_finder")


def test_options_validate():
    with pytest.raises(OptionError, match="min_lr"):
        LRFinder.parse_options({"min_lr": "1", "max_lr": "0.1"})
    with pytest.raises(OptionError, match="rule"):
        LRFinder.parse_options({"rule": "fastest"})
