"""Where a decision becomes words: every ratio and difference with its interval and answer, every answer of a
check, and every cell of the report's tables, as ``Cell`` (text and the tone the HTML colours).

The terminal, summary.md, report.md and report.html, ``bench compare``, ``bench reproduce``, tune's report and the
docs tables all word their answers here, in the words of ``bench.core.words`` (whose ``say`` writes each word).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.analyze import cost, stats
from bench.analyze.analysis import EXACT_CURVE_RTOL
from bench.core import words
from bench.core.text import fmt_bytes, fmt_secs
from bench.core.words import say, tone
from bench.records.frame import BREAKDOWN
from bench.records.results import PARITY_TOLERANCES
from bench.report.document import Cell

# ---- numbers ------------------------------------------------------------------------------------------------


def known(v: Any) -> bool:
    """A value is there: not None and not NaN."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def fmt_num(v: float | None) -> str:
    """Throughput-like numbers: thousands separators, about 3 significant digits."""
    if not known(v):
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_pct(v: float | None) -> str:
    if not known(v):
        return "-"
    return f"{v * 100:.1f}%" if v >= 0.01 else f"{v * 100:.2f}%"


def fmt_flops(f: float | None) -> str:
    if not known(f):
        return "-"
    if f >= 1e12:
        return f"{f / 1e12:.1f} TFLOP/s"
    return f"{f / 1e9:,.1f} GFLOP/s"


def fmt_ratio(v: float | None) -> str:
    return f"{v:.2f}x" if known(v) else "-"


def joules(j: float) -> str:
    a = abs(j)
    if a >= 1e6:
        return f"{j / 1e6:.3g} MJ"
    if a >= 1e3:
        return f"{j / 1e3:.3g} kJ"
    if a >= 1:
        return f"{j:.3g} J"
    return f"{j * 1e3:.3g} mJ"


def per_rank(values: tuple[float, ...] | None) -> str:
    return " / ".join(fmt_bytes(v) for v in values) if values else "-"


def interval(lo: float | None, hi: float | None, spec: str = ".2f") -> str:
    """`` [lo, hi]`` in ``spec``, or "" without both ends."""
    return f" [{lo:{spec}}, {hi:{spec}}]" if known(lo) and known(hi) else ""


def _reason(why: str | None, brief: bool, terse: bool = False) -> str:
    """Why no verdict: the engine's whole sentence, its first clause where space is short, or its first words in a
    terminal's row ("2 pairs")."""
    why = why or "no interval"
    if terse:
        return why.split(":")[0].split(";")[0]
    return why.split(";")[0] if brief else why


def estimate_text(est: float, lo: float | None, hi: float | None) -> str:
    """``1.55x [0.48, 4.99]``: a ratio and its 95% interval without an answer (a claim's measured side, whose answer
    is the claim's), the interval left out where it prints as the estimate."""
    ci = interval(lo, hi)
    return f"{est:.2f}x" + ("" if ci and f"{lo:.2f}" == f"{hi:.2f}" == f"{est:.2f}" else ci)


def ratio_text(est: float, lo: float | None, hi: float | None, verdict: str | None, why: str | None = None,
               brief: bool = False, terse: bool = False) -> str:
    """``1.20x [1.10, 1.31] faster``: a ratio, its 95% interval (left out where it prints as the estimate), and its
    answer; "no verdict" says why (its first clause when ``brief``, its first words when ``terse``); an inconclusive
    interval wholly on one side of 1 says so, the data showing a direction but not its size (not when ``terse``:
    the terminal's row has no room, the report has it)."""
    ci = interval(lo, hi)
    if ci and f"{lo:.2f}" == f"{hi:.2f}" == f"{est:.2f}":
        ci = ""
    if verdict in (None, stats.NONE):
        return f"{est:.2f}x{ci} ({say(stats.NONE)}: {_reason(why, brief, terse)})"
    if verdict == stats.INCONCLUSIVE and ci and (lo > 1 or hi < 1) and not terse:
        side = "above" if lo > 1 else "below"
        return f"{est:.2f}x{ci} {say(verdict)} (the whole interval {side} 1, not clear of the threshold)"
    return f"{est:.2f}x{ci} {say(verdict)}"


