"""The end-of-sweep summary: one row per workload x technique set (the full report lives in bench.report).

The numbers come from ``bench.analyze.analysis`` (computed once, the same as the report's, through the one statistics
engine): speedup is the geometric mean of samples/s ratios against the reference set, paired by seed; quality is
judged at equal samples by the set's kind; time-to-target is a censored median (a miss counts as never).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.analyze import analysis, cost, mfu, stats
from bench.core.text import cell, escape
from bench.records.results import TrialRecord

BASELINE = analysis.BASELINE


@dataclass
class SummaryRow:
    workload: str
    techniques: str
    n_ok: int
    n_total: int
    samples_per_s: float | None
    speedup: str  # "1.20x faster", "0.85x (no verdict: 2 pairs ...)", "1 (reference)", "-"
    peak: str
    memory_ratio: str
    mfu: str  # the headline: against the device's peak (bench.analyze.mfu), "-" without an environment
    mfu_own: str  # against the calibrated peak of the set's own compute dtype
    one_off_s: float | None
    quality: str
    time_to_target: str
    parity: str
    note: str
    # the speed estimate behind ``speedup``, for the cost lines (``cost_lines``)
    is_reference: bool = False
    speedup_value: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    speedup_verdict: str | None = None
    speedup_why: str | None = None
    mfu_definition: str | None = None  # what the headline MFU divides by (bench.analyze.mfu.definition)


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def ratio_text(est: float | None, verdict: str | None) -> str:
    """``1.20x faster``, ``0.99x equivalent``, ``1.03x inconclusive``, ``0.85x (no verdict)``: every number with
    its verdict word, so an estimate is never read as a finding."""
    if not _ok(est):
        return "-"
    if verdict in (None, stats.NONE):
        return f"{est:.2f}x (no verdict)"
    return f"{est:.2f}x {verdict}"


@dataclass(frozen=True)
class Undecided:
    """A set a superlative leaves out: its estimate, interval and undecided verdict (inconclusive or no verdict)."""

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
    return [u for u in items if u.verdict in stats.UNDECIDED and _ok(u.value)
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
    left out and why, grouped by the reason their verdict gives."""
    groups: dict[str, list[str]] = {}
    for u in items:
        ci = f" [{u.lo:.2f}, {u.hi:.2f}]" if u.verdict == stats.INCONCLUSIVE and _ok(u.lo) and _ok(u.hi) else ""
        reason = u.verdict if u.verdict == stats.INCONCLUSIVE else stats.NONE + (f" ({u.why})" if u.why else "")
        groups.setdefault(reason, []).append(f"{u.name} ({u.value:.{digits}f}x{ci})")
    return "; ".join(f"{_and(names)}: {reason}" for reason, names in groups.items())


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def quality_text(c: Any) -> str:
    """Quality at equal samples, by kind: exact sets must reproduce the reference's curve."""
    if not c.n_ok or c.metric is None or (c.n_final == 0 and not c.n_cut):
        return "-"
    if c.n_final == 0:
        return f"not compared: {c.n_cut} run(s) cut by the safety cap"
    if c.is_reference:
        return f"{c.metric} {c.final_mean:.4g} ± {c.final_std:.2g}"
    if c.exact_quality == "identical":
        return "same (exact: curves match)"
    if c.exact_quality == "drift":
        return f"same (exact; curves drift {c.curve_max_rel_diff:.0%} by rounding)"
    if c.delta is None:
        return f"{c.metric} {c.final_mean:.4g}"
    text = f"{c.delta:+.4f} {c.delta_verdict or stats.NONE}"
    return text + (f" at stop ({c.n_stopped}/{c.n_final} stopped)" if c.n_stopped else "")


def ttt_text(c: Any) -> str:
    if c.target is None or not c.n_ttt:
        return "-"
    misses = round(c.ttt_miss_rate * c.n_ttt)
    if c.ttt_median is None or not math.isfinite(c.ttt_median):
        return f"missed ({misses}/{c.n_ttt})"
    text = f"{c.ttt_median:.2f} s"
    if c.ttt_lo is not None and c.ttt_hi is not None:
        text += f" [{c.ttt_lo:.2f}, {'miss' if not math.isfinite(c.ttt_hi) else f'{c.ttt_hi:.2f}'}]"
    if misses:
        text += f" ({misses}/{c.n_ttt} missed)"
    return text


