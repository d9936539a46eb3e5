"""Repeated confidence intervals: intervals that keep their coverage however often a sequential sweep looks.

``--repeats auto`` adds speed-only trials to a configuration until its speed verdict is decided, looking at the
verdict after every new pair of trials. A fixed-n t interval read at every look would cover the truth less and less
often (stopping "once significant" inflates false verdicts: with looks at n = 3..20, a nominal 95% t interval
misses at some look in about 25% of null runs). The design here is a *Pocock-type group-sequential design on the t
statistic* (Pocock 1977; Jennison & Turnbull 1989, "Interim analyses: the repeated confidence interval approach",
and their 2000 book, ch. 9): at every look n = ``MIN_LOOK`` .. ``max_n`` the interval is

    mean(log ratios) +- c_n * s_n / sqrt(n),   c_n = the t quantile with n - 1 degrees of freedom at 1 - alpha'/2,

where the per-look level alpha' is calibrated so that the probability that *any* look's interval misses the true
mean is ``1 - confidence``. Under normally distributed per-pair log ratios the joint law of the looks' t statistics
does not depend on the unknown mean or variance (the t statistic is scale-free), so alpha' is found once per
``max_n`` by simulating standard normal sequences, with a fixed seed (the same alpha' on every machine).

Why this and not an anytime-valid confidence sequence (Lai 1976's t mixture, as in Howard et al. 2021): a sweep
has a cap (``--max-repeats``), and a boundary that only has to hold up to the cap is narrower at every look. At the
cap of 20, the multiplier of s/sqrt(n) is 3.0 at n = 20 and 3.4 at n = 10, against 3.5 and 3.9 for a
mixture tuned to those n, and the design can decide at the first look (n = 3: 11.2 s/sqrt(n)) where the mixture
cannot (its interval is unbounded below n = 4 or 5). The price: the guarantee holds up to ``max_n`` looks; a resumed sweep that raises the cap recalibrates for the
new cap (a little wider at every look), and the analysis always uses the cap the sweep recorded.

The verdict (``bench.analyze.stats.verdict``) is read off these intervals exactly as off a fixed-n one; its error rates under
repeated looks are simulated in ``tests/test_sequential.py`` and by ``scripts/simulate_stopping_rule.py``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as sps

MIN_LOOK = 3  # the first look: the fewest pairs that give a verdict (bench.analyze.stats.MIN_REPEATS)
_SIMULATIONS = 100_000  # Monte Carlo error of the level: about 2% of itself
_SEED = 20261202


@functools.lru_cache(maxsize=16)
def look_level(max_n: int, confidence: float = 0.95) -> float:
    """The two-sided per-look level alpha' whose intervals at n = MIN_LOOK..max_n all cover the mean with
    probability ``confidence`` (normal per-pair values). ``max_n <= MIN_LOOK``: one look, alpha' = 1 - confidence."""
    alpha = 1.0 - confidence
    if max_n <= MIN_LOOK:
        return alpha
    # A look's interval misses when its two-sided p-value is below alpha', so the design misses when the smallest
    # p-value over the looks is: alpha' is the (1 - confidence) quantile of that minimum over the simulations.
    return float(np.quantile(_null_min_p_values(max_n), alpha))


