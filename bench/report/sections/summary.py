"""Summary: how many verdicts the data decided, then per workload what stands out (the fastest set decided, the
least memory, quality, time to target), each number with its interval and verdict."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench.analyze import mfu, stats
from bench.analyze.analysis import Analysis
from bench.core import words
from bench.core.text import fmt_secs
from bench.report.cells import (
    Undecided,
    beyond_winner,
    difference_cell,
    exact_drift,
    fmt_flops,
    fmt_num,
    fmt_pct,
    interval,
    known,
    left_out_text,
    ratio_text,
    say,
    tie_digits,
    undecided,
    unequal_resources,
    unequal_text,
)
from bench.report.document import Bullets, FigureRef, Item, Paragraph, Section
from bench.report.sections import Context

ORDER = 10


def build(ctx: Context) -> Section:
    blocks = [Paragraph(d) for d in decisions(ctx.analysis)]
    blocks.append(Bullets([Item(label, strong=True, children=points) for label, points in _headline(ctx)]))
    return Section("Summary", "summary", "Summary", [*blocks, FigureRef("speedup")])


def _speed_points(analysis: Analysis, rows: pd.DataFrame, others: pd.DataFrame) -> list[str]:
    speed_contended = ["speed not reported: every timed window here stayed contended (other processes used the "
                       "cores; see the status column): measure again on an idle machine"]
    if not any(known(v) for v in rows["sps_median"]) and any(int(n or 0) for n in rows["n_contended"]):
        return speed_contended + _memory_points(others)
    if not any(known(v) for v in rows["sps_median"]) and not any(known(v) for v in rows["peak_bytes"]):
        if not int(sum(int(n or 0) for n in rows["n_ok"])):
            return ["nothing measured here: no trial of this workload finished ok (the status column says why)"]
        return ["speed and memory not measured here (quality runs only: --mode quality)"]
    parts = []
    faster = others[others["speedup_verdict"] == "faster"]
    if len(faster):
        best = faster.loc[faster["speedup"].astype(float).idxmax()]
        extra = []
        if known(best["mem_ratio"]):
            extra.append(f"peak memory {best['mem_ratio']:.2f}x" + (" (RSS)" if best["mem_ratio_source"] == "RSS"
                                                                    else ""))
        extra.append(f"quality: {_quality_word(best)}")
        if known(best["one_off_s"]) and best["one_off_s"] > 1.0:
            extra.append(f"one-off {fmt_secs(best['one_off_s'])}")
        higher = beyond_winner(undecided(others.itertuples(), "speedup"), best["speedup"])
        parts.append(f"fastest{' decided' if higher else ''}: {best['technique']} at "
                     f"{ratio_text(best['speedup'], best['speedup_lo'], best['speedup_hi'], 'faster')} "
                     f"({', '.join(extra)})"
                     + _left_out(higher, "higher", tie_digits(higher, best["speedup"])))
    elif not any(int(r.n_ok) > 0 for r in rows.itertuples() if r.is_reference):
        parts.append(f"no speedups: the reference '{analysis.baseline}' has no successful trial here")
    elif any(int(r.n_ok or 0) for r in others.itertuples()) and all(
            int(r.n_contended or 0) and not int(r.n_speed or 0) for r in others.itertuples() if int(r.n_ok or 0)):
        parts.append("speed not compared: every timed window of the other sets stayed contended (other processes "
                     "used the cores; see the status column): measure again on an idle machine")
    elif len(others) and all(v in (None, stats.NONE) for v in others["speedup_verdict"]):
        why = next((w for w in others["speedup_why"] if w), "no interval")
        points = ", ".join(f"{r.technique} {r.speedup:.2f}x" for r in others.itertuples() if known(r.speedup))
        parts.append(f"speed: {say(stats.NONE)} ({why})" + (f"; estimates only: {points}" if points else ""))
    elif len(others):
        parts.append(f"no technique set was {say('faster')} than {analysis.baseline} (by more than "
                     f"{analysis.thresholds.speed:.0%} with 95% confidence)")
    parts += _memory_points(others)
    slower = others[others["speedup_verdict"] == "slower"]
    if len(slower):
        parts.append(f"{say('slower')} than the reference: " + ", ".join(
            f"{r.technique} ({r.speedup:.2f}x)" for r in slower.itertuples()))
    same = others[others["speedup_verdict"] == stats.EQUIVALENT]
    if len(same):
        parts.append(f"as fast as the reference ({say(stats.EQUIVALENT)}: the whole interval within "
                     f"+-{analysis.thresholds.speed:.0%}): " + ", ".join(f"{r.technique} ({r.speedup:.2f}x)" for r in same.itertuples()))
    unequal = [r for r in others.itertuples() if unequal_resources(r)]
    if unequal:
        parts.append(f"not speedups ({say(words.UNEQUAL)}: other cores or devices than the reference, so each is "
                     "judged per core or device): " + "; ".join(f"{r.technique} {unequal_text(r)}" for r in unequal))
    open_ = others[others["speedup_verdict"] == stats.INCONCLUSIVE]
    if len(open_):
        parts.append(f"speed {say(stats.INCONCLUSIVE)}: " + ", ".join(
            f"{r.technique} ({r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}])" for r in open_.itertuples()))
    return parts


def _memory_points(others: pd.DataFrame) -> list[str]:
    """The set with the least memory decided, and those left out as undecided below it."""
    smaller = others[others["mem_ratio_verdict"] == "less"]
    if not len(smaller):
        return []
    least = smaller.loc[smaller["mem_ratio"].astype(float).idxmin()]
    speed = (f", at {least['speedup']:.2f}x speed ({say(least['speedup_verdict'])})"
             if known(least["speedup"]) else "")
    lower = beyond_winner(undecided(others.itertuples(), "mem_ratio"), least["mem_ratio"], lower_wins=True)
    digits = tie_digits(lower, least["mem_ratio"])
    return [f"least memory{' decided' if lower else ''}: {least['technique']} at "
            f"{least['mem_ratio']:.{digits}f}x peak memory ({least['mem_ratio_source']}){speed}"
            + _left_out(lower, "lower", digits)]


def _left_out(items: list[Undecided], side: str, digits: int = 2) -> str:
    """What a superlative leaves out that measured beyond its winner, so it does not read as "the best set"."""
    if not items:
        return ""
    return f"; left out as undecided, though measured {side}: {left_out_text(items, digits)}"


def _mfu_points(rows: pd.DataFrame) -> list[str]:
    """The headline MFU of every set, against one peak for all (``bench.analyze.mfu``), first in the summary."""
    first = rows.iloc[0]
    values = [(r.technique, mfu.primary(r)) for r in rows.itertuples()]
    values = [(t, v) for t, v in values if v is not None]
    if not values or not first.get("mfu_peak_dtype"):
        return []
    sheet = known(first.get("mfu_sheet_peak")) and any(known(v) for v in rows["mfu_sheet"])
    peak = (f"datasheet {fmt_flops(first['mfu_sheet_peak'])}" if sheet
            else f"calibrated {fmt_flops(first['mfu_calibrated_peak'])}")
    also = "the calibrated peak and " if sheet else ""
    return [f"MFU against {mfu.chosen(first['mfu_peak_dtype'], str(first['mfu_peak_device']))}, {peak} "
            "(estimates, medians over seeds): " + ", ".join(f"{t} {fmt_pct(v)}" for t, v in values)
            + f"; the table gives it against {also}each set's own dtype too"]


def _quality_word(c: Any) -> str:
    """One phrase for a set's quality at equal samples."""
    if not c["n_final"]:
        return "not measured" if not c["n_cut"] else "not compared (cut)"
    if c["quality_same_exact"]:
        return f"{say(words.SAME)} (exact)"
    verdict = c["delta_verdict"]
    if verdict in (None, stats.NONE):
        return f"{c['metric']} {c['delta']:+.4f}, {say(stats.NONE)}" if known(c["delta"]) else "not compared"
    if verdict in (stats.EQUIVALENT, stats.INCONCLUSIVE):
        return f"{c['metric']} {c['delta']:+.4f}, {say(verdict)}"
    return f"{c['metric']} {say(verdict)} by {abs(c['delta']):.4f}"