def parity_text(c: Any) -> str:
    if c.parity_answer == "inconclusive":
        return "inconclusive"
    if c.parity_ok is None:
        return "n/a" if c.kind == "algorithmic" else "-"
    if c.parity_ok:
        return "ok"
    return "expected mismatch" if c.parity_note else "MISMATCH"


def design_of(sweep_dir: Path) -> int | None:
    """The cap of the sequential design a sweep directory's sweep.toml records (None: a fixed design, or none)."""
    try:
        return analysis.design_cap(tomllib.loads((Path(sweep_dir) / "sweep.toml").read_text()))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def env_of(sweep_dir: Path) -> dict[str, Any]:
    """A sweep directory's env.json (its peaks give the headline MFU), or {} when it has none or it is damaged."""
    try:
        env = json.loads((Path(sweep_dir) / "env.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return env if isinstance(env, dict) else {}


def summarize(records: list[TrialRecord], baseline: str = BASELINE, max_looks: int | None = None,
              env: Mapping[str, Any] | None = None) -> list[SummaryRow]:
    """One row per workload x technique set, the reference first in each workload; ``max_looks``: the sweep's
    sequential design (its cap), so the intervals are the report's; ``env``: the sweep's env.json, whose peaks the
    headline MFU divides by (without it the MFU column says "-" and only the own-dtype one is given)."""
    if not records:
        return []
    configs = analysis.configurations(analysis.records_frame(records, max_looks=max_looks), baseline)
    configs = mfu.with_mfu(configs, {"": env or {}})  # records_frame of bare records labels their machine ""
    rows = []
    for c in configs.itertuples():
        notes = [*c.caveats, *c.problems] + ([f"skipped: {c.skip_reason}"] if c.skip_reason else [])
        if c.n_contended:
            notes.append(f"{c.n_contended} timed window(s) shared the CPU with other processes (left out of the "
                         "speed numbers)")
        if not c.is_reference and c.speedup_verdict == stats.NONE and c.speedup_why:
            notes.append(f"no verdict: {c.speedup_why}")
        source = " (RSS)" if c.mem_ratio_source == "RSS" else ""
        rows.append(SummaryRow(
            workload=c.workload,
            techniques=c.technique,
            n_ok=c.n_ok,
            n_total=c.n_total,
            samples_per_s=c.sps_median,
            speedup=("1 (reference)" if c.sps_median else "-") if c.is_reference else
            ratio_text(c.speedup, c.speedup_verdict),
            peak=_bytes(c.peak_bytes) if _ok(c.peak_bytes) else (f"RSS {_bytes(c.peak_rss_bytes)}"
                                                                  if _ok(c.peak_rss_bytes) else "-"),
            memory_ratio=("1" if c.peak_bytes or c.peak_rss_bytes else "-") if c.is_reference else
            ratio_text(c.mem_ratio, c.mem_ratio_verdict) + (source if _ok(c.mem_ratio) else ""),
            mfu=mfu.cell_text(c),
            mfu_own=mfu.own_text(c),
            one_off_s=_one_off(c),
            quality=quality_text(c),
            time_to_target=ttt_text(c),
            parity=parity_text(c),
            note="; ".join(notes)[:300],
            is_reference=bool(c.is_reference),
            speedup_value=c.speedup if _ok(c.speedup) else None,
            speedup_lo=c.speedup_lo if _ok(c.speedup_lo) else None,
            speedup_hi=c.speedup_hi if _ok(c.speedup_hi) else None,
            speedup_verdict=c.speedup_verdict,
            speedup_why=c.speedup_why,
            mfu_definition=mfu.definition(c),
        ))
    return rows


def _one_off(c: Any) -> float | None:
    """The first step's excess plus the techniques' probes (LR range test, batch search): one-off costs."""
    parts = [v for v in (c.one_off_s, c.probe_s) if _ok(v)]
    return sum(parts) if parts else None


def _bytes(b: float | None) -> str:
    if not _ok(b):
        return "-"
    mib = b / 2**20
    return f"{mib:,.0f} MiB" if mib >= 100 else f"{mib:.1f} MiB" if mib >= 1 else f"{b / 1024:.0f} KiB"


COLUMNS = ["workload", "techniques", "ok", "samples/s", "speedup", "peak memory", "mem ratio",
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


LEGEND = ("Speedup and memory ratio: geometric mean over seeds of each trial's ratio to the reference set's trial "
          "of the same seed, with its verdict: faster, slower, less, more when the whole 95% interval clears the "
          "threshold (5% speed, 1% memory), equivalent when it lies wholly inside, inconclusive otherwise, "
          "'(no verdict)' for an estimate of fewer than 3 repeats. "
          "Quality at equal samples: every set trains the same samples from the same initial weights; an exact set "
          "must reproduce the reference's eval curve ('same'), others show the metric's difference at the full "
          "budget ('at stop' when early stopping ended runs: the metric where it stopped). Time to target: median "
          "training time (one-off cost excluded) over seeds, a miss counting as never, with an order-statistic "
          "interval of the median (its coverage is in the report). One-off: the first step's cost beyond a steady "
          "step (torch.compile's compilation) plus the techniques' probes (LR range test, batch search).")


def cost_lines(rows: list[SummaryRow], price_per_hour: float | None = None) -> list[str]:
    """One line per workload with a speed measurement: the set that trains a million samples cheapest, named only
    when its speedup over the reference is significant ("faster"); otherwise "no saving shown". At one price
    per machine-hour for every set, the cheapest per sample is the one with the most samples/s, so the relative
    cost (1/speedup) holds at any price; with ``price_per_hour`` the amounts are added (``bench.analyze.cost``)."""
    out = []
    for workload in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == workload]
        ref = next((r for r in mine if r.is_reference), None)
        if ref is None or not _ok(ref.samples_per_s):
            continue
        faster = [r for r in mine if not r.is_reference and r.speedup_verdict == "faster" and _ok(r.samples_per_s)
                  and _ok(r.speedup_value)]
        if not faster:
            out.append(f"{workload}: no saving shown (no set's speedup over {ref.techniques} cleared the "
                       f"{stats.THRESHOLDS['speed']:.0%} threshold with 95% confidence)")
            continue
        best = max(faster, key=lambda r: r.samples_per_s)
        s, lo, hi = best.speedup_value, best.speedup_lo, best.speedup_hi
        ci = f" [{lo:.2f}, {hi:.2f}]" if _ok(lo) and _ok(hi) and len({f"{v:.2f}" for v in (s, lo, hi)}) > 1 else ""
        higher = beyond_winner([Undecided(r.techniques, r.speedup_value, r.speedup_lo, r.speedup_hi,
                                          r.speedup_verdict, r.speedup_why) for r in mine
                                if not r.is_reference and r.speedup_verdict and _ok(r.speedup_value)], s)
        text = (f"{workload}: cheapest per million samples{' decided' if higher else ''}: {best.techniques} "
                f"({s:.2f}x{ci} faster than {ref.techniques}: {1 / s:.2f}x its cost per sample at any price")
        if higher:
            text += (f"; left out as undecided, though measured faster: "
                     f"{left_out_text(higher, tie_digits(higher, s))}")
        if price_per_hour is not None:
            saved, saved_lo, saved_hi = cost.saved_interval(price_per_hour, s, lo, hi)
            saved_ci = cost.interval_text(saved, saved_lo, saved_hi)
            mine_cost = cost.per_million_samples(price_per_hour, best.samples_per_s)
            ref_cost = cost.per_million_samples(price_per_hour, ref.samples_per_s)
            text += (f"; at {price_per_hour:g} per machine-hour {cost.money(mine_cost)} against "
                     f"{cost.money(ref_cost)} per million samples, {cost.money(saved)}{saved_ci} saved per 1,000 "
                     "training hours")
        out.append(text + ")")
    return out


def to_markdown(rows: list[SummaryRow], title: str = "Sweep summary", price_per_hour: float | None = None) -> str:
    """``summary.md``. Cells go through the report's escaping (``bench.core.text``): a reason such as
    ``<lambda>`` stays visible text and ``a|b`` cannot split a cell."""
    lines = [f"# {escape(title)}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(cell(c) for c in row_cells(row)) + " |")
    definitions = dict.fromkeys(r.mfu_definition for r in rows if r.mfu_definition)
    lines += ([""] + [escape(d) for d in definitions]) if definitions else []
    costs = cost_lines(rows, price_per_hour)
    if costs:
        lines += ["", "Cost per sample (one machine, the same price for every set):", ""]
        lines += [f"- {escape(line)}" for line in costs]
    lines += ["", LEGEND]
    return "\n".join(lines) + "\n"