def _null_min_p_values(max_n: int) -> np.ndarray:
    """For sequences of standard normals, the smallest two-sided t-test p-value of the running mean over the looks
    n = MIN_LOOK..max_n (in chunks to bound memory)."""
    rng = np.random.default_rng(_SEED + max_n)
    out = []
    for _ in range(_SIMULATIONS // 20_000):
        x = rng.standard_normal((20_000, max_n))
        n = np.arange(1, max_n + 1)
        csum, csq = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        mean = csum / n
        with np.errstate(invalid="ignore", divide="ignore"):
            var = (csq - n * mean * mean) / (n - 1)
            t = mean / np.sqrt(var / n)
        looks = slice(MIN_LOOK - 1, None)
        out.append((2 * sps.t.sf(np.abs(t[:, looks]), (n - 1)[looks])).min(axis=1))
    return np.concatenate(out)


def multiplier(n: int, max_n: int, confidence: float = 0.95) -> float:
    """c_n: the half-width of the repeated interval at look ``n`` in units of s / sqrt(n). A look beyond the cap
    (a sweep resumed with more pairs than it planned) is calibrated as if the cap were ``n``."""
    if n < 2:
        return math.inf
    level = look_level(max(max_n, n), confidence)
    return float(sps.t.ppf(1 - level / 2, n - 1))


def pairs_needed(n: int, sd: float, wanted: float, max_n: int | None = None, confidence: float = 0.95
                 ) -> int | None:
    """About how many pairs would bring the interval's half-width down to ``wanted`` at a per-pair standard
    deviation ``sd`` (the spread seen at ``n`` pairs), with the multiplier of the design: the repeated interval's up
    to ``max_n`` (beyond it, at the cap's per-look level), a fixed-n t interval's when ``max_n`` is None. None when no
    number would (``wanted`` <= 0: the estimate sits on a threshold) or it would take more than 100,000."""
    if wanted <= 0 or not math.isfinite(sd):
        return None
    if sd == 0:
        return n + 1
    level = look_level(max_n, confidence) if max_n else 1.0 - confidence

    def fits(m: int) -> bool:  # the half-width shrinks as m grows
        return float(sps.t.ppf(1 - level / 2, m - 1)) * sd / math.sqrt(m) <= wanted

    # t's quantile is above the normal's, so the normal's answer is a lower bound; from there a doubling step, then
    # a binary search (a few quantiles, not thousands: this runs for every inconclusive verdict of a report).
    lo = max(n + 1, math.ceil((float(sps.norm.ppf(1 - level / 2)) * sd / wanted) ** 2))
    if lo > 100_000:
        return None
    step = 1
    while not fits(lo + step - 1):
        step *= 2
        if lo + step - 1 > 100_000:
            return None
    lo, hi = lo + step // 2 if step > 1 else lo, lo + step - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


FUTILITY_MARGIN = 1.5  # standard errors of optimism: see futile


def futile(n: int, sd, wanted, max_n: int | None, confidence: float = 0.95, margin: float = FUTILITY_MARGIN
           ) -> np.ndarray:
    """Whether an inconclusive estimate could not be decided within ``max_n`` pairs even on an optimistic reading:
    the estimate ``margin`` standard errors (``sd / sqrt(n)``) farther past the threshold it must clear than the
    ``wanted`` distance seen, at the spread seen. A sweep then adds no pairs to it (futility stopping: it can only
    turn a would-be verdict into "inconclusive", never make a false one).

    Why the optimism: at 3 pairs both the spread and the distance are rough, and reading them as they fall (stopping
    when ``pairs_needed`` exceeds the cap) stopped configurations that would have been decided: in simulation at a
    cap of 20, a 20% effect at 10% CV per trial was called faster 54% of the time instead of 93%. With a margin of 1.5
    the answers stay within a point of the rule without futility in every scenario ``scripts/simulate_stopping_rule.py`` simulates, and a
    no-effect configuration at 10% CV gets about half the pairs (``scripts/simulate_stopping_rule.py``).
    Elementwise over arrays of ``sd`` and ``wanted`` (the simulation); a 0-d array for floats (a report)."""
    sd = np.asarray(sd, dtype=float)
    if not max_n or n >= max_n:
        return np.zeros(sd.shape, dtype=bool)
    reach = np.asarray(wanted) + margin * sd / math.sqrt(n)
    return np.isfinite(sd) & (multiplier(max_n, max_n, confidence) * sd / math.sqrt(max_n) > reach)


def simulate(effect: float, cv: float, max_n: int, threshold: float = 0.05, sims: int = 2000, seed: int = 0,
             confidence: float = 0.95, futility: bool = True) -> dict[str, float]:
    """The stopping rule's answers over ``sims`` simulated configurations, for docs and tests.

    Each configuration's trials have log-normal throughput noise of coefficient of variation ``cv`` on both sides
    (so a pair's log ratio has sd ``cv * sqrt(2)``) and a true ratio ``effect``; pairs are added one at a time from
    ``MIN_LOOK`` until the verdict (``bench.analyze.stats.verdict``'s rule on the repeated interval) is decided or ``max_n``
    is reached. With ``futility`` (a sweep's rule, ``bench.run.adaptive.next_round``), a configuration also stops,
    inconclusive, at a look where it is ``futile``. Returns the share of faster / slower / equivalent / inconclusive
    answers and the mean pairs used.
    """
    rng = np.random.default_rng(seed)
    d = rng.normal(math.log(effect), cv * math.sqrt(2), size=(sims, max_n))
    up, down = math.log(1 + threshold), math.log(1 - threshold)
    answer = np.full(sims, "inconclusive", dtype=object)
    used = np.full(sims, max_n)
    active = np.ones(sims, dtype=bool)
    for n in range(MIN_LOOK, max_n + 1):
        mean = d[:, :n].mean(axis=1)
        half = multiplier(n, max_n, confidence) * d[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        for word, hit in (("faster", mean - half > up), ("slower", mean + half < down),
                          ("equivalent", (mean - half > down) & (mean + half < up))):
            now = active & hit
            answer[now], used[now] = word, n
            active &= ~now
        if futility:
            bound = np.where(mean < 0, -down, up)  # as bench.analyze.stats reads it: the threshold on the mean's side
            hopeless = active & futile(n, d[:, :n].std(axis=1, ddof=1), np.abs(np.abs(mean) - bound), max_n,
                                       confidence)
            used[hopeless] = n
            active &= ~hopeless
    out = {w: float(np.mean(answer == w)) for w in ("faster", "slower", "equivalent", "inconclusive")}
    out["mean_pairs"] = float(used.mean())
    return out