def _quality_points(others: pd.DataFrame) -> list[str]:
    parts = []
    same = [r.technique for r in others.itertuples() if r.exact_quality == "identical"]
    drift = [f"{r.technique}, whose eval curves drift up to {r.curve_max_rel_diff:.1%} of the metric's range from "
             "the reference's (floating-point rounding amplified over the run: its first steps match the reference "
             "and its metric at the full budget is equivalent or its difference includes zero)"
             for r in others.itertuples() if r.exact_quality == "drift"]
    if same or drift:
        parts.append(f"{say(words.SAME)} quality at equal samples (exact): " + "; ".join(
            ([", ".join(same)] if same else []) + drift))
    for r in others.itertuples():
        if r.exact_quality in ("expected mismatch", "bug", "drift changes quality", "unverified drift"):
            parts.append(f"{r.technique}: {exact_drift(r)}")
    judged = [r for r in others.itertuples() if r.exact_quality not in ("identical", "drift") and r.n_final
              and known(r.delta) and not r.n_stopped]
    stopped = [r for r in others.itertuples() if r.n_stopped and known(r.delta)]
    if stopped:
        parts.append("metric where early stopping stopped, against the full run of the same seed: " + ", ".join(
            f"{r.technique} ({r.metric} {r.delta:+.4f}{interval(r.delta_lo, r.delta_hi, '+.4f')}, "
            f"{say(r.delta_verdict)}; {r.n_stopped}/{r.n_final} runs stopped)" for r in stopped))
    changed = [r for r in judged if r.delta_verdict in ("better", "worse")]
    if changed:
        parts.append("quality differs at equal samples: " + ", ".join(
            f"{r.technique} ({r.metric} {difference_cell(r).text})" for r in changed))
    alike = [r.technique for r in judged if r.delta_verdict == stats.EQUIVALENT and r.kind != "exact"]
    if alike:
        parts.append(f"{say(stats.EQUIVALENT)} quality at equal samples (the whole interval within the workload's "
                     "margin): " + ", ".join(alike))
    open_ = [r.technique for r in judged if r.delta_verdict == stats.INCONCLUSIVE and r.kind != "exact"]
    if open_:
        parts.append(f"quality at equal samples {say(stats.INCONCLUSIVE)} (neither a change nor equivalence "
                     "shown): " + ", ".join(open_))
    cut = [f"{r.technique} ({r.n_cut})" for r in others.itertuples() if r.n_cut]
    if cut:
        parts.append("quality runs cut by the safety cap, not compared: " + ", ".join(cut))
    return parts


