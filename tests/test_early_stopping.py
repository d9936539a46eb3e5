"""Early stopping: Lightning's semantics on scripted metric sequences, and a real quality run it ends early."""

import math

import pytest

from bench.trial import TrialSpec, run
from techniques.early_stopping import StopRule
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("early_stopping:patience=2", "mlp")


def feed(rule, values):
    """The 1-based evaluation at which the rule stops, or None."""
    for i, v in enumerate(values, start=1):
        if rule.update(v) is not None:
            return i
    return None


def test_stops_exactly_at_patience():
    # best 0.5 at evaluation 2, then three evaluations without improvement: stops at the third (evaluation 5)
    assert feed(StopRule(higher_is_better=True, patience=3), [0.4, 0.5, 0.5, 0.49, 0.45, 0.6]) == 5
    assert feed(StopRule(higher_is_better=False, patience=1), [2.0, 1.5, 1.6]) == 3


def test_never_stops_a_steadily_improving_run():
    assert feed(StopRule(higher_is_better=True, patience=1), [0.1 * i for i in range(1, 50)]) is None
    assert feed(StopRule(higher_is_better=False, patience=1), [10 - 0.1 * i for i in range(50)]) is None


def test_min_delta_makes_a_small_gain_count_as_none():
    rule = StopRule(higher_is_better=True, patience=2, min_delta=0.05)
    assert feed(rule, [0.50, 0.52, 0.54]) == 3  # +0.02 and +0.04 over the best 0.50: neither beats it by 0.05
    assert rule.best == 0.50


def test_stops_at_once_on_nan_or_past_the_divergence_threshold():
    assert feed(StopRule(higher_is_better=False, patience=10), [2.0, math.nan]) == 2
    assert feed(StopRule(higher_is_better=False, patience=10, divergence_threshold=5.0), [2.0, 4.0, 5.5]) == 3
    assert feed(StopRule(higher_is_better=True, patience=10, divergence_threshold=0.2), [0.3, 0.1]) == 2
    assert feed(StopRule(higher_is_better=False, patience=10, check_finite=False), [2.0, math.inf, 1.0]) is None


def test_a_non_finite_value_never_becomes_the_best():
    rule = StopRule(higher_is_better=False, patience=2, check_finite=False)
    assert feed(rule, [math.nan, 2.0, 1.9, 1.8]) is None and rule.best == 1.8


def test_stopping_threshold_stops_once_the_metric_is_better():
    assert feed(StopRule(higher_is_better=True, patience=10, stopping_threshold=0.7), [0.5, 0.7, 0.71]) == 3


@pytest.mark.parametrize("patience", [1, 2])
def test_a_quality_run_ends_early_and_the_record_says_what_it_saved(patience):
    """With a min_delta no evaluation can beat, the run stops after exactly patience + 1 evaluations."""
    spec = TrialSpec(sweep_id="t", trial_id="t", workload="mlp", size="tiny",
                     techniques=[f"early_stopping:patience={patience}:min_delta=1.0"], seed=0, repeat=0, device="cpu",
                     budget={"train_steps": 40, "eval_points": 10, "memory": False, "parity_steps": 0}, mode="quality")
    rec = run(spec)
    assert rec.status == "ok", rec.reason
    q, found = rec.quality, rec.technique_results["early_stopping"]
    assert found["stopped"] and found["evaluations"] == patience + 1
    assert q.steps_trained == 4 * (patience + 1) and q.budget_steps == 40
    assert q.stopped_by.startswith("early_stopping stopped the run")
    assert found["steps_saved_frac"] == pytest.approx(1 - q.steps_trained / 40)
    assert q.final == q.curve[-1][-1]  # the metric at its stop


def test_patience_running_out_at_the_last_evaluation_is_no_stop():
    """10 evaluations over 20 steps and patience 9: patience would run out at the last evaluation, where the budget
    ends anyway; the run is complete, not stopped, and saved nothing."""
    spec = TrialSpec(sweep_id="t", trial_id="t", workload="mlp", size="tiny",
                     techniques=["early_stopping:patience=9:min_delta=1.0"], seed=0, repeat=0, device="cpu",
                     budget={"train_steps": 20, "eval_points": 10, "memory": False, "parity_steps": 0}, mode="quality")
    rec = run(spec)
    assert rec.status == "ok", rec.reason
    assert rec.quality.stopped_by is None and rec.quality.steps_trained == 20
    found = rec.technique_results["early_stopping"]
    assert not found["stopped"] and found["evaluations"] == 9
