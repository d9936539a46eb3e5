"""Statistics with exact expected values on small hand-made inputs (fixed bootstrap seed)."""

import pytest

from bench.stats import (
    Interval,
    difference_of_means,
    difference_verdict,
    ratio_of_medians,
    ratio_verdict,
    relative_iqr,
)


def test_ratio_of_medians_point_and_interval_are_exact():
    iv = ratio_of_medians([110, 112, 108], [100, 101, 99])
    assert iv.estimate == 1.1
    # percentile bootstrap over 3 x 3 values: the bounds are ratios of observed values
    assert iv.lo == pytest.approx(108 / 101) and iv.hi == pytest.approx(112 / 99)
    assert ratio_verdict(iv, 0.05, "faster", "slower") == "faster"


def test_identical_samples_are_no_significant_difference():
    iv = ratio_of_medians([100, 101, 99], [100, 101, 99])
    assert iv.estimate == 1.0 and iv.lo < 1.0 < iv.hi
    assert ratio_verdict(iv) == "no significant difference"


def test_a_change_inside_the_threshold_is_not_significant():
    iv = Interval(1.03, 1.01, 1.05, 5, 5)  # interval excludes 1, but a 3% change is below a 5% threshold
    assert ratio_verdict(iv, threshold=0.05) == "no significant difference"
    assert ratio_verdict(iv, threshold=0.0) == "higher"


def test_twenty_percent_slowdown_is_flagged():
    iv = ratio_of_medians([80, 81, 79, 80], [100, 101, 99, 100])
    assert iv.estimate == 0.8 and iv.hi < 1
    assert ratio_verdict(iv, 0.05, "faster", "slower") == "slower"


def test_single_repeat_has_no_interval():
    iv = ratio_of_medians([2.0], [1.0])
    assert iv.estimate == 2.0 and iv.lo is None
    assert ratio_verdict(iv) == "not enough repeats"


def test_difference_of_means_and_its_wording():
    iv = difference_of_means([0.8, 0.81, 0.79], [0.8, 0.8, 0.81])
    assert iv.estimate == pytest.approx(-0.01 / 3)
    assert difference_verdict(iv) == "no significant difference"
    iv = difference_of_means([0.9, 0.91, 0.92], [0.8, 0.8, 0.81])
    assert difference_verdict(iv, "better", "worse") == "better"


def test_relative_iqr():
    assert relative_iqr([1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.5 / 2.5)
    assert relative_iqr([1.0]) is None