def _ttt_points(rows: pd.DataFrame, others: pd.DataFrame) -> list[str]:
    ref = next((r for r in rows.itertuples() if r.is_reference), None)
    if ref is None or ref.target is None or not ref.n_ttt:
        return []
    if not known(ref.ttt_median) or not math.isfinite(ref.ttt_median):
        head = (f"the reference misses the target {ref.metric} {ref.target:g} in its median run "
                f"({round(ref.ttt_miss_rate * ref.n_ttt)}/{ref.n_ttt} missed)")
    else:
        head = (f"the reference reaches {ref.metric} {ref.target:g} in {fmt_secs(ref.ttt_median)} of training "
                f"({fmt_num(ref.stt_median)} samples; {round(ref.ttt_miss_rate * ref.n_ttt)}/{ref.n_ttt} missed)")
    sooner = [f"{r.technique} {r.ttt_ratio:.2f}x" for r in others.itertuples() if r.ttt_ratio_verdict == "sooner"]
    later = [f"{r.technique} {r.ttt_ratio:.2f}x" for r in others.itertuples() if r.ttt_ratio_verdict == "later"]
    missed = [r.technique for r in others.itertuples()
              if r.n_ttt and (not known(r.ttt_median) or not math.isfinite(r.ttt_median))]
    if sooner:
        head += f"; {say('sooner')}: " + ", ".join(sooner)
    if later:
        head += f"; {say('later')}: " + ", ".join(later)
    some = [f"{r.technique} ({round(r.ttt_miss_rate * r.n_ttt)}/{r.n_ttt})" for r in others.itertuples()
            if r.n_ttt and r.technique not in missed and known(r.ttt_miss_rate) and r.ttt_miss_rate > 0]
    if missed:
        head += "; median run misses the target: " + ", ".join(missed)
    if some:
        head += "; some runs miss it: " + ", ".join(some)
    return [f"time to target: {head}"]


