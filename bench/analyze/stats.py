"""The one statistics engine: the summary, the report and `bench compare` all call these functions.

Every comparison is a *contrast*: a signed sum of group means (NEW - BASE; for an interaction, a+b - a - b + base),
on log values for ratios (throughput, memory, time-to-target) and on raw values for differences (a metric). The
unit of replication is the trial (one repeat = one process = one seed): step times inside a trial are not
independent samples of the configuration.

- **Paired when the groups share keys.** Trials of different technique sets with the same seed start from the same
  initial weights and see the same batches, and in a sweep they run in the same repeat round; in `sweep --ab` the
  two sides of a trial run back to back. Values are keyed (by sweep directory, seed and repeat:
  ``bench.analyze.pairs``), and when every group has the same keys (at least two) the contrast is computed per key
  and the interval comes from the spread of those per-key contrasts. Otherwise the groups are independent samples
  and the standard errors add (Welch).
- **Student-t intervals, not a percentile bootstrap.** With 3 repeats a percentile bootstrap of a mean can never
  reach beyond the most extreme observed pair, so its "95%" interval is [min, max] of three values: under pure
  noise all three land on the same side of 1 one time in four, and such an interval covered the truth in 67% of
  simulated 3-repeat comparisons (``tests/test_stats.py`` checks both coverages). The t interval on log ratios
  (the test pyperf applies to benchmark timings) keeps its 95% at any n >= 2 when log-values are roughly normal,
  which process-to-process timing noise is.
- **One verdict function** (``verdict``), four answers: no verdict below ``MIN_REPEATS`` (the estimate is still
  shown, with the reason); a change (faster/slower, better/worse, ...) only when the whole interval lies beyond the
  threshold (``lo > 1 + t`` or ``hi < 1 - t`` for ratios, ``|.| > t`` for differences), so the data show a change at
  least that large (this second guard is what keeps an A/A comparison quiet); **equivalent** when the whole
  interval lies inside +-threshold (the data rule out a change that large: "bf16 is within 5% of fp32 here" is an
  answer); **inconclusive** otherwise, with how many pairs would decide it at the spread seen.
- **Sequential designs** (``--repeats auto``): pairs are added while a verdict is open, and the interval is then a
  repeated confidence interval (``bench.analyze.sequential``) that keeps its coverage over every look up to the cap, so
  looking after every pair does not inflate false verdicts.
- **Many comparisons** (``holm``): the quality verdicts of one report are one family, corrected by Holm's step-down
  procedure, so chance "better"/"worse" among dozens of null comparisons do not survive.
- **Overall across configurations** (``overall``): the mean of the per-configuration log-ratios (a geometric mean of
  ratios, as pyperf summarises a suite) with a stratified standard error, so a uniform slowdown too small to call in
  any one configuration is caught across them.
- **Censored medians** for time-to-target: a miss is +inf and stays in the median (AlgoPerf scores a miss as
  infinite), so a set that misses in half its seeds has an infinite median, never a flattering one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from bench.analyze import sequential

CONFIDENCE = 0.95
MIN_REPEATS = 3  # fewer values per group (or pairs): the estimate is shown, with no verdict
NOISY_IQR_OVER_MEDIAN = 0.10  # spread above this (IQR / median of per-trial values) earns a noise warning

# The smallest change that counts, by quantity (a fraction for ratios, metric units for differences). The report
# and `bench compare` both read these; `compare --threshold` and `report --threshold` override the ratio ones.
THRESHOLDS = {
    "speed": 0.05,  # throughput: the process-to-process noise of a shared 2-core machine is about this size
    "memory": 0.01,  # bytes of tracked tensors repeat exactly; 1% absorbs allocator granularity
    "time_to_target": 0.05,
    "metric": 0.0,  # a difference of the metric at equal samples: any difference the data show
}

Values = Mapping[object, float] | Sequence[float]


@dataclass(frozen=True)
class Estimate:
    """A contrast with its interval. For ratios ``value``/``lo``/``hi`` are ratios (exp of the log contrast)."""

    value: float | None
    lo: float | None
    hi: float | None
    n: int  # pairs when paired, else the smallest group's size
    paired: bool
    log: bool  # True: a ratio (geometric mean); False: a difference
    method: str  # how the interval was made, in words
    se: float | None = None  # standard error of the contrast (log scale for ratios)
    df: float | None = None  # its degrees of freedom
    max_looks: int | None = None  # a sequential design's cap: the interval is a repeated one (bench.analyze.sequential)

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None


@dataclass(frozen=True)
class Verdict:
    """The reading of an ``Estimate`` against a threshold: ``word`` is one of the caller's two words (e.g.
    faster/slower), ``EQUIVALENT``, ``INCONCLUSIVE`` or ``NONE``; ``why`` says what stood in the way of a decision;
    ``needed`` is about how many pairs (or repeats) would decide an inconclusive one at the spread seen (None when
    none would: the estimate sits on the threshold)."""

    word: str
    why: str | None = None
    needed: int | None = None
    futile: bool = False  # a sweep's cap could not decide it even on an optimistic reading (sequential.futile)

    @property
    def decided(self) -> bool:
        """A change or equivalence: an answer a user can act on."""
        return self.word not in (NONE, INCONCLUSIVE)


EQUIVALENT = "equivalent"
INCONCLUSIVE = "inconclusive"
NONE = "no verdict"
UNDECIDED = (INCONCLUSIVE, NONE)


def _keyed(values: Values) -> dict[object, float]:
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    return {k: float(v) for k, v in items if v is not None and math.isfinite(float(v))}


def _t(df: float) -> float:
    return float(sps.t.ppf(0.5 + CONFIDENCE / 2, df)) if df > 0 else math.inf


def contrast(terms: Sequence[tuple[Values, float]], log: bool, max_looks: int | None = None) -> Estimate:
    """sum(coef * mean(group)) over ``terms`` = [(values, coef), ...], with a t interval.

    ``values`` are a mapping key -> value (keys pair groups: ``bench.analyze.pairs``) or a plain sequence (never paired).
    Paired when every group is a mapping and they share at least two keys; then the contrast is formed per shared
    key (a key missing from one group, e.g. a failed trial, drops out of all). Non-finite and None values are
    dropped; with ``log`` non-positive values are an error. ``max_looks``: the pairs come from a sequential design
    with that cap, so a paired interval is the design's repeated interval (``bench.analyze.sequential``), not a fixed-n t.
    """
    groups = [(_keyed(v), float(c), isinstance(v, Mapping)) for v, c in terms]
    if any(not g for g, _, _ in groups):
        return Estimate(None, None, None, 0, False, log, "a group has no values")
    if log and any(x <= 0 for g, _, _ in groups for x in g.values()):
        raise ValueError("a ratio needs positive values on every side")
    tr = (lambda x: math.log(x)) if log else (lambda x: x)
    out = (lambda x: math.exp(x)) if log else (lambda x: x)
    common = set.intersection(*(set(g) for g, _, _ in groups)) if all(m for _, _, m in groups) else set()
    if len(common) >= 2:
        keys = sorted(common, key=str)
        per_key = np.array([sum(c * tr(g[k]) for g, c, _ in groups) for k in keys])
        n = len(per_key)
        mean = float(per_key.mean())
        se = float(per_key.std(ddof=1) / math.sqrt(n))
        if max_looks is not None and max_looks > sequential.MIN_LOOK:
            half = sequential.multiplier(n, max_looks, CONFIDENCE) * se
            method = f"repeated interval over {n} pairs (sequential design, up to {max(max_looks, n)} pairs)"
        else:
            half, method = _t(n - 1) * se, f"paired t over {n} pairs"
        return Estimate(out(mean), out(mean - half), out(mean + half), n, True, log, method, se, n - 1, max_looks)
    # Independent groups: the variances of the group means add; Welch-Satterthwaite degrees of freedom.
    arrays = [(np.array([tr(x) for x in g.values()]), c) for g, c, _ in groups]
    mean = float(sum(c * a.mean() for a, c in arrays))
    n = min(len(a) for a, _ in arrays)
    if n < 2:
        return Estimate(out(mean), None, None, n, False, log, "one value in a group: no interval")
    parts = [(c * c * a.var(ddof=1) / len(a), len(a) - 1) for a, c in arrays]
    var = sum(v for v, _ in parts)
    if var == 0:
        return Estimate(out(mean), out(mean), out(mean), n, False, log, "no spread in any group", 0.0, math.inf)
    df = var**2 / sum(v * v / d for v, d in parts if v > 0)
    half = _t(df) * math.sqrt(var)
    return Estimate(out(mean), out(mean - half), out(mean + half), n, False, log, f"Welch t, df {df:.1f}",
                    math.sqrt(var), df)


def ratio(new: Values, base: Values, max_looks: int | None = None) -> Estimate:
    """Geometric-mean ratio NEW / BASE with its interval (paired by key when both share the same keys)."""
    return contrast([(new, 1.0), (base, -1.0)], log=True, max_looks=max_looks)


def difference(new: Values, base: Values) -> Estimate:
    """Mean difference NEW - BASE with its interval (paired by key when both share the same keys)."""
    return contrast([(new, 1.0), (base, -1.0)], log=False)


def verdict(est: Estimate, threshold: float, higher: str = "higher", lower: str = "lower",
            min_repeats: int = MIN_REPEATS) -> Verdict:
    """The only verdict rule. ``higher``/``lower`` when the whole interval lies beyond ``threshold`` (ratios:
    above ``1 + threshold`` / below ``1 - threshold``; differences: beyond +-threshold); ``EQUIVALENT`` when it lies
    wholly inside (at threshold 0 only a point at "no change": identical values); ``INCONCLUSIVE`` otherwise;
    ``NONE`` below ``min_repeats`` values (or pairs) or without an interval. ``why`` gives the reason for the last two."""
    if est.value is None:
        return Verdict(NONE, est.method)
    if est.n < min_repeats:
        unit = ("pair" if est.paired else "repeat") + ("" if est.n == 1 else "s")
        return Verdict(NONE, f"{est.n} {unit}: a verdict needs {min_repeats}")
    if not est.has_interval:
        return Verdict(NONE, est.method)
    up, down = (1.0 + threshold, 1.0 - threshold) if est.log else (threshold, -threshold)
    if est.lo > up:
        return Verdict(higher)
    if est.hi < down:
        return Verdict(lower)
    if down <= est.lo and est.hi <= up:  # at threshold 0: only an interval that is the single point "no change"
        return Verdict(EQUIVALENT)
    return _inconclusive(est, threshold)


def _inconclusive(est: Estimate, threshold: float) -> Verdict:
    """Why an interval decides nothing, and about how many pairs (or repeats) would decide it at this spread."""
    tr = math.log if est.log else (lambda x: x)
    centre = tr(est.value)
    bound = math.log(1.0 + threshold) if est.log else threshold
    if est.log and centre < 0:
        bound = -math.log(1.0 - threshold)  # the lower threshold, 1 - t, is a little farther away on a log scale
    band = f"+-{threshold:.0%}" if est.log else f"+-{threshold:g}"
    wanted = abs(abs(centre) - bound)
    sd = est.se * math.sqrt(est.n) if est.se is not None else math.inf
    needed = sequential.pairs_needed(est.n, sd, wanted, est.max_looks) if wanted > 1e-12 else None
    unit = "pairs" if est.paired else "repeats"
    if threshold <= 0:
        why = "its interval includes zero"
    elif abs(centre) > bound:
        why = f"its interval reaches inside the {band} threshold"
    else:
        why = f"its interval reaches beyond the {band} threshold"
    more = (f"; about {needed} {unit} would decide it at this spread" if needed is not None else
            "; the estimate sits on the threshold, so more repeats may not decide it")
    return Verdict(INCONCLUSIVE, why + more, needed,
                   futile=bool(est.max_looks and sequential.futile(est.n, sd, wanted, est.max_looks)))


def claim_verdict(value: float | None, lo: float | None, hi: float | None, n: int | None, low: float, high: float,
                  exact: bool = False, min_repeats: int = MIN_REPEATS) -> Verdict:
    """A measurement against a published claim's range [low, high] (the claims check): ``within`` when the whole
    interval lies in the range, ``below`` / ``above`` when it lies wholly outside, ``INCONCLUSIVE`` when it reaches
    across an edge, ``NONE`` below ``min_repeats`` (unless ``exact``: counted bytes, whose interval is the point)."""
    if value is None:
        return Verdict(NONE, "not measured")
    if not exact and (n is None or n < min_repeats):
        return Verdict(NONE, f"{int(n or 0)} repeats: a verdict needs {min_repeats}")
    if lo is None or hi is None:
        return Verdict(NONE, "no interval")
    if low <= lo and hi <= high:
        return Verdict("within")
    if hi < low:
        return Verdict("below")
    if lo > high:
        return Verdict("above")
    side = "below" if value < low else "above" if value > high else "inside"
    return Verdict(INCONCLUSIVE, f"the estimate lies {side} the claimed range, but its interval reaches across the "
                                 "range's edge")


def p_value(est: Estimate, threshold: float, word: str, higher: str, lower: str) -> float | None:
    """The p-value of the decision ``word`` (the verdict's own hypothesis test), for a multiplicity correction.

    A change ``higher`` tests H0: effect <= +threshold (one-sided t on the contrast); ``lower`` the mirror;
    ``EQUIVALENT`` is two one-sided tests (TOST: the larger of the two p-values). Doubled throughout, so that p < 0.05
    exactly when the verdict's 95% interval decides. None without a standard error (no spread: the decision is exact) or for no decision.
    """
    if est.se is None or est.df is None or est.value is None:
        return None
    if est.se == 0:
        return 0.0
    centre = math.log(est.value) if est.log else est.value
    up = math.log(1.0 + threshold) if est.log else threshold
    down = math.log(1.0 - threshold) if est.log and threshold < 1 else -threshold
    df = est.df if math.isfinite(est.df) else 1e9
    if word == higher:
        return min(1.0, 2 * float(sps.t.sf((centre - up) / est.se, df)))
    if word == lower:
        return min(1.0, 2 * float(sps.t.cdf((centre - down) / est.se, df)))
    if word == EQUIVALENT:
        return min(1.0, 2 * max(float(sps.t.sf((centre - down) / est.se, df)),
                                float(sps.t.cdf((centre - up) / est.se, df))))
    return None


def holm(p_values: Sequence[float | None], alpha: float = 1.0 - CONFIDENCE, m: int | None = None) -> list[bool]:
    """Holm's step-down procedure over a family: which of the p-values (None: an exact decision that needs no test)
    keep their decision at family-wise level ``alpha``. ``m``: the family's size, when it holds more comparisons than
    the decided ones given here (an undecided comparison's p-value is above every decided one's, so it comes last in
    the step-down order and needs no number)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    keep = [True] * len(p_values)
    m, failed = max(m or 0, len(tested)), False
    for rank, (p, i) in enumerate(tested):
        failed = failed or p > alpha / (m - rank)
        keep[i] = not failed
    return keep


# ---- across configurations ----------------------------------------------------------------------------------


def overall(pairs: Sequence[tuple[Values, Values]]) -> Estimate:
    """The geometric mean over configurations of their NEW / BASE ratios, with a stratified interval.

    Each configuration contributes its mean log-ratio (paired by key where possible, as ``ratio`` does) and its
    standard error; the overall log-ratio is their mean and its variance the sum of theirs over C^2 (degrees of
    freedom by Welch-Satterthwaite). When some configuration has a single value per side (no standard error), the
    configurations themselves are the sample: a t interval over the C per-configuration log-ratios (C >= 2).
    ``n`` is the number of configurations.
    """
    logs, ses, dfs = [], [], []
    for new, base in pairs:
        est = ratio(new, base)
        if est.value is None:
            continue
        logs.append(math.log(est.value))
        ses.append(est.se)
        dfs.append(est.df)
    c = len(logs)
    if c == 0:
        return Estimate(None, None, None, 0, False, True, "no configuration measured on both sides")
    mean = float(np.mean(logs))
    if all(s is not None for s in ses):
        var = sum(s * s for s in ses) / c**2
        if var == 0:
            return Estimate(math.exp(mean), math.exp(mean), math.exp(mean), c, False, True,
                            f"stratified over {c} configurations, no spread")
        df = (sum(s * s for s in ses) ** 2) / sum(s**4 / d for s, d in zip(ses, dfs, strict=True) if s > 0)
        half = _t(df) * math.sqrt(var)
        method = f"stratified over {c} configurations (Welch-Satterthwaite df {df:.1f})"
    elif c >= 2:
        half = _t(c - 1) * float(np.std(logs, ddof=1)) / math.sqrt(c)
        method = f"t over {c} configurations (some have one repeat: their spread is the error)"
    else:
        return Estimate(math.exp(mean), None, None, c, False, True, "one configuration")
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), c, False, True, method)


