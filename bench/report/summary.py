"""The end of a sweep: ``summary.md`` beside the records, and what the terminal shows.

Both read one analysis (``bench.analyze.analysis``, the report's): one row per workload x technique set, every
answer worded by ``bench.report.cells``. summary.md holds every column; the terminal holds what fits 100 columns (the
set, the speedup with its interval and answer, memory, quality at equal samples, and a flag where a row's numbers do
not say everything), then how many answers were decided, the findings that matter, and where the report is.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.analyze import analysis, cost, mfu, stats, time_spent
from bench.core import words
from bench.core.files import write_atomic
from bench.core.text import cell, escape
from bench.records import reader
from bench.records.frame import records_frame
from bench.records.results import TrialRecord
from bench.report import cells
from bench.report.sections.summary import decisions

BASELINE = analysis.BASELINE
WIDTH = 100  # a terminal's columns: no row of the terminal summary is longer


@dataclass
class SummaryRow:
    """One workload x set, every column as text (summary.md's row), with the speed estimate behind ``speedup`` for
    the cost lines."""

    workload: str
    techniques: str
    n_ok: int
    n_total: int
    samples_per_s: float | None
    speedup: str
    peak: str
    memory_ratio: str
    mfu: str  # the headline: against the device's peak (bench.analyze.mfu), "-" without an environment
    mfu_own: str  # against the calibrated peak of the set's own compute dtype
    one_off_s: float | None
    quality: str
    time_to_target: str
    parity: str
    note: str
    is_reference: bool = False
    speedup_value: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    speedup_verdict: str | None = None
    speedup_why: str | None = None
    mfu_definition: str | None = None  # what the headline MFU divides by (bench.analyze.mfu.definition)


def configurations(records: Sequence[TrialRecord], baseline: str = BASELINE, max_looks: int | None = None,
                   env: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The analysis's configurations of bare records (no sweep directory): ``max_looks`` the sequential design's cap,
    ``env`` the machine's env.json (its peaks give the headline MFU; without it the MFU column says "-")."""
    configs = analysis.configurations(records_frame(list(records), max_looks=max_looks), baseline)
    return mfu.with_mfu(configs, {"": env or {}})  # records_frame of bare records labels their machine ""


def summarize(records: Sequence[TrialRecord], baseline: str = BASELINE, max_looks: int | None = None,
              env: Mapping[str, Any] | None = None) -> list[SummaryRow]:
    """summary.md's rows of bare records (``configurations``)."""
    return rows_of(configurations(records, baseline, max_looks, env)) if records else []


def rows_of(configs: pd.DataFrame) -> list[SummaryRow]:
    """One row per workload x set, the reference first in each workload."""
    rows = []
    for c in configs.itertuples():
        notes = [*c.caveats, *c.problems] + ([f"skipped: {c.skip_reason}"] if c.skip_reason else [])
        if c.n_contended:
            notes.append(f"{c.n_contended} timed window(s) shared the CPU with other processes (left out of the "
                         "speed numbers)")
        if not c.is_reference and c.speedup_verdict == stats.NONE and c.speedup_why:
            notes.append(f"{cells.say(stats.NONE)}: {c.speedup_why}")
        if c.clock_contended:
            notes.append(c.clock_contended)
        rows.append(SummaryRow(
            workload=c.workload, techniques=c.technique, n_ok=c.n_ok, n_total=c.n_total, samples_per_s=c.sps_median,
            speedup=cells.speed_brief(c), peak=_peak(c), memory_ratio=cells.memory_brief(c),
            mfu=mfu.cell_text(c), mfu_own=mfu.own_text(c), one_off_s=_one_off(c),
            quality=cells.quality_brief(c), time_to_target=cells.ttt_brief(c), parity=cells.parity_brief(c),
            note="; ".join(notes)[:300], is_reference=bool(c.is_reference),
            speedup_value=_known(c.speedup), speedup_lo=_known(c.speedup_lo), speedup_hi=_known(c.speedup_hi),
            speedup_verdict=c.speedup_verdict, speedup_why=c.speedup_why, mfu_definition=mfu.definition(c)))
    return rows


def _known(v: Any) -> float | None:
    return float(v) if cells.known(v) else None


def _peak(c: Any) -> str:
    if cells.known(c.peak_bytes):
        return cells.fmt_bytes(c.peak_bytes)
    return f"RSS {cells.fmt_bytes(c.peak_rss_bytes)}" if cells.known(c.peak_rss_bytes) else "-"


def _one_off(c: Any) -> float | None:
    """The first step's excess plus the techniques' probes (LR range test, batch search): one-off costs."""
    parts = [v for v in (c.one_off_s, c.probe_s) if cells.known(v)]
    return sum(parts) if parts else None


COLUMNS = ["workload", "techniques", "ok", "samples/s", "speedup [95% CI]", "peak memory", "memory ratio [95% CI]",
           "MFU vs device peak (achieved)", "MFU own dtype", "one-off s", "quality at equal samples",
           "time to target", "parity", "notes"]


def row_cells(row: SummaryRow) -> list[str]:
    return [
        row.workload, row.techniques, f"{row.n_ok}/{row.n_total}",
        "-" if row.samples_per_s is None else f"{row.samples_per_s:,.0f}",
        row.speedup, row.peak, row.memory_ratio, row.mfu, row.mfu_own,
        "-" if row.one_off_s is None else f"{row.one_off_s:.2f}", row.quality, row.time_to_target, row.parity,
        row.note or "",
    ]


def legend(rows: Sequence[SummaryRow]) -> str:
    """What the words of this summary mean (those it uses, from ``bench.core.words``), and how it was measured."""
    used = " ".join(f"{r.speedup} {r.memory_ratio} {r.quality} {r.time_to_target} {r.parity}" for r in rows)
    entries = [w for w in words.glossary() if _uses(used, w.text)]
    head = ("Ratios are geometric means over pairs (a trial of the set and one of the reference with the same seed), "
            "with a 95% interval; quality compares the metric after the same samples; time to target is the median "
            "training time (one-off cost excluded) with a miss counted as never. The words of this summary:")
    return "\n".join([head, "", *(f"- {cells.say(w)}: {words.definition(w)}" for w in entries)])


def _uses(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def cost_lines(rows: Sequence[SummaryRow], price_per_hour: float | None = None) -> list[str]:
    """One line per workload with a speed measurement: the set that trains a million samples cheapest, named only
    when its speedup over the reference is decided "faster"; otherwise "no saving shown". At one price per
    machine-hour for every set, the cheapest per sample is the one with the most samples/s, so the relative cost
    (1/speedup) holds at any price; with ``price_per_hour`` the amounts are added (``bench.analyze.cost``)."""
    out = []
    for workload in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == workload]
        ref = next((r for r in mine if r.is_reference), None)
        if ref is None or ref.samples_per_s is None:
            continue
        faster = [r for r in mine if not r.is_reference and r.speedup_verdict == "faster"
                  and r.samples_per_s is not None and r.speedup_value is not None]
        if not faster:
            out.append(f"{workload}: {cells.say(words.NO_SAVING)} (no set's speedup over {ref.techniques} cleared "
                       f"the {stats.THRESHOLDS['speed']:.0%} threshold with 95% confidence)")
            continue
        best = max(faster, key=lambda r: r.samples_per_s or 0.0)
        s, lo, hi = best.speedup_value, best.speedup_lo, best.speedup_hi
        higher = cells.beyond_winner([cells.Undecided(r.techniques, r.speedup_value, r.speedup_lo, r.speedup_hi,
                                                      r.speedup_verdict, r.speedup_why) for r in mine
                                      if not r.is_reference and r.speedup_verdict and r.speedup_value is not None], s)
        text = (f"{workload}: cheapest per million samples{' decided' if higher else ''}: {best.techniques} "
                f"({cells.ratio_text(s, lo, hi, 'faster')} than {ref.techniques}: {1 / s:.2f}x its cost per "
                "sample at any price")
        if higher:
            text += (f"; left out as undecided, though measured faster: "
                     f"{cells.left_out_text(higher, cells.tie_digits(higher, s))}")
        if price_per_hour is not None:
            saved, saved_lo, saved_hi = cost.saved_interval(price_per_hour, s, lo, hi)
            mine_cost = cost.per_million_samples(price_per_hour, best.samples_per_s)
            ref_cost = cost.per_million_samples(price_per_hour, ref.samples_per_s)
            text += (f"; at {price_per_hour:g} per machine-hour {cost.money(mine_cost)} against "
                     f"{cost.money(ref_cost)} per million samples, {cost.money(saved)}"
                     f"{cost.interval_text(saved, saved_lo, saved_hi)} saved per 1,000 training hours")
        out.append(text + ")")
    return out


def to_markdown(rows: Sequence[SummaryRow], title: str = "Sweep summary", price_per_hour: float | None = None,
                lines_before: Sequence[str] = ()) -> str:
    """``summary.md``. Cells go through the report's escaping (``bench.core.text``): a reason such as
    ``<lambda>`` stays visible text and ``a|b`` cannot split a cell."""
    lines = [f"# {escape(title)}", ""] + [escape(line) + "\n" for line in lines_before]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(c) for c in row_cells(row)) + " |" for row in rows]
    definitions = dict.fromkeys(r.mfu_definition for r in rows if r.mfu_definition)
    lines += ([""] + [escape(d) for d in definitions]) if definitions else []
    costs = cost_lines(rows, price_per_hour)
    if costs:
        lines += ["", "Cost per sample (one machine, the same price for every set):", ""]
        lines += [f"- {escape(line)}" for line in costs]
    lines += ["", *(escape(line) if not line.startswith("- ") else "- " + escape(line[2:])
                    for line in legend(rows).splitlines())]
    return "\n".join(lines) + "\n"