def _headline(ctx: Context) -> list[tuple[str, list[str]]]:
    """(the workload, with its machine when several; what stands out there), per workload."""
    from bench.report.frontier import frontier_points  # it reads the analysis this module renders

    analysis = ctx.analysis
    out = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        others = rows[~rows["is_reference"].astype(bool)]
        caveats = [f"{r.technique}: {c}" for r in others.itertuples() for c in r.caveats]
        parts = _mfu_points(rows) + caveats + _speed_points(analysis, rows, others) + _quality_points(others)
        parts += _ttt_points(rows, others)
        parts += frontier_points(analysis, machine, workload)
        problems = [r for r in rows.itertuples() if r.problems or r.skip_reason]
        if problems:
            parts.append("not all trials ran: " + ", ".join(f"{r.technique} ({r.status})" for r in problems))
        out.append((ctx.where(workload, machine), parts or ["no results"]))
    return out


def _count(answers: pd.Series, order: tuple[str, ...]) -> str:
    counts = answers.fillna(stats.NONE).value_counts()
    return ", ".join(f"{say(w)} {int(counts[w])}" for w in order if w in counts)


def speed_answers(analysis: Analysis) -> pd.DataFrame:
    """The configurations with a speed comparison against the reference."""
    others = analysis.configs[~analysis.configs["is_reference"].astype(bool)]
    return others[[known(v) for v in others["speedup"]]]


def speed_decided(speed: pd.DataFrame) -> int:
    """How many speed answers are decided: a verdict, not undecided, and not across unequal resources (which is
    no speedup: bench.core.words.UNEQUAL)."""
    return sum(w not in (None, words.UNEQUAL, *stats.UNDECIDED) for w in speed["speedup_verdict"])


def decisions(analysis: Analysis) -> list[str]:
    """How decisive the data were: speed verdicts decided of those made, how many pairs a sequential design added,
    and how many quality comparisons the family made and kept after Holm's correction."""
    others = analysis.configs[~analysis.configs["is_reference"].astype(bool)]
    speed = speed_answers(analysis)
    out = []
    if len(speed):
        decided = speed_decided(speed)
        line = (f"Speed verdicts decided: {decided} of {len(speed)} ("
                + _count(speed["speedup_verdict"], ("faster", "slower", stats.EQUIVALENT, stats.INCONCLUSIVE,
                                                    stats.NONE, words.UNEQUAL)) + ")")
        added = int(sum(int(n or 0) for n in speed["n_added"]))
        caps = [int(c) for c in speed["max_looks"] if known(c)]
        if caps:
            line += (f"; a sequential design (--repeats auto, up to {max(caps)} pairs) added {added} speed-only "
                     f"pair(s) to {int(sum(int(n or 0) > 0 for n in speed['n_added']))} configuration(s)")
            futile = int(sum(bool(f) for f in speed["speedup_futile"] if known(f)))
            if futile:
                undecided = int(sum(w in stats.UNDECIDED for w in speed["speedup_verdict"]))
                line += (f"; {futile} of the {undecided} undecided {'is' if futile == 1 else 'are'} "
                         f"{say(words.FUTILE)}: even on an optimistic reading, the cap's pairs would not decide them "
                         "at the spread seen (a larger --max-repeats or a quieter machine might)")
        widths = [float(h) / float(lo) for lo, h in zip(speed["speedup_lo"], speed["speedup_hi"], strict=True)
                  if known(lo) and known(h) and lo > 0]
        if widths:
            line += f"; median interval width (hi/lo) {float(np.median(widths)):.2f}"
        out.append(line + ".")
    family = [int(n) for n in others.get("delta_family", pd.Series(dtype=object)) if known(n)]
    if family and max(family):
        judged = others[others["kind"] != "exact"]  # the family (bench.analyze.analysis.correct_family)
        kept = sum(w not in (None, *stats.UNDECIDED) for w in judged["delta_verdict"])
        dropped = int(sum(bool(d) for d in judged["delta_holm_dropped"] if known(d)))
        out.append(f"Quality at equal samples: {max(family)} comparisons, {kept} decided after Holm's correction "
                   f"for their number" + (f" ({dropped} chance-level decision(s) did not survive it)" if dropped
                                          else "") + ".")
    return out