def ratio_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None,
               why: str | None = None, brief: bool = False, terse: bool = False) -> Cell:
    if not known(est):
        return Cell("-")
    return Cell(ratio_text(est, lo, hi, verdict, why, brief, terse), tone(verdict))


def delta_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None,
               why: str | None = None, digits: int = 4, brief: bool = False) -> Cell:
    """``+0.0123 [-0.0040, +0.0286] inconclusive``: a difference of the metric, its interval and its answer; a
    decision that Holm's correction over the report's quality comparisons undid says so."""
    if not known(est):
        return Cell("-")
    spec = f"+.{digits}f"
    text = f"{est:{spec}}{interval(lo, hi, spec)}"
    if verdict in (None, stats.NONE):
        return Cell(f"{text} ({say(stats.NONE)}: {_reason(why, brief)})", tone(stats.NONE))
    if verdict == stats.INCONCLUSIVE and why and "Holm" in why:  # a decision the family's correction undid
        return Cell(f"{text} {say(verdict)} ({why})", tone(verdict))
    return Cell(f"{text} {say(verdict)}", tone(verdict))


def claim_cell(verdict: str | None, why: str | None = None, speed: bool = True, brief: bool = False) -> Cell:
    """A measurement against a published claim's range: within, below or above the claim, or why not decided.
    Below a speed claim is bad news; below a memory claim is good."""
    text = say(verdict, words.CLAIMS) if verdict else "-"
    if verdict in (stats.INCONCLUSIVE, stats.NONE) and why:
        text += f" ({_reason(why, brief)})"
    good_side = "above" if speed else "below"
    shade = "good" if verdict in ("within", good_side) else "bad" if verdict in ("below", "above") else "muted"
    return Cell(text, shade)


def combination_cell(verdict: str, why: str | None = None) -> Cell:
    """A combination's observed speedup against the product of its parts' speedups."""
    text = say(verdict, words.COMBINATION)
    if verdict == stats.NONE and why:
        text += f" ({why})"
    return Cell(text, tone(verdict, words.COMBINATION))


def difference_cell(c: Any, prefix: str = "delta", digits: int = 4, brief: bool = False) -> Cell:
    """A configuration's metric difference (``prefix``: ``delta`` at equal samples, ``delta_at_time`` at equal time)
    with its interval and answer; a decision Holm's correction undid says so, briefly where space is short."""
    est, lo, hi, verdict, why = (getattr(c, f"{prefix}{s}") for s in ("", "_lo", "_hi", "_verdict", "_why"))
    if brief and getattr(c, f"{prefix}_holm_dropped", False) and known(est):
        spec = f"+.{digits}f"
        return Cell(f"{est:{spec}}{interval(lo, hi, spec)} {say(verdict)} (p = {getattr(c, f'{prefix}_p'):.3f} "
                    f"alone; not after Holm over {getattr(c, f'{prefix}_family')})", tone(verdict))
    return delta_cell(est, lo, hi, verdict, why, digits, brief)