# ---- the terminal ---------------------------------------------------------------------------------------------

# (heading, width) of the terminal's columns after the set's name; two spaces between columns.
TERMINAL_COLUMNS = (("speed vs {ref} [95% CI]", 31), ("peak memory", 18), ("quality, equal samples", 22))
NAME_WIDTH = WIDTH - 2 - sum(w + 2 for _, w in TERMINAL_COLUMNS) - 3  # the rest, less the indent and the flag


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns with an ellipsis, padded to it; the brackets ``say`` writes under
    ``marked()`` take no column, and a bracketed word is never cut."""
    shown = text.replace(words.MARK_OPEN, "").replace(words.MARK_CLOSE, "")
    if len(shown) <= width:
        return text + " " * (width - len(shown))
    cut, seen, inside = [], 0, False
    for ch in text:
        if ch in (words.MARK_OPEN, words.MARK_CLOSE):
            inside = ch == words.MARK_OPEN
            cut.append(ch)
            continue
        if seen >= width - 1 and not inside:
            break
        cut.append(ch)
        seen += 1
    return "".join(cut) + "…"


def terminal(configs: pd.DataFrame, findings: Sequence[str] = (), decided: Sequence[str] = (),
             paths: Sequence[str] = (), width: int = WIDTH) -> list[str]:
    """The summary as a terminal shows it: one line per workload and per set, no line longer than ``width``; then
    each flagged row's reason, how many answers were decided, the findings that matter and the paths to read on."""
    ref = next((c.technique for c in configs.itertuples() if c.is_reference), BASELINE)
    head = "  " + "set".ljust(NAME_WIDTH) + "".join(
        "  " + title.format(ref=ref).ljust(w) for title, w in TERMINAL_COLUMNS)
    out, notes = [head.rstrip()], []
    for workload, rows in configs.groupby("workload", sort=False):
        out.append(_fit(str(workload), width).rstrip())
        for c in rows.itertuples():
            values = (cells.speed_terse(c), cells.memory_terse(c), cells.quality_terse(c))
            flagged = cells.flags(c)
            line = "  " + _fit(c.technique, NAME_WIDTH) + "".join(
                "  " + _fit(v, w) for v, (_, w) in zip(values, TERMINAL_COLUMNS, strict=True))
            out.append((line + (" !" if flagged else "")).rstrip())
            notes += [f"! {c.technique} on {workload}: {'; '.join(flagged)}"] if flagged else []
    out += [_fit(n, width).rstrip() for n in notes]
    for block in (decided, findings):
        if block:
            out.append("")
        for text in block:
            out += textwrap.wrap(text, width, subsequent_indent="  ")
    if paths:
        out.append("")
        out += list(paths)
    return out


