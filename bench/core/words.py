"""Every word trainbench uses for an answer, defined once, and ``say``, the one function that writes one.

The statistics engine (``bench.analyze.stats.verdict``) decides; these are the words a person reads for what it
decided, wherever they read it: the terminal, summary.md, the report, ``bench compare``, ``bench reproduce``, tune's
report, the findings and the docs tables. They live at the bottom layer so that every layer that phrases an answer
(the analysis's findings, the report's cells) says it with ``say``; ``marked()`` makes ``say`` bracket each word
(``⟦faster⟧``), which is how ``tests/test_one_voice.py`` proves that no other code words an answer. A word means one
thing everywhere: "inconclusive" is always "the data reach across a threshold's edge", never "too few data" (that is
"no verdict") nor "the check has no power" (that is "no power"). docs/methodology.md's glossary is generated from
``glossary()``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Word:
    """A word as a person reads it, what it means, and the tone the HTML colours it (good, bad, warn, muted)."""

    text: str
    means: str
    tone: str = ""


def _w(text: str, means: str, tone: str = "") -> Word:
    return Word(text, means, tone)


_CHANGE = ("the whole 95% interval of the {what} lies {side} the threshold ({threshold}), so the data show a change at "
           "least that large")

# The answers to "is it different?", by quantity. The keys are the engine's words (``stats.verdict``'s higher and
# lower, or the shared ones); the three shared answers mean the same for every quantity.
SHARED = {
    "equivalent": _w("equivalent", "the whole 95% interval lies inside plus or minus the threshold: the data rule out "
                                   "a change that large"),
    "inconclusive": _w("inconclusive", "the 95% interval reaches across a threshold's edge: neither a change nor "
                                       "equivalence is shown by these pairs; the cell says about how many pairs would "
                                       "decide it", "muted"),
    "no verdict": _w("no verdict", "fewer than 3 pairs, or no interval: the estimate is shown and nothing is decided",
                     "muted"),
    "unequal resources": _w("unequal resources", "the set ran on more (or fewer) cores or devices than the "
                                                 "reference: its throughput ratio is shown but counts as no speedup, "
                                                 "and its ratio per core (per device) is judged instead", "warn"),
}
CHANGES = {
    "faster": _w("faster", _CHANGE.format(what="throughput ratio", side="above 1 +", threshold="5% unless set"),
                 "good"),
    "slower": _w("slower", _CHANGE.format(what="throughput ratio", side="below 1 -", threshold="5% unless set"), "bad"),
    "less": _w("less", _CHANGE.format(what="peak-memory ratio", side="below 1 -", threshold="1%"), "good"),
    "more": _w("more", _CHANGE.format(what="peak-memory ratio", side="above 1 +", threshold="1%"), "bad"),
    "sooner": _w("sooner", _CHANGE.format(what="time-to-target ratio", side="below 1 -", threshold="5%"), "good"),
    "later": _w("later", _CHANGE.format(what="time-to-target ratio", side="above 1 +", threshold="5%"), "bad"),
    "higher": _w("higher", _CHANGE.format(what="difference", side="above", threshold="a margin or zero")),
    "lower": _w("lower", _CHANGE.format(what="difference", side="below", threshold="minus a margin or zero")),
    "better": _w("better", _CHANGE.format(what="metric difference", side="beyond", threshold="the workload's margin")
                 + ", in the metric's good direction", "good"),
    "worse": _w("worse", _CHANGE.format(what="metric difference", side="beyond", threshold="the workload's margin")
                + ", in the metric's bad direction", "bad"),
}
ANSWERS = {**CHANGES, **SHARED}

# Qualities of an answer.
FUTILE = _w("futile", "an inconclusive comparison that the sequential design's cap of pairs could not decide even on "
                      "an optimistic reading of its spread: more of the same pairs would not help")

# An exact set's quality: exact techniques must reproduce the reference's eval curve.
SAME = _w("same", "an exact set whose eval curves match the reference's seed by seed, within 1% of the range the "
                  "reference's metric covered", "good")
SAME_NOISE = _w("same within noise", "an exact set whose eval curves drift apart by floating-point rounding: its first "
                                     "steps match the reference (parity ok) and its final metric is equivalent or "
                                     "its difference includes zero", "good")
BY_DESIGN = _w("differs by design", "a technique exact elsewhere that is not exact on this model for a known reason "
                                    "(the parity note names it: gradient accumulation with BatchNorm)", "warn")
DRIFT_CHANGES = _w("drift changes quality", "an exact set whose first steps match the reference but whose final "
                                            "metric differs: rounding amplified into a real difference", "warn")
UNVERIFIED = _w("unverified drift", "an exact set whose curves drift apart without parity or a quality verdict to "
                                    "tell rounding from a real change", "warn")

# Parity: the first optimizer steps against the eager fp32 reference.
PARITY = {
    "ok": _w("ok", "the first optimizer steps match the eager fp32 reference within tolerances calibrated on a harmless "
                   "perturbation, and the check has power (a 10% learning-rate bug would exceed them)", "good"),
    "mismatch": _w("mismatch", "a check with power is exceeded: the set does not compute what the reference does",
                   "bad"),
    "inconclusive": _w("no power", "the check cannot separate a 10% learning-rate bug from harmless drift on this "
                                   "model: it says nothing either way", "warn"),
}

# A measurement against a published claim's range.
CLAIMS = {
    "within": _w("within the claim", "the whole 95% interval lies inside the published range", "good"),
    "below": _w("below the claim", "the whole 95% interval lies below the published range"),
    "above": _w("above the claim", "the whole 95% interval lies above the published range"),
}

# A combination's speedup against the product of its parts'.
COMBINATION = {
    "consistent with multiplying": _w("consistent with multiplying", "the interval of observed / product contains 1: "
                                                                     "no departure from multiplying is shown"),
    "gains partly cancel": _w("gains partly cancel", "the whole interval of observed / product lies below 1", "warn"),
    "more than multiplicative": _w("more than multiplicative", "the whole interval of observed / product lies above 1",
                                   "good"),
}

# Two runs of the same sweep, or two sweeps, compared.
NOT_COMPARABLE = _w("not comparable", "the two sides trained different numbers of samples, so their metrics are not "
                                      "compared", "muted")
REPRODUCE = {
    "reproduced": _w("reproduced", "the new run's throughput is equivalent to the committed run's: the whole 95% "
                                   "interval of new / committed lies inside plus or minus the threshold", "good"),
    "differs": _w("differs", "the new run is faster or slower than the committed run: the whole interval lies beyond "
                             "the threshold", "bad"),
    "cannot tell": _w("cannot tell", "the comparison of the two runs is inconclusive or has no verdict: these pairs "
                                     "neither show a difference nor rule one out", "muted"),
}

# tune and the cost section.
INFEASIBLE = _w("infeasible", "a set whose measured peak memory exceeds --memory-limit", "bad")
NO_SAVING = _w("no saving shown", "no set's speedup cleared the threshold with 95% confidence, so no set is named "
                                  "cheaper", "muted")

# Terms a newcomer meets in every report (not answers, but read beside them).
TERMS = {
    "reference": "the set every other set of a workload is compared with (baseline: plain fp32 training unless "
                 "--baseline says otherwise)",
    "pair": "a trial of a set and a trial of the reference with the same seed and repeat: same initial weights, same "
            "batches, run in the same round; ratios and differences are taken per pair",
    "one-off": "what a set pays once, not every step: torch.compile's compilation (the first step's excess over a "
               "steady step) and a technique's probes (an LR range test, a batch search)",
    "RSS": "resident set size: the memory the process holds, as the operating system counts it",
    "curves identical": "an exact set's eval curve equals the reference's at every evaluation, seed by seed",
    "Holm's correction": "the quality answers of one report are corrected for their number (Holm's step-down "
                         "procedure): a decision whose p-value does not survive it is shown as inconclusive, with "
                         "its p-value alone",
}


def glossary() -> list[Word]:
    """Every word above, answers first, then the terms, each with what it means."""
    return [*ANSWERS.values(), FUTILE, SAME, SAME_NOISE, BY_DESIGN, DRIFT_CHANGES, UNVERIFIED,
            *PARITY.values(), *CLAIMS.values(), *COMBINATION.values(), NOT_COMPARABLE, *REPRODUCE.values(),
            INFEASIBLE, NO_SAVING, *(Word(term, means) for term, means in TERMS.items())]


def definition(word: Word) -> str:
    """What ``word`` means, every other answer word in it said (a definition leans on the words defined beside
    it: "cannot tell" is "inconclusive or no verdict")."""
    answers = sorted({w.text for w in glossary() if w.text not in TERMS and w.text != word.text
                      and " " in w.text or w.text in _DISTINCT}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, answers)) + r")(?![\w-])")
    return pattern.sub(lambda m: say(Word(m.group(1), "")), word.means)


# Answer words that are not also everyday English ("more", "same", "ok", "lower" are): where a definition names one,
# it is the answer.
_DISTINCT = {"faster", "slower", "equivalent", "inconclusive", "futile", "mismatch", "sooner", "reproduced"}


# ---- saying a word --------------------------------------------------------------------------------------------

MARK_OPEN, MARK_CLOSE = "\u27e6", "\u27e7"  # ⟦ ⟧: never in a record, a number or a word of ours
_marking: ContextVar[bool] = ContextVar("marking", default=False)
NONE = "no verdict"  # the engine's answer without a decision (bench.analyze.stats.NONE)
UNEQUAL = "unequal resources"  # a throughput ratio across unequal cores or devices: no speedup, its per-unit one is


@contextmanager
def marked() -> Iterator[None]:
    """Within the block every word ``say`` writes is bracketed: what the one-voice test reads."""
    token = _marking.set(True)
    try:
        yield
    finally:
        _marking.reset(token)


def word_of(answer: str | Word | None, family: Mapping[str, Word] | None = None) -> Word:
    """The ``Word`` for an engine's answer (None: no verdict) in ``family`` (default: the answers to "is it
    different?"); an answer no family holds stands for itself (a technique's own words, never a verdict)."""
    if isinstance(answer, Word):
        return answer
    key = answer or NONE
    return (family or ANSWERS).get(key) or SHARED.get(key) or Word(str(answer), "")


def say(answer: str | Word | None, family: Mapping[str, Word] | None = None) -> str:
    """The word a person reads for an answer: the only way an answer becomes text."""
    text = word_of(answer, family).text
    return f"{MARK_OPEN}{text}{MARK_CLOSE}" if _marking.get() else text


def tone(answer: str | Word | None, family: Mapping[str, Word] | None = None) -> str:
    """The tone the HTML colours an answer (good, bad, warn, muted or none)."""
    return word_of(answer, family).tone
