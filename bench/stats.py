"""Statistics shared by the report and `bench compare`: bootstrap intervals and the wording of verdicts.

The unit of replication is the trial (one repeat = one process = one seed): per-step times inside a trial are not
independent samples of the configuration, so intervals resample trials. With few repeats the intervals are wide,
and the wording says "no significant difference" rather than inventing precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
N_RESAMPLES = 4000
NOISY_IQR_OVER_MEDIAN = 0.10  # spread above this (IQR / median of per-trial values) earns a noise warning


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval; ``lo``/``hi`` are None when it cannot be estimated."""

    estimate: float
    lo: float | None
    hi: float | None
    n_a: int
    n_b: int

    def excludes(self, value: float) -> bool:
        return self.lo is not None and self.hi is not None and (self.lo > value or self.hi < value)


def _bootstrap(a: np.ndarray, b: np.ndarray, statistic, seed: int) -> tuple[float | None, float | None]:
    if len(a) < 2 or len(b) < 2:
        return None, None
    if np.all(a == a[0]) and np.all(b == b[0]):  # degenerate: every resample gives the same value
        value = float(statistic(a, b, axis=-1))
        return value, value
    res = sps.bootstrap(
        (a, b),
        statistic,
        n_resamples=N_RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        paired=False,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def ratio_of_medians(a: Sequence[float], b: Sequence[float], seed: int = 0) -> Interval:
    """median(a) / median(b) with a percentile-bootstrap interval, resampling each side independently."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("ratio_of_medians needs at least one value on each side")

    def stat(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(p, axis=axis) / np.median(q, axis=axis)

    lo, hi = _bootstrap(x, y, stat, seed)
    return Interval(float(np.median(x) / np.median(y)), lo, hi, len(x), len(y))


def difference_of_means(a: Sequence[float], b: Sequence[float], seed: int = 0) -> Interval:
    """mean(a) - mean(b) with a percentile-bootstrap interval (accuracy deltas)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("difference_of_means needs at least one value on each side")

    def stat(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(p, axis=axis) - np.mean(q, axis=axis)

    lo, hi = _bootstrap(x, y, stat, seed)
    return Interval(float(np.mean(x) - np.mean(y)), lo, hi, len(x), len(y))


def ratio_verdict(iv: Interval, threshold: float = 0.0, higher: str = "higher", lower: str = "lower") -> str:
    """Wording for a ratio: ``higher``/``lower`` only when the interval excludes 1 and the change is at least
    ``threshold`` (a fraction, 0.05 = 5%); otherwise "no significant difference"."""
    if iv.lo is None or iv.hi is None:
        return "not enough repeats"
    if iv.excludes(1.0) and abs(iv.estimate - 1.0) >= threshold:
        return higher if iv.estimate > 1.0 else lower
    return "no significant difference"


def difference_verdict(iv: Interval, higher: str = "higher", lower: str = "lower") -> str:
    if iv.lo is None or iv.hi is None:
        return "not enough repeats"
    if iv.excludes(0.0):
        return higher if iv.estimate > 0 else lower
    return "no significant difference"


def relative_iqr(values: Sequence[float]) -> float | None:
    """IQR / median of per-trial values (None for fewer than 2)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or np.median(v) == 0:
        return None
    q75, q25 = np.percentile(v, [75, 25])
    return float((q75 - q25) / np.median(v))
