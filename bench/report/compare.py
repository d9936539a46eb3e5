"""``compare.md``: two sweeps compared, configuration by configuration, every answer worded by the one vocabulary.

The comparison itself is ``bench.analyze.compare`` (the one pairing, the one verdict engine); this module only draws
it. Text from the inputs (names, reasons, env.json values) goes through the report's escaping (``bench.core.text``),
so ``<lambda>`` shows as text and ``a|b`` cannot split a cell.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.analyze import stats
from bench.analyze.compare import Comparison, MetricComparison
from bench.analyze.stats import Estimate
from bench.core import words
from bench.core.text import cell, escape
from bench.core.words import say


def _fmt_estimate(est: Estimate | None) -> str:
    if est is None or est.value is None:
        return "-"
    fmt = ".3f" if est.log else "+.4f"
    text = format(est.value, fmt)
    if est.has_interval:
        text += f" [{est.lo:{fmt}}, {est.hi:{fmt}}]"
    return text + (f" ({est.n} pairs)" if est.paired else "")


def _fmt_verdict(verdict: str, why: str | None, regression: bool) -> str:
    """Markdown: a regression in bold (the rest escaped, since ``why`` can quote a record)."""
    word = say(words.NOT_COMPARABLE) if verdict == "not comparable" else say(verdict)
    text = f"**{cell(word)}**" if regression else cell(word)
    return f"{text} ({cell(why)})" if why and verdict in (stats.NONE, "not comparable") else text


def _fmt_value(q: MetricComparison) -> str:
    def one(v: float | None) -> str:
        if v is None:
            return "-"
        if q.unit.startswith("bytes"):
            return f"{v / 2**20:,.1f} MB"
        if q.quantity == "throughput":
            return f"{v:,.0f}"
        return f"{v:.4g}"

    return f"{one(q.base_median)} -> {one(q.new_median)}"


def _fmt_env_value(v: Any) -> str:
    if v is None:
        return "(absent)"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


COLUMNS = ["configuration", "n (base/new)", "throughput", "ratio [95% CI]", "noise", "samples/s",
           "peak memory", "ratio [95% CI]", "memory", "metric at equal samples", "difference [95% CI]", "metric",
           "notes"]


def to_markdown(comp: Comparison, title: str = "Comparison") -> str:
    """``compare.md``. Text from the inputs (names, reasons, env.json values) goes through the report's escaping
    (``bench.core.text``), so ``<lambda>`` shows as text and ``a|b`` cannot split a cell."""
    base = comp.base_dir or "BASE"
    new = comp.new_dir or "NEW"
    lines = [f"# {escape(title)}", "", f"BASE: `{base}`  ", f"NEW: `{new}`  ",
             f"Thresholds: throughput {comp.threshold:.1%}, peak memory {stats.THRESHOLDS['memory']:.0%}, the metric "
             "any difference. A change counts when its whole 95% interval lies beyond its threshold (the data show "
             "a change at least that large); noise is the spread of a side's trials (IQR / median).", ""]
    for note in comp.input_notes:
        lines += [f"**Input:** {cell(note)}", ""]
    mismatch = comp.environment_mismatch
    if mismatch:
        lines += ["**Environments differ** (a verdict below may come from the environment, not the code):", ""]
        lines += [f"- `{d.key}`: {cell(_fmt_env_value(d.base))} vs {cell(_fmt_env_value(d.new))}" for d in mismatch]
        lines.append("")
    else:
        lines += ["Environments match (device, library versions, CPU/GPU, threads; from env.json).", ""]
    if comp.settings:
        lines += ["**Sweep settings differ** (sweep.toml):", ""] + [f"- {cell(s)}" for s in comp.settings] + [""]
    if comp.peak_moves:
        lines += ["**The machine's peak moved** (each sweep calibrates its matmul peaks when it starts):", ""]
        lines += [f"- {cell(m)}" for m in comp.peak_moves] + [""]
    for kind, text in (("measured", "Calibrated peak FLOP/s differ by more than 10% (a measurement: contention "
                                    "or another machine)"),
                       ("code", "Code"), ("other", "Other env.json differences")):
        diffs = [d for d in comp.env if d.kind == kind]
        if diffs:
            lines += [f"{text}: " + "; ".join(
                f"`{d.key}` {cell(_fmt_env_value(d.base))} vs {cell(_fmt_env_value(d.new))}" for d in diffs), ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in comp.rows:
        cells = [cell(row.key.label), f"{row.n_base}/{row.n_new}"]
        for q in row.quantities:
            cells += [_fmt_verdict(q.verdict, q.why, q.regression), cell(_fmt_estimate(q.estimate))]
            if q.quantity == "throughput":
                cells.append("-" if q.noise is None else f"{q.noise:.1%}")
            cells.append(cell(_fmt_value(q)))
        cells.append(cell("; ".join(row.notes)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if comp.only_base:
        lines.append("Only in BASE (not compared): " + ", ".join(cell(k.label) for k in comp.only_base))
    if comp.only_new:
        lines.append("Only in NEW (not compared): " + ", ".join(cell(k.label) for k in comp.only_new))
    floor = comp.noise_floor()
    if floor is not None:
        spreads = [r.throughput.noise for r in comp.rows if r.throughput.noise is not None]
        lines.append(f"Measured noise: per-trial throughput spread (IQR / median, the larger side) is "
                     f"{statistics.median(spreads):.1%} in the median configuration and {floor:.1%} at most.")
    counts = defaultdict(int)
    for row in comp.rows:
        counts[row.throughput.verdict] += 1
    lines.append("Throughput answers: " + ", ".join(f"{say(v)} {n}" for v, n in sorted(counts.items())) + ".")
    if comp.overall:
        lines += ["", "**Overall** (geometric mean of NEW / BASE over the configurations above):", ""]
        for o in comp.overall:
            lines.append(f"- {o.quantity}: {_fmt_estimate(o.estimate)} over {o.estimate.n} configurations: "
                         f"{_fmt_verdict(o.verdict, o.why, o.regression)} ({o.estimate.method})")
    lines += ["", "Ratios are NEW / BASE: geometric means of per-trial values (one trial = one process = one seed) "
              f"with {_interval_words(comp.max_looks)} on their logs, paired by seed and repeat where both sides ran the "
              "same trials (in `sweep --ab`, the two runs of a trial back to back), Welch otherwise; "
              f"{say(stats.NONE)} below 3 trials. "
              "Memory compares the tensor-level (or CUDA allocator) peak when every trial has one, else peak RSS. "
              "The metric is the quality run's metric at the full sample budget, compared as a difference NEW - BASE "
              "in the workload's direction."]
    return "\n".join(lines) + "\n"


def _interval_words(max_looks: int | None) -> str:
    """The method sentence's interval: a fixed design's t interval, or a sequential design's repeated one."""
    if max_looks is None:
        return "a 95% t interval"
    return (f"a 95% repeated confidence interval (the sweeps' sequential design, `--repeats auto` up to {max_looks} "
            "pairs: speed-only pairs were added while a verdict was open, and this interval keeps its coverage over "
            "every look, see `bench.analyze.sequential`; the metric compares the planned quality runs)")
