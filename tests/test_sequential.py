"""The sequential design of ``--repeats auto``: repeated confidence intervals that keep their coverage over every
look, the stopping rule's error rates and decisiveness in simulation, and the engine's intervals equal to the
simulation's."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from bench.analyze import sequential, stats

CAP = 20  # a cap with room for the looks these tests make (the default, bench.plan.config.DEFAULT_MAX_REPEATS, is 8)


def _looks(sims: int, max_n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((sims, max_n))


def _covered_at_every_look(x: np.ndarray, multiplier) -> np.ndarray:
    ok = np.ones(len(x), dtype=bool)
    for n in range(sequential.MIN_LOOK, x.shape[1] + 1):
        half = multiplier(n) * x[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        ok &= np.abs(x[:, :n].mean(axis=1)) <= half
    return ok


def test_the_repeated_interval_covers_the_truth_at_every_look_where_a_fixed_t_read_at_each_does_not():
    x = _looks(20_000, CAP, seed=1)  # fresh draws, not the calibration's
    repeated = _covered_at_every_look(x, lambda n: sequential.multiplier(n, CAP)).mean()
    naive = _covered_at_every_look(x, lambda n: float(sps.t.ppf(0.975, n - 1))).mean()
    assert 0.94 <= repeated <= 0.96
    assert naive < 0.85  # "stopping once significant" with a fixed-n t interval: false verdicts inflate


def test_the_multiplier_is_wider_than_a_fixed_t_and_the_one_look_design_is_the_t_interval():
    assert sequential.multiplier(3, 3) == pytest.approx(sps.t.ppf(0.975, 2))
    for n in (3, 5, 10, 20):
        assert sequential.multiplier(n, CAP) > sps.t.ppf(0.975, n - 1)
    assert sequential.multiplier(25, CAP) == pytest.approx(sequential.multiplier(25, 25))  # past the cap


def test_the_engine_reads_the_same_interval_the_simulation_does():
    rng = np.random.default_rng(5)
    for n in (3, 7, 12):
        logs = rng.normal(0.05, 0.1, size=n)
        base = {s: 100.0 for s in range(n)}
        new = {s: 100.0 * math.exp(v) for s, v in enumerate(logs)}
        est = stats.ratio(new, base, max_looks=CAP)
        half = sequential.multiplier(n, CAP) * logs.std(ddof=1) / math.sqrt(n)
        assert math.log(est.lo) == pytest.approx(logs.mean() - half)
        assert math.log(est.hi) == pytest.approx(logs.mean() + half)


@pytest.mark.parametrize("cv", [0.02, 0.10, 0.30])
def test_no_effect_gives_at_most_two_and_a_half_percent_false_verdicts_each_way(cv):
    out = sequential.simulate(1.0, cv, CAP, sims=2000, seed=int(cv * 100))
    assert out["faster"] <= 0.025 and out["slower"] <= 0.025


def test_no_effect_on_a_quiet_machine_is_called_equivalent():
    out = sequential.simulate(1.0, 0.02, CAP, sims=2000, seed=2)
    assert out["equivalent"] >= 0.95 and out["mean_pairs"] < 9


def test_decisiveness_at_a_cap_of_twenty():
    """What the design decides within a cap of 20 pairs (``scripts/simulate_stopping_rule.py --cap 20`` prints the table). A 10% effect at 10%
    CV per trial is not among them: clearing a 5% threshold with a 95% interval needs about 95 pairs at that noise
    with any design (fixed-n power: (1.96 + 1.28)^2 x (0.141 / 0.0465)^2), so it stays inconclusive at the cap."""
    assert sequential.simulate(1.2, 0.10, CAP, seed=3)["faster"] >= 0.90
    assert sequential.simulate(1.1, 0.02, CAP, seed=4)["faster"] >= 0.99
    assert sequential.simulate(0.5, 0.30, CAP, seed=5)["slower"] >= 0.99
    ten_at_ten = sequential.simulate(1.1, 0.10, CAP, seed=6)
    assert 0.1 <= ten_at_ten["faster"] <= 0.3 and ten_at_ten["slower"] == 0.0


def test_pairs_needed_follows_the_designs_multiplier():
    # fixed design: the first m with t(m - 1) * sd / sqrt(m) <= wanted
    m = sequential.pairs_needed(4, 0.10, 0.05)
    assert sps.t.ppf(0.975, m - 1) * 0.10 / math.sqrt(m) <= 0.05 < sps.t.ppf(0.975, m - 2) * 0.10 / math.sqrt(m - 1)
    seq = sequential.pairs_needed(4, 0.06, 0.05, max_n=CAP)
    fixed = sequential.pairs_needed(4, 0.06, 0.05)
    assert CAP >= seq > fixed
    assert sequential.multiplier(seq, CAP) * 0.06 / math.sqrt(seq) <= 0.05
    assert sequential.multiplier(seq - 1, CAP) * 0.06 / math.sqrt(seq - 1) > 0.05
    assert sequential.pairs_needed(4, 0.0, 0.05) == 5  # no spread: one more
    assert sequential.pairs_needed(4, 0.10, 0.0) is None


def test_the_default_cap_keeps_the_error_rates_and_calls_a_quiet_null_equivalent():
    from bench.plan.config import DEFAULT_MAX_REPEATS

    for cv in (0.02, 0.10, 0.30):
        out = sequential.simulate(1.0, cv, DEFAULT_MAX_REPEATS, sims=2000, seed=7 + int(cv * 100))
        assert out["faster"] <= 0.025 and out["slower"] <= 0.025
    assert sequential.simulate(1.0, 0.02, DEFAULT_MAX_REPEATS, seed=8)["equivalent"] >= 0.8


def test_futility_stopping_costs_at_most_a_few_points_of_power_and_saves_pairs_on_hopeless_configurations():
    """A sweep adds no pairs to a configuration its cap could not decide even on an optimistic reading
    (``sequential.futile``). It may only turn a would-be verdict into "inconclusive": false verdicts never rise,
    decisions fall by little, and a no-effect configuration at 10% CV stops long before the cap."""
    for effect, cv, seed in ((1.2, 0.10, 3), (1.1, 0.05, 9), (1.0, 0.02, 2), (0.97, 0.02, 10)):
        plain = sequential.simulate(effect, cv, CAP, seed=seed, futility=False)
        stopped = sequential.simulate(effect, cv, CAP, seed=seed)
        for word in ("faster", "slower", "equivalent"):
            assert stopped[word] <= plain[word] and plain[word] - stopped[word] <= 0.04, (effect, cv, word)
    null = sequential.simulate(1.0, 0.10, CAP, seed=11)
    assert null["faster"] <= 0.025 and null["slower"] <= 0.025
    assert null["mean_pairs"] < 0.6 * sequential.simulate(1.0, 0.10, CAP, seed=11, futility=False)["mean_pairs"]


def test_a_report_reads_futility_with_the_simulations_rule():
    """The verdict a sweep's rounds read (``stats.verdict`` on the repeated interval) marks futile exactly what the
    simulation stops: the rule is one function for both."""
    rng = np.random.default_rng(12)
    seen = set()
    for _ in range(200):
        n = int(rng.integers(3, 8))
        logs = rng.normal(rng.uniform(-0.1, 0.1), rng.uniform(0.01, 0.3), size=n)
        est = stats.ratio({s: 100.0 * math.exp(v) for s, v in enumerate(logs)}, {s: 100.0 for s in range(n)},
                          max_looks=CAP)
        v = stats.verdict(est, 0.05, "faster", "slower")
        if v.word != stats.INCONCLUSIVE:
            continue
        mean = logs.mean()
        bound = -math.log(0.95) if mean < 0 else math.log(1.05)
        expect = sequential.futile(n, logs.std(ddof=1), abs(abs(mean) - bound), CAP)
        assert v.futile == expect
        seen.add(expect)
    assert seen == {True, False}  # both answers were exercised
