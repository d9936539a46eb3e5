"""The statistics engine: exact values against scipy's own t procedures, the one verdict rule, the overall
verdict across configurations, censored medians, and why t intervals rather than a percentile bootstrap."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from bench.analyze import stats
from bench.analyze.stats import EQUIVALENT, INCONCLUSIVE, NONE, contrast, difference, overall, ratio, verdict
from bench.records.frame import records_frame


def test_paired_difference_matches_scipy_ttest_rel():
    new, base = {0: 3.0, 1: 5.0, 2: 6.5}, {0: 1.0, 1: 2.0, 2: 2.5}
    est = difference(new, base)
    ci = sps.ttest_rel(list(new.values()), list(base.values())).confidence_interval(0.95)
    assert est.paired and est.n == 3 and est.value == pytest.approx(3.0)
    assert (est.lo, est.hi) == pytest.approx((ci.low, ci.high))


def test_unpaired_ratio_is_welch_on_logs():
    new, base = [110.0, 120.0, 115.0, 118.0], [100.0, 104.0, 99.0]
    est = ratio(new, base)  # sequences are never paired
    ci = sps.ttest_ind(np.log(new), np.log(base), equal_var=False).confidence_interval(0.95)
    assert not est.paired and est.n == 3
    assert est.value == pytest.approx(math.exp(np.log(new).mean() - np.log(base).mean()))
    assert (math.log(est.lo), math.log(est.hi)) == pytest.approx((ci.low, ci.high))


def test_pairs_use_the_shared_keys_only():
    # seed 3 failed in BASE: the pairs are seeds 0-2; seed 3 of NEW drops out
    est = ratio({0: 110, 1: 121, 2: 99, 3: 500}, {0: 100, 1: 110, 2: 90})
    assert est.paired and est.n == 3
    assert (est.value, est.lo, est.hi) == pytest.approx((1.1, 1.1, 1.1))  # every pair is exactly 1.1
    assert verdict(est, 0.05, "faster", "slower").word == "faster"


def test_a_change_must_clear_the_threshold_with_its_whole_interval():
    est = stats.Estimate(1.03, 1.01, 1.06, 5, True, True, "hand-made")
    assert verdict(est, 0.05).word == INCONCLUSIVE  # excludes 1, but reaches the 5% threshold: neither answer
    assert verdict(est, 0.0).word == "higher"
    assert verdict(stats.Estimate(0.8, 0.7, 0.9, 3, True, True, "x"), 0.05, "faster", "slower").word == "slower"
    assert verdict(stats.Estimate(-0.02, -0.03, -0.01, 3, True, False, "x"), 0.0, "better", "worse").word == "worse"


def test_no_verdict_below_three_repeats_but_the_estimate_is_shown():
    est = ratio({0: 50.0, 1: 51.0}, {0: 100.0, 1: 101.0})
    assert est.value == pytest.approx(math.sqrt(0.5 * 51 / 101))
    v = verdict(est, 0.05, "faster", "slower")
    assert v.word == NONE and v.why == "2 pairs: a verdict needs 3"
    assert verdict(ratio([2.0], [1.0]), 0.05).word == NONE


def test_interaction_is_one_contrast_over_shared_seeds():
    # log(ab) - log(a) - log(b) + log(base): 0 when gains multiply exactly
    base = {s: 100.0 for s in range(3)}
    a, b = {s: 150.0 for s in range(3)}, {s: 200.0 for s in range(3)}
    ab = {0: 300.0, 1: 300.0, 2: 300.0}
    est = contrast([(ab, 1), (a, -1), (b, -1), (base, 1)], log=True)
    assert est.paired and est.value == pytest.approx(1.0)
    cancel = contrast([({s: 240.0 for s in range(3)}, 1), (a, -1), (b, -1), (base, 1)], log=True)
    assert cancel.value == pytest.approx(0.8)


def _fixture_configs(slowdown: float, n_configs: int = 6, repeats: int = 3, noise: float = 0.02):
    rng = np.random.default_rng(7)
    out = []
    for c in range(n_configs):
        level = 100.0 * (c + 1)
        base = {s: level * math.exp(rng.normal(0, noise)) for s in range(repeats)}
        new = {s: level * (1 - slowdown) * math.exp(rng.normal(0, noise)) for s in range(repeats)}
        out.append((new, base))
    return out


def test_a_uniform_slowdown_is_caught_overall_though_no_configuration_alone_is():
    configs = _fixture_configs(0.08)
    alone = [verdict(ratio(n, b), 0.05, "faster", "slower").word for n, b in configs]
    assert alone.count("slower") < len(configs)  # some configurations alone are inconclusive
    est = overall(configs)
    assert est.n == 6 and est.value == pytest.approx(0.92, abs=0.015)
    assert verdict(est, 0.05, "faster", "slower").word == "slower"
    same = [(b, dict(b)) for _, b in configs]  # identical records on both sides
    est = overall(same)
    assert est.value == pytest.approx(1.0) and verdict(est, 0.05, "faster", "slower").word == EQUIVALENT


def test_overall_with_one_repeat_per_configuration_uses_the_configurations_as_the_sample():
    configs = [({0: 77.0 * (1 + 0.01 * c)}, {0: 100.0 * (1 + 0.01 * c)}) for c in range(4)]  # 23% slower, each
    est = overall(configs)
    assert "t over 4 configurations" in est.method and est.value == pytest.approx(0.77)
    assert verdict(est, 0.05, "faster", "slower").word == "slower"


def test_censored_median_and_miss_rate():
    assert stats.censored_median([3.0, 1.0, None]) == 3.0  # the miss is +inf and stays in the sample
    assert stats.censored_median([1.0, None, math.inf]) == math.inf
    assert stats.censored_median([]) is None
    assert stats.miss_rate([1.0, None, math.inf, 2.0]) == 0.5


def test_relative_iqr():
    assert stats.relative_iqr([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.5 / 2.5)
    assert stats.relative_iqr([1.0]) is None


def test_t_interval_keeps_its_coverage_at_three_pairs_where_a_percentile_bootstrap_does_not():
    """Why the engine uses t: 3 paired log-ratios with normal noise, true ratio 1. The paired t interval covers
    the truth ~95% of the time; the percentile bootstrap of the mean (enumerated exactly over its 27 resamples)
    cannot reach beyond the extreme pairs and covers far less."""
    rng = np.random.default_rng(0)
    sims, n = 4000, 3
    samples = rng.normal(0.0, 0.1, size=(sims, n))
    t = sps.t.ppf(0.975, n - 1)
    half = t * samples.std(axis=1, ddof=1) / math.sqrt(n)
    t_cover = np.mean(np.abs(samples.mean(axis=1)) <= half)
    idx = np.array(list(itertools.product(range(n), repeat=n)))  # all 27 equally likely resamples
    means = samples[:, idx].mean(axis=2)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=1)
    boot_cover = np.mean((lo <= 0) & (0 <= hi))
    assert 0.93 < t_cover < 0.97
    assert boot_cover < 0.85


def test_the_report_and_compare_read_their_verdicts_from_this_one_function(monkeypatch):
    from bench.analyze import analysis, compare
    from tests.records import record

    monkeypatch.setattr(stats, "verdict", lambda est, threshold, higher="higher", lower="lower", min_repeats=3:
                        stats.Verdict("sentinel"))
    base = [record(seed=i, sps=100.0 + i, final=0.8) for i in range(3)]
    new = [record("bf16", seed=i, sps=50.0 + i, final=0.8) for i in range(3)]
    configs = analysis.configurations(records_frame(base + new)).set_index("technique")
    assert {configs.loc["bf16", c] for c in ("speedup_verdict", "mem_ratio_verdict", "delta_verdict")} <= {
        "sentinel", None}
    assert configs.loc["bf16", "speedup_verdict"] == "sentinel"
    rows, _, _ = compare.compare_records(base, [record(seed=i, sps=50.0 + i, final=0.8) for i in range(3)])
    assert rows[0].throughput.verdict == "sentinel" and rows[0].metric.verdict == "sentinel"


def test_equivalent_when_the_whole_interval_lies_inside_the_threshold_and_never_at_threshold_zero():
    est = stats.Estimate(0.97, 0.96, 0.99, 3, True, True, "hand-made")  # the Intel machine's compile cell
    assert verdict(est, 0.05, "faster", "slower").word == EQUIVALENT
    assert verdict(est, 0.0, "faster", "slower").word == "slower"  # at threshold 0 the same interval is a change
    diff = stats.Estimate(0.002, -0.004, 0.008, 3, True, False, "hand-made")
    assert verdict(diff, 0.01, "better", "worse").word == EQUIVALENT
    assert verdict(diff, 0.0, "better", "worse").word == INCONCLUSIVE  # no margin: never equivalent


def test_an_inconclusive_verdict_says_how_many_pairs_would_decide_it():
    # 1.10x with a half-width of 0.10 on the log scale at 3 pairs: to clear 1.05 it must shrink to ~0.046
    est = stats.Estimate(1.10, 1.10 * math.exp(-0.10), 1.10 * math.exp(0.10), 3, True, True, "hand-made")
    v = verdict(est, 0.05, "faster", "slower")
    assert v.word == INCONCLUSIVE and not v.decided
    assert v.needed is None  # no standard error in a hand-made estimate: the spread is unknown
    est = stats.Estimate(1.10, 1.10 * math.exp(-0.10), 1.10 * math.exp(0.10), 3, True, True, "hand-made",
                         se=0.10 / sps.t.ppf(0.975, 2), df=2)
    v = verdict(est, 0.05, "faster", "slower")
    want = math.log(1.10) - math.log(1.05)
    sd = est.se * math.sqrt(3)
    assert sps.t.ppf(0.975, v.needed - 1) * sd / math.sqrt(v.needed) <= want
    assert f"about {v.needed} pairs" in v.why and "inside the +-5% threshold" in v.why
    on_edge = stats.Estimate(1.05, 1.0, 1.1025, 3, True, True, "hand-made")
    assert verdict(on_edge, 0.05).needed is None and "sits on the threshold" in verdict(on_edge, 0.05).why


def test_p_values_agree_with_the_interval_the_verdict_was_read_from():
    rng = np.random.default_rng(3)
    for _ in range(200):
        base = {s: 100.0 * math.exp(rng.normal(0, 0.05)) for s in range(4)}
        new = {s: base[s] * math.exp(rng.normal(rng.uniform(-0.15, 0.15), 0.03)) for s in range(4)}
        est = ratio(new, base)
        v = verdict(est, 0.05, "faster", "slower")
        p = stats.p_value(est, 0.05, v.word, "faster", "slower")
        if v.decided:
            assert p < 0.05 + 1e-9
        else:
            assert p is None


def test_holm_keeps_strong_decisions_and_drops_the_weak_ones_of_a_large_family():
    assert stats.holm([0.001, 0.04]) == [True, True]  # 0.001 <= 0.05/2, then 0.04 <= 0.05/1
    assert stats.holm([0.001, 0.04, None], m=3) == [True, False, True]  # 0.04 > 0.05/2; None: an exact decision
    assert stats.holm([0.01, 0.02]) == [True, True]  # 0.01 <= 0.025, then 0.02 <= 0.05
    assert stats.holm([0.04], m=30) == [False]  # one chance "better" among 30 comparisons
    assert stats.holm([0.0001], m=30) == [True]


def test_a_chance_better_among_thirty_null_comparisons_is_no_verdict_after_the_correction():
    """30 null quality comparisons (3 seeds each): uncorrected, about 1.5 are "better" or "worse" by chance;
    Holm's correction leaves the family-wise rate at 5%."""
    rng = np.random.default_rng(11)
    chance, reports_with_one, runs = 0, 0, 500
    for _ in range(runs):
        words, ps = [], []
        for _c in range(30):
            base = {s: rng.normal(0.8, 0.02) for s in range(3)}
            new = {s: base[s] + rng.normal(0, 0.01) for s in range(3)}
            est = difference(new, base)
            v = verdict(est, 0.0, "better", "worse")
            words.append(v.word)
            ps.append(stats.p_value(est, 0.0, v.word, "better", "worse") if v.decided else None)
        decided = [p for p in ps if p is not None]
        chance += len(decided)
        reports_with_one += any(stats.holm(decided, m=30))
    assert 1.2 < chance / runs < 1.8  # 30 x 5%: a report without the correction has one or two
    assert reports_with_one / runs <= 0.07  # family-wise 5% (+2 standard errors of 500 simulated reports)


def test_a_sequential_design_widens_the_paired_interval_to_its_repeated_one():
    new, base = {s: 100.0 + s for s in range(5)}, {s: 100.0 + 0.9 * s for s in range(5)}
    fixed, seq = ratio(new, base), ratio(new, base, max_looks=10)
    assert seq.value == pytest.approx(fixed.value) and seq.se == pytest.approx(fixed.se)
    t = sps.t.ppf(0.975, 4)
    assert math.log(fixed.hi / fixed.value) == pytest.approx(t * fixed.se)
    from bench.analyze import sequential
    assert math.log(seq.hi / seq.value) == pytest.approx(sequential.multiplier(5, 10) * seq.se)
    assert "sequential design" in seq.method and seq.max_looks == 10