# ---- the sweep directory ----------------------------------------------------------------------------------------


@dataclass
class Summary:
    """What the end of a sweep says: summary.md's rows and path, and the terminal's lines (without the report's
    paths, which the caller adds once the report is written)."""

    rows: list[SummaryRow]
    path: Path
    configs: pd.DataFrame
    findings: list[str]
    decided: list[str]

    def terminal(self, paths: Sequence[str] = (), width: int = WIDTH) -> list[str]:
        return terminal(self.configs, self.findings, self.decided, [f"summary: {self.path}", *paths], width)


FINDINGS_SHOWN = 3  # the terminal's findings; the report's "What to try next" has them all


def markdown_of(out_dir: Path, title: str, price_per_hour: float | None = None) -> str:
    """summary.md of a sweep directory as it stands (the sides of an A/B run, a committed example re-rendered)."""
    result = analysis.analyze(reader.load([Path(out_dir)]))
    return to_markdown(rows_of(result.configs), title, price_per_hour, lines_before=decisions(result))


def write_summary(out_dir: Path, records: Sequence[TrialRecord], wall_s: float, name: str,
                  price_per_hour: float | None = None) -> Summary:
    """summary.md beside the records of ``out_dir`` (read back through the one reader, so its numbers are the
    report's), with cost amounts when a price is known; returns what the terminal shows."""
    out_dir = Path(out_dir)
    result = analysis.analyze(reader.load([out_dir]))
    rows, decided = rows_of(result.configs), decisions(result)
    found = [f.text for f in result.findings][:FINDINGS_SHOWN]
    md = to_markdown(rows, title=f"Sweep '{name}' summary", price_per_hour=price_per_hour, lines_before=decided)
    md += f"\nWall time of this invocation: {wall_s:.0f} s. Records: {len(records)} in results.jsonl.\n"
    spent = time_spent.summary_line(time_spent.of_records(records))
    md += f"\n{spent}\n" if spent else ""
    path = out_dir / "summary.md"
    write_atomic(path, md)
    return Summary(rows, path, result.configs, found, decided)