# ---- censored values (time-to-target) -----------------------------------------------------------------------


def censored_median(values: Sequence[float | None]) -> float | None:
    """Median where a miss (None or +inf) counts as +inf and stays in the sample; None for no values."""
    v = [math.inf if x is None else float(x) for x in values]
    if not v:
        return None
    return float(np.median(np.array(v)))  # numpy's median of [1, inf] is inf: half missed, no finite median


def median_interval(values: Sequence[float | None], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median from order statistics: (low, high, coverage).

    With n values sorted (a miss counts as +inf), [x_(j), x_(n+1-j)] covers the median with probability
    1 - 2 P(Binomial(n, 1/2) < j); j is the largest whose coverage reaches ``confidence``. Below that many values
    (n < 6 for 95%) no order-statistic interval reaches it: the whole range is returned with its smaller coverage,
    which the caller states. Misses stay in, so a high end of +inf says the median may be a miss.
    """
    v = sorted(math.inf if x is None else float(x) for x in values)
    n = len(v)
    if n < 2:
        return None
    best_j, best_cov = 1, 1 - 2 * float(sps.binom.cdf(0, n, 0.5))
    for j in range(2, n // 2 + 1):
        coverage = 1 - 2 * float(sps.binom.cdf(j - 1, n, 0.5))  # P(Binomial(n, 1/2) < j)
        if coverage < confidence:
            break
        best_j, best_cov = j, coverage
    return v[best_j - 1], v[n - best_j], best_cov


def miss_rate(values: Sequence[float | None]) -> float | None:
    if not values:
        return None
    return sum(1 for x in values if x is None or not math.isfinite(float(x))) / len(values)


# ---- spread -------------------------------------------------------------------------------------------------


def relative_iqr(values: Sequence[float]) -> float | None:
    """IQR / median of per-trial values (None for fewer than 2)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or np.median(v) == 0:
        return None
    q75, q25 = np.percentile(v, [75, 25])
    return float((q75 - q25) / np.median(v))
