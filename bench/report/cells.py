"""The cells of the report's tables: every number with its unit, every ratio and difference with its interval and
verdict, as ``Cell`` (text and the tone the HTML colours)."""

from __future__ import annotations

import math
from typing import Any

from bench.analyze import stats
from bench.analyze.analysis import BREAKDOWN, EXACT_CURVE_RTOL, EXACT_QUALITY
from bench.core.text import fmt_bytes, fmt_secs
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


def ratio_text(est: float, lo: float | None, hi: float | None, verdict: str | None, why: str | None = None) -> str:
    ci = "" if not known(lo) or not known(hi) else (
        "" if f"{lo:.2f}" == f"{hi:.2f}" == f"{est:.2f}" else f" [{lo:.2f}, {hi:.2f}]")
    if verdict in (None, stats.NONE):
        return f"{est:.2f}x{ci} (no verdict: {why or 'no interval'})"
    if verdict == stats.INCONCLUSIVE and ci and (lo > 1 or hi < 1):  # the data do show a direction, not its size
        side = "above" if lo > 1 else "below"
        return f"{est:.2f}x{ci} inconclusive (the whole interval {side} 1, not clear of the threshold)"
    return f"{est:.2f}x{ci} {verdict}"


TONES = {"faster": "good", "slower": "bad", "less": "good", "more": "bad", "better": "good", "worse": "bad",
         "sooner": "good", "later": "bad", stats.EQUIVALENT: "", stats.INCONCLUSIVE: "muted", stats.NONE: "muted"}


def ratio_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None,
               why: str | None = None) -> Cell:
    if not known(est):
        return Cell("-")
    return Cell(ratio_text(est, lo, hi, verdict, why), TONES.get(verdict or stats.NONE, ""))


def delta_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None,
               why: str | None = None) -> Cell:
    if not known(est):
        return Cell("-")
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if known(lo) and known(hi) else ""
    if verdict in (None, stats.NONE):
        return Cell(f"{est:+.4f}{ci} (no verdict: {why or 'no interval'})", "muted")
    if verdict == stats.INCONCLUSIVE and why and "Holm" in why:  # a decision the family's correction undid
        return Cell(f"{est:+.4f}{ci} inconclusive ({why})", "muted")
    return Cell(f"{est:+.4f}{ci} {verdict}", TONES.get(verdict, ""))


# ---- cells of the workload table ----------------------------------------------------------------------------


def sps_cell(c: Any) -> Cell:
    if not known(c.sps_median):
        return Cell("-")
    spread = f"IQR {fmt_num(c.sps_iqr)}" if c.n_ok > 1 else "1 repeat"
    return Cell(f"{fmt_num(c.sps_median)} ({spread})", "warn" if c.noisy else "")


def speedup_cell(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
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
        return Cell(f"same: exact (eval curves {within} the reference's at {c.curve_points} evaluations over "
                    f"{c.curve_pairs} seeds)", "good")
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
        why = {"drift": f"same within noise (exact; {apart}: rounding, first steps match)",
               "expected mismatch": f"{apart}: an expected mismatch (see parity)",
               "drift changes quality": f"{apart}: rounding, first steps match, yet the final metric differs",
               "unverified drift": f"{apart}: no parity or fewer than 3 seeds, so rounding is not shown",
               "bug": f"{apart} and the first steps differ from the reference: check it"}[c.exact_quality]
        tone = {"drift": "good", "bug": "bad"}.get(c.exact_quality, "warn")
        return Cell(f"{why}; {text}" if c.exact_quality == "drift" else f"{text}; {why}", tone)
    if c.kind in ("numeric", "algorithmic"):
        text += equal_time_text(c)
    return Cell(text, delta.tone)


def equal_time_text(c: Any) -> str:
    """The metric at the reference's training clock, and how a faster set got there: trained on past its budget
    (``bench.run.continuation``), or why it could not be ("" without an equal-time value)."""
    if not known(c.delta_at_time):
        return ""
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
        how.append(f"{c.equal_time_faster - c.equal_time_continued} faster run(s) scored where they ended: no "
                   "continuation recorded")
    return f"; at equal time ({fmt_secs(c.equal_time_s)}): {at.text}" + (f" ({'; '.join(how)})" if how else "")


def exact_drift(c: Any) -> str:
    """Why an exact set's eval curve is not the reference's (``analysis.EXACT_QUALITY``)."""
    head = (f"exact by design, its eval curves differ from the reference's by up to {c.curve_max_rel_diff:.1%} of "
            f"the metric's range (tolerance {EXACT_CURVE_RTOL:.0%})")
    if c.exact_quality == "expected mismatch":
        return f"{head}: {c.parity_note}"
    if c.exact_quality == "bug":
        return f"{head} and its first steps do not match the reference: check it"
    return f"{head}; {EXACT_QUALITY[c.exact_quality]}"


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
    if c.is_reference or not known(c.ttt_ratio):
        why = f"; {c.ttt_ratio_why}" if c.ttt_ratio_why and not c.is_reference else ""
        return Cell(text + why)
    cell = ratio_cell(c.ttt_ratio, c.ttt_ratio_lo, c.ttt_ratio_hi, c.ttt_ratio_verdict, c.ttt_ratio_why)
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
    if answer == "ok":
        return Cell(f"ok{detail}", "good")
    if answer == "inconclusive":
        return Cell(f"inconclusive{detail}: the check cannot tell a 10% learning-rate bug from harmless drift here",
                    "warn")
    if c.parity_note:
        return Cell(f"differs{detail}; {c.parity_note}", "warn")
    return Cell(f"MISMATCH{detail}", "bad")


def _parity_check(name: str, drift: float, tol: float, bug: float | None) -> str:
    """One check: its drift against its tolerance, and, where the known bug stays within it, that it has no power."""
    text = f"{name} {drift:.1e} {'≤' if drift <= tol else '>'} {tol:.1e}"
    if known(bug) and bug <= tol:
        text += f" (a 10% LR bug: {bug:.1e}, no power)"
    return text


def status_cell(c: Any) -> Cell:
    text = c.status  # the reasons are in the failures table
    tone = "bad" if c.problems else ("muted" if c.skip_reason else "")
    if c.n_contended:
        text += f"; {c.n_contended} contended"
        tone = tone or "warn"
    return Cell(text, tone)


__all__ = ["fmt_bytes", "fmt_secs"]  # the units of bench.core.text, re-exported beside the others