def saving_cell(c: Any, p: float, machines_ratio: float = 1.0) -> Cell:
    """What a set's speedup saves per 1,000 training hours at ``p`` per machine-hour, its interval mapped endpoint
    by endpoint, and the speedup's answer: a speedup that is not decided "faster" saves nothing shown."""
    if c.is_reference:
        return Cell("reference", "muted") if c.n_ok else Cell("-")
    if not known(c.speedup):
        return Cell("-")
    lo = c.speedup_lo if known(c.speedup_lo) else None
    hi = c.speedup_hi if known(c.speedup_hi) else None
    saved, saved_lo, saved_hi = cost.saved_interval(p, c.speedup, lo, hi, machines_ratio)
    text = f"{cost.money(saved)}{cost.interval_text(saved, saved_lo, saved_hi)}"
    if machines_ratio != 1.0:  # faster on more machines can still cost more: the verdict is on the money
        if saved_lo is not None and saved_lo > 0:
            return Cell(f"{text} saved", "good")
        if saved_hi is not None and saved_hi < 0:
            return Cell(f"{text}: extra cost on {machines_ratio:g}x the machines", "bad")
        return Cell(f"{text} ({machines_ratio:g}x the machines; {say(words.NO_SAVING)}: the interval includes 0)", "muted")
    if c.speedup_verdict in (None, stats.NONE):
        return Cell(f"{text} ({say(stats.NONE)}: {c.speedup_why or 'no interval'})", "muted")
    if c.speedup_verdict == words.UNEQUAL:
        return Cell(f"{say(words.NO_SAVING)} ({say(words.UNEQUAL)}: {c.speedup_why})", "muted")
    if c.speedup_verdict == stats.EQUIVALENT:
        return Cell(f"{say(words.NO_SAVING)} (speed {say(stats.EQUIVALENT)}; {text})", "muted")
    if c.speedup_verdict == stats.INCONCLUSIVE:
        if saved_hi is not None and saved_hi < 0:  # slower for sure, though not by the threshold
            return Cell(f"{text}: extra cost (the speedup is {say(stats.INCONCLUSIVE)}: below 1, not clear of the threshold)",
                        "muted")
        if saved_lo is not None and saved_lo > 0:
            return Cell(f"{text} saved (the speedup is {say(stats.INCONCLUSIVE)}: above 1, not clear of the threshold)", "muted")
        return Cell(f"{say(words.NO_SAVING)}: the speedup is {say(stats.INCONCLUSIVE)} ({text})", "muted")
    if c.speedup_verdict == "faster":
        return Cell(f"{text} saved", "good")
    return Cell(f"{text}: extra cost", "bad")


# ---- superlatives: the sets a "fastest" or "least memory" leaves out ----------------------------------------


@dataclass(frozen=True)
class Undecided:
    """A set a superlative leaves out: its estimate, interval and undecided answer (inconclusive or no verdict)."""

    name: str
    value: float
    lo: float | None
    hi: float | None
    verdict: str
    why: str | None


def beyond_winner(items: list[Undecided], winner: float, lower_wins: bool = False) -> list[Undecided]:
    """The sets a superlative leaves out that measured beyond its winner: undecided, with an estimate above the
    winner's (below it when ``lower_wins``). Naming the winner alone would read as "the best set" when one of
    these may be."""
    return [u for u in items if u.verdict in stats.UNDECIDED and known(u.value)
            and (u.value < winner if lower_wins else u.value > winner)]


def undecided(rows: Any, prefix: str, name: str = "technique") -> list[Undecided]:
    """The rows (configurations' itertuples) as ``Undecided`` on ``prefix`` ("speedup", "mem_ratio")."""
    return [Undecided(getattr(r, name), *(getattr(r, f"{prefix}{s}") for s in ("", "_lo", "_hi", "_verdict", "_why")))
            for r in rows if getattr(r, f"{prefix}_verdict") in stats.UNDECIDED]


def tie_digits(items: list[Undecided], winner: float) -> int:
    """Decimals that tell the left-out estimates from the winner's: 2, or 3 where 2 print the same number."""
    return 3 if any(f"{u.value:.2f}" == f"{winner:.2f}" for u in items) else 2


def left_out_text(items: list[Undecided], digits: int = 2) -> str:
    """``bf16 (3.79x) and bf16+compile (4.46x): no verdict (2 pairs: a verdict needs 3)``: which sets a superlative
    left out and why, grouped by the reason their answer gives."""
    groups: dict[str, list[str]] = {}
    for u in items:
        ci = interval(u.lo, u.hi) if u.verdict == stats.INCONCLUSIVE else ""
        reason = say(u.verdict) if u.verdict == stats.INCONCLUSIVE else say(stats.NONE) + (
            f" ({u.why})" if u.why else "")
        groups.setdefault(reason, []).append(f"{u.name} ({u.value:.{digits}f}x{ci})")
    return "; ".join(f"{and_list(names)}: {reason}" for reason, names in groups.items())


def and_list(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---- one configuration in a line: the summary, the terminal, the docs tables --------------------------------


def unequal_resources(c: Any) -> bool:
    """The set ran on other cores or devices than its reference: its throughput ratio is no speedup."""
    return c.speedup_verdict == words.UNEQUAL and known(c.speedup)


def unequal_text(c: Any, terse: bool = False) -> str:
    """``1.28x on 2 cores against 1: unequal resources; per core 0.64x [0.55, 0.75] slower``: the throughput ratio
    labelled with the resources it compares, and the ratio per core (per device) with its answer."""
    unit, mine, theirs = c.resource_unit, int(c.resource_mine), int(c.resource_ref)
    per = ratio_text(c.speedup_per_unit, c.speedup_per_unit_lo, c.speedup_per_unit_hi, c.speedup_per_unit_verdict,
                     c.speedup_per_unit_why, brief=True, terse=terse) if known(c.speedup_per_unit) else "-"
    if terse:
        return f"{c.speedup:.2f}x on {mine}/{theirs} {unit}s; {per}/{unit}"
    plural = "s" if mine != 1 else ""
    return (f"{c.speedup:.2f}x{interval(c.speedup_lo, c.speedup_hi)} on {mine} {unit}{plural} against "
            f"{theirs}: {say(words.UNEQUAL)}; per {unit} {per}")


def speed_brief(c: Any) -> str:
    """The speedup against the reference with its interval and answer ("reference" on the reference's row)."""
    if c.is_reference:
        return "reference" if known(c.sps_median) else "-"
    if unequal_resources(c):
        return unequal_text(c)
    return ratio_cell(c.speedup, c.speedup_lo, c.speedup_hi, c.speedup_verdict, c.speedup_why, brief=True).text


def memory_brief(c: Any) -> str:
    """The peak-memory ratio with its interval and answer, "(RSS)" where it compares resident memory."""
    if c.is_reference:
        return "reference" if known(c.peak_bytes) or known(c.peak_rss_bytes) else "-"
    text = ratio_cell(c.mem_ratio, c.mem_ratio_lo, c.mem_ratio_hi, c.mem_ratio_verdict, c.mem_ratio_why,
                      brief=True).text
    return text + (" (RSS)" if c.mem_ratio_source == "RSS" and text != "-" else "")


def exact_brief(c: Any) -> str | None:
    """An exact set's quality in a few words when its eval curves match or drift by rounding, else None."""
    if c.quality_same_exact:
        how = "curves identical" if c.curve_max_rel_diff == 0 else f"curves within {c.curve_max_rel_diff:.1%}"
        return f"{say(words.SAME)} ({how})"
    if c.exact_quality == "drift":
        return f"{say(words.SAME_NOISE)} (curves drift {c.curve_max_rel_diff:.1%} by rounding)"
    return None


def quality_brief(c: Any, digits: int = 4) -> str:
    """Quality at equal samples in a line: the reference's metric, an exact set's "same", or the difference with
    its interval and answer."""
    if not c.n_ok or c.metric is None or (not c.n_final and not c.n_cut):
        return "-"
    if not c.n_final:
        return f"not compared: {c.n_cut} run(s) cut by the safety cap"
    if c.is_reference:
        return f"{c.metric} {c.final_mean:.{digits}f} ± {c.final_std:.{digits}f}"
    same = exact_brief(c)
    if same:
        return same
    text = difference_cell(c, "delta", digits, brief=True).text
    if c.exact_quality == "expected mismatch":
        text += f"; {say(words.BY_DESIGN)} (see the report's parity)"
    if c.n_stopped:
        text += f" at the stop ({c.n_stopped}/{c.n_final} runs stopped early)"
    return text


def equal_time_brief(c: Any) -> str:
    """Quality at the reference's training clock in a line ("-" for the reference and exact sets)."""
    if c.is_reference or c.kind == "exact":
        return "-"
    text = difference_cell(c, "delta_at_time", brief=True).text
    if text == "-" and getattr(c, "clock_contended", None):
        return f"not compared: {c.clock_contended}"
    unscored = c.equal_time_faster - c.equal_time_continued
    if text != "-" and unscored > 0:
        text += f"; {unscored} run(s) that took less time scored where they ended"
    return text


def ttt_brief(c: Any, with_ratio: bool = True) -> str:
    """The censored median time to target, its misses and (``with_ratio``) the paired ratio with its answer."""
    if c.target is None or not c.n_ttt:
        return "-"
    misses = f"{round(c.ttt_miss_rate * c.n_ttt)}/{c.n_ttt} missed"
    if not known(c.ttt_median) or not math.isfinite(c.ttt_median):
        return f"missed ({misses.removesuffix(' missed')})"
    one_off = (c.one_off_s if known(c.one_off_s) else 0.0) + (c.probe_s if known(c.probe_s) else 0.0)
    text = fmt_secs(c.ttt_median)
    if one_off > 0.05 * c.ttt_median and math.isfinite(c.ttt_one_off_median):
        text += f" ({fmt_secs(c.ttt_one_off_median)} with one-off)"
    text += f"; {misses}"
    if with_ratio and not c.is_reference and known(c.ttt_ratio):
        text += "; " + ratio_cell(c.ttt_ratio, c.ttt_ratio_lo, c.ttt_ratio_hi, c.ttt_ratio_verdict, c.ttt_ratio_why,
                                  brief=True).text
    contended = getattr(c, "clock_contended", None)
    if contended and contended.split(" (")[0] not in text:
        text += f"; {contended.split(' (')[0]}"
    return text


def parity_brief(c: Any) -> str:
    """Parity's answer in a word or two."""
    answer = c.parity_answer
    if answer is None:
        return "n/a" if c.kind == "algorithmic" else "-"
    if answer == "mismatch" and c.parity_note:
        return say(words.BY_DESIGN)
    return say(answer, words.PARITY)


# ---- cells of the workload table ----------------------------------------------------------------------------


def sps_cell(c: Any) -> Cell:
    if not known(c.sps_median):
        return Cell("-")
    spread = f"IQR {fmt_num(c.sps_iqr)}" if c.n_ok > 1 else "1 repeat"
    return Cell(f"{fmt_num(c.sps_median)} ({spread})", "warn" if c.noisy else "")


def speedup_cell(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
    if unequal_resources(c):
        return Cell(unequal_text(c), tone(words.UNEQUAL))
    return ratio_cell(c.speedup, c.speedup_lo, c.speedup_hi, c.speedup_verdict, c.speedup_why)


def memory_cell(c: Any) -> Cell:
    if known(c.peak_bytes):
        rss = f" (RSS {fmt_bytes(c.peak_rss_bytes)})" if known(c.peak_rss_bytes) else ""
        return Cell(f"{fmt_bytes(c.peak_bytes)}{rss}")
    if known(c.peak_rss_bytes):
        return Cell(f"RSS {fmt_bytes(c.peak_rss_bytes)}")
    return Cell("-")


def mem_ratio_cell(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
    cell = ratio_cell(c.mem_ratio, c.mem_ratio_lo, c.mem_ratio_hi, c.mem_ratio_verdict, c.mem_ratio_why)
    if c.mem_ratio_source == "RSS":
        cell.text += " (RSS)"
    return cell


def breakdown_cell(c: Any) -> Cell:
    if c.breakdown_skipped:
        return Cell(f"none: {c.breakdown_skipped}", "muted")
    values = [getattr(c, f"mem_{name}_bytes") for name in BREAKDOWN]
    if not any(known(v) for v in values):
        return Cell("-")
    scale, unit = (2**20, "MiB") if max(v for v in values if known(v)) >= 2**20 else (2**10, "KiB")
    text = " / ".join(f"{v / scale:.1f}" if known(v) else "-" for v in values) + f" {unit}"
    held = getattr(c, "mem_held", None)
    if held:  # what of "other" techniques keep resident, by name
        text += "; other holds " + ", ".join(f"{name} {b / scale:.1f}" for name, b in held.items())
    return Cell(text)


def one_off_cell(c: Any) -> Cell:
    if known(c.probe_s) and c.probe_s > 0:
        first = fmt_secs(c.one_off_s) if known(c.one_off_s) else "-"
        return Cell(f"{first} + probes {fmt_secs(c.probe_s)}", "warn")
    if not known(c.one_off_s):
        return Cell("-")
    return Cell(fmt_secs(c.one_off_s), "warn" if c.one_off_s > 1.0 else "")


def quality_cell(c: Any) -> Cell:
    """The metric at equal samples, judged by the set's kind."""
    if not c.n_ok or c.metric is None or (not c.n_final and not c.n_cut):
        return Cell("-")
    if not c.n_final:
        return Cell(f"not compared: {c.n_cut} run(s) cut by the safety cap", "warn")
    value = f"{c.final_mean:.4f} ± {c.final_std:.4f}" + (f" (n={c.n_final})" if c.n_final != c.n_ok else "")
    if c.is_reference:
        return Cell(f"{value} (reference)", "muted")
    if c.quality_same_exact:
        within = "identical to" if c.curve_max_rel_diff == 0 else \
            f"at most {c.curve_max_rel_diff:.1%} of the metric's range from"
        return Cell(f"{say(words.SAME)}: exact (eval curves {within} the reference's at {c.curve_points} evaluations "
                    f"over {c.curve_pairs} seeds)", tone(words.SAME))
    delta = delta_cell(c.delta, c.delta_lo, c.delta_hi, c.delta_verdict, c.delta_why)
    text = f"{value}; {delta.text}"
    if c.n_stopped:
        clock = (f"; all runs: median {fmt_secs(c.train_time_s)} of training against the reference's "
                 f"{fmt_secs(c.equal_time_s)}"
                 if known(c.train_time_s) and known(c.equal_time_s) else "")
        text = (f"stopped early in {c.n_stopped}/{c.n_final} runs (the stopped ones trained a median "
                f"{c.samples_frac_median:.0%} of the samples{clock}): the metric at the stop against the full run of "
                f"the same seed: {text}")
    if c.exact_quality:
        apart = f"eval curves {c.curve_max_rel_diff:.1%} of the range apart"
        word = EXACT_WORDS[c.exact_quality]
        why = {"drift": f"{say(word)} (exact; {apart}: rounding, first steps match)",
               "expected mismatch": f"{apart}: {say(word)} (see parity)",
               "drift changes quality": f"{apart}: {say(word)} (rounding, first steps match, yet the final metric "
                                        "differs)",
               "unverified drift": f"{apart}: {say(word)} (no parity or fewer than 3 seeds, so rounding is not "
                                   "shown)",
               "bug": f"{apart} and the first steps differ from the reference: check it"}[c.exact_quality]
        shade = "bad" if c.exact_quality == "bug" else tone(word)
        return Cell(f"{why}; {text}" if c.exact_quality == "drift" else f"{text}; {why}", shade)
    if c.kind in ("numeric", "algorithmic"):
        text += equal_time_text(c)
    return Cell(text, delta.tone)


def equal_time_text(c: Any) -> str:
    """The metric at the reference's training clock, and how a faster set got there: trained on past its budget
    (``bench.run.continuation``), or why it could not be ("" without an equal-time value)."""
    contended = getattr(c, "clock_contended", None)
    if not known(c.delta_at_time):
        return f"; at equal time: not compared ({contended})" if contended else ""
    at = delta_cell(c.delta_at_time, c.delta_at_time_lo, c.delta_at_time_hi, c.delta_at_time_verdict,
                    c.delta_at_time_why)
    how = []
    if c.equal_time_continued:
        seeds = "" if c.equal_time_continued == c.n_final else f", {c.equal_time_continued}/{c.n_final} seeds"
        how.append(f"trained on to {fmt_secs(c.equal_time_until_s)}, +{c.equal_time_beyond_samples:,.0f} "
                   f"samples{seeds}")
    if c.equal_time_cut:
        how.append(f"cut short: {c.equal_time_cut}")
    if c.equal_time_blocked:
        how.append(f"continuation not possible: {c.equal_time_blocked}")
    elif c.equal_time_faster > c.equal_time_continued:
        how.append(f"{c.equal_time_faster - c.equal_time_continued} run(s) that took less time scored where they "
                   "ended: no "
                   "continuation recorded")
    if contended and contended not in at.text:
        how.append(contended)
    return f"; at equal time ({fmt_secs(c.equal_time_s)}): {at.text}" + (f" ({'; '.join(how)})" if how else "")


# An exact set's quality (``analysis.exact_quality``) as its word; a "bug" (first steps differ) is parity's mismatch.
EXACT_WORDS = {"identical": words.SAME, "drift": words.SAME_NOISE, "expected mismatch": words.BY_DESIGN,
               "drift changes quality": words.DRIFT_CHANGES, "unverified drift": words.UNVERIFIED,
               "bug": words.PARITY["mismatch"]}


def exact_drift(c: Any) -> str:
    """Why an exact set's eval curve is not the reference's: its word, and what the word means here."""
    head = (f"exact by design, its eval curves differ from the reference's by up to {c.curve_max_rel_diff:.1%} of "
            f"the metric's range (tolerance {EXACT_CURVE_RTOL:.0%})")
    if c.exact_quality == "expected mismatch":
        return f"{head}: {say(words.BY_DESIGN)}: {c.parity_note}"
    if c.exact_quality == "bug":
        return f"{head} and its first steps do not match the reference: check it"
    word = EXACT_WORDS[c.exact_quality]
    return f"{head}: {say(word)}: {word.means}"


def ttt_interval(c: Any) -> tuple[str, str]:
    """The order-statistic interval of the median time-to-target and its coverage ("" without one)."""
    if not known(c.ttt_lo) or not known(c.ttt_hi):
        return "", ""
    high = fmt_secs(c.ttt_hi) if math.isfinite(c.ttt_hi) else "miss"
    return f" [{fmt_secs(c.ttt_lo)}, {high}]", f"{c.ttt_coverage:.0%} interval"


def ttt_cell(c: Any) -> Cell:
    """Censored median time-to-target (training clock, one-off excluded), misses, samples, and the ratio."""
    if c.target is None or not c.n_ttt:
        return Cell("-")
    misses = round(c.ttt_miss_rate * c.n_ttt)
    missed = f"{misses}/{c.n_ttt} missed"
    if not known(c.ttt_median) or not math.isfinite(c.ttt_median):
        return Cell(f"not reached: median is a miss ({missed})", "muted" if c.is_reference else "bad")
    interval, coverage = ttt_interval(c)
    asides = [coverage] if coverage else []
    one_off = (c.one_off_s if known(c.one_off_s) else 0.0) + (c.probe_s if known(c.probe_s) else 0.0)
    if one_off > 0.05 * c.ttt_median and math.isfinite(c.ttt_one_off_median):
        asides.append(f"{fmt_secs(c.ttt_one_off_median)} with one-off")
    text = fmt_secs(c.ttt_median) + interval + (f" ({'; '.join(asides)})" if asides else "")
    text += f"; {fmt_num(c.stt_median)} samples; {missed}"
    contended = getattr(c, "clock_contended", None)
    if c.is_reference or not known(c.ttt_ratio):
        why = f"; {c.ttt_ratio_why}" if c.ttt_ratio_why and not c.is_reference else ""
        if c.is_reference and contended:
            why = f"; {contended}"
        return Cell(text + why)
    cell = ratio_cell(c.ttt_ratio, c.ttt_ratio_lo, c.ttt_ratio_hi, c.ttt_ratio_verdict, c.ttt_ratio_why)
    if contended and contended not in cell.text:
        cell.text += f" ({contended})"
    return Cell(f"{text}; {cell.text}", cell.tone)


def parity_cell(c: Any) -> Cell:
    """The set's parity answer (its worst trial's), that trial's checks against their tolerances, and how the loss
    tolerance was set: calibrated on the reference's harmless run, or the fixed one of records before that."""
    answer = c.parity_answer
    if c.kind == "algorithmic" and answer is None:
        return Cell("n/a (algorithmic: judged by quality)", "muted")
    if answer is None:
        return Cell("-")
    checks = [_parity_check("loss", c.parity_loss_diff, c.parity_loss_tol, c.parity_bug_loss_drift),
              _parity_check("distance", c.parity_distance_diff, c.parity_distance_tol, c.parity_bug_distance_drift)]
    if known(c.parity_harmless_drift):
        checks.append(f"tolerances {c.parity_k_tol:g} x a harmless jitter's drift (loss "
                      f"{c.parity_harmless_drift:.1e}), at least "
                      f"{', '.join(f'{t:.0e}' for t in PARITY_TOLERANCES[c.parity_kind])}")
    else:
        checks.append("fixed tolerances, not calibrated")
    counts = c.parity_answers or {}
    seeds = f" in {counts[answer]} of {sum(counts.values())} trials" if len(counts) > 1 else ""
    detail = f"{seeds} ({'; '.join(checks)})"
    if answer == "inconclusive":
        return Cell(f"{say(answer, words.PARITY)}{detail}: the check cannot tell a 10% learning-rate bug from "
                    "harmless drift here", tone(answer, words.PARITY))
    if answer == "mismatch" and c.parity_note:
        return Cell(f"{say(words.BY_DESIGN)}{detail}; {c.parity_note}", tone(words.BY_DESIGN))
    return Cell(f"{say(answer, words.PARITY)}{detail}", tone(answer, words.PARITY))


def _parity_check(name: str, drift: float, tol: float, bug: float | None) -> str:
    """One check: its drift against its tolerance, and, where the known bug stays within it, that it has no power."""
    text = f"{name} {drift:.1e} {'≤' if drift <= tol else '>'} {tol:.1e}"
    if known(bug) and bug <= tol:
        text += f" (a 10% LR bug: {bug:.1e}, {say('inconclusive', words.PARITY)})"
    return text


def status_cell(c: Any) -> Cell:
    text = c.status  # the reasons are in the failures table
    tone = "bad" if c.problems else ("muted" if c.skip_reason else "")
    if c.n_contended:
        text += f"; {c.n_contended} contended"
        tone = tone or "warn"
    return Cell(text, tone)


__all__ = ["fmt_bytes", "fmt_secs"]  # the units of bench.core.text, re-exported beside the others


# ---- one configuration in a terminal's row (100 columns) --------------------------------------------------------


def speed_terse(c: Any) -> str:
    """The speedup, interval and answer; without the interval where there is no verdict (the reason instead)."""
    if c.is_reference:
        return f"{fmt_num(c.sps_median)} samples/s" if known(c.sps_median) else "-"
    if not known(c.speedup):
        return "-"
    if unequal_resources(c):
        return unequal_text(c, terse=True)
    if c.speedup_verdict in (None, stats.NONE):
        return f"{c.speedup:.2f}x ({say(stats.NONE)}: {_reason(c.speedup_why, True, terse=True)})"
    return ratio_text(c.speedup, c.speedup_lo, c.speedup_hi, c.speedup_verdict, terse=True)


def memory_terse(c: Any) -> str:
    """The peak-memory ratio and its answer (its interval is in summary.md)."""
    if c.is_reference:
        return "reference" if known(c.peak_bytes) or known(c.peak_rss_bytes) else "-"
    if not known(c.mem_ratio):
        return "-"
    rss = " (RSS)" if c.mem_ratio_source == "RSS" else ""
    return f"{c.mem_ratio:.2f}x {say(c.mem_ratio_verdict)}{rss}"


def quality_terse(c: Any) -> str:
    """Quality at equal samples in a few words: the reference's metric, "same", or the difference and its answer."""
    if not c.n_ok or c.metric is None or (not c.n_final and not c.n_cut):
        return "-"
    if not c.n_final:
        return "not compared (cut)"
    if c.is_reference:
        return f"{c.metric} {c.final_mean:.3f}"
    if c.quality_same_exact:
        return say(words.SAME)
    if c.exact_quality == "drift":
        return say(words.SAME_NOISE)
    if not known(c.delta):
        return "-"
    return f"{c.delta:+.3f} {say(c.delta_verdict)}" + (" (at stop)" if c.n_stopped else "")


def flags(c: Any) -> list[str]:
    """What a row's numbers do not say by themselves: a parity that failed or has no power, timed windows left out,
    trials that did not finish, quality runs cut; each a few words (the report has the whole reason)."""
    out = []
    if c.parity_answer and c.parity_answer != "ok":
        out.append(f"parity: {parity_brief(c)}")
    if c.n_contended:
        out.append(f"{c.n_contended} contended window(s) left out")
    if getattr(c, "clock_contended", None):
        out.append(c.clock_contended.split(" (")[0] + " of equal time and time to target")
    if unequal_resources(c):
        out.append(f"{say(words.UNEQUAL)}: {int(c.resource_mine)} {c.resource_unit}s against {int(c.resource_ref)}")
    if c.problems:
        out.append(c.status)
    elif c.skip_reason:
        out.append(f"skipped: {c.skip_reason}")
    if c.n_cut:
        out.append(f"{c.n_cut} quality run(s) cut")
    return out
