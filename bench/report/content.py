"""The report's content as plain data: headings, tables of text cells, lists, figures.

Both renderers (``markdown.py``, ``html.py``) draw the same ``Report``; neither computes a number. Every string here
is plain text, never markup: names from records and configs (a workload called ``<script>``) are escaped by the
renderer, markdown and HTML alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

import techniques
from bench.analyze import cost, mfu, stats, summary, time_spent
from bench.analyze.analysis import BREAKDOWN, EXACT_CURVE_RTOL, EXACT_QUALITY, MULTIPLY, Analysis
from bench.core.text import fmt_bytes, fmt_secs
from bench.measure.phases import PHASES
from bench.measure.stages import MEASURED, STAGES
from bench.records.results import PARITY_HARMLESS, PARITY_K_TOL, PARITY_TOLERANCES
from bench.report import reproduce as reproduce_mod
from techniques.base import Technique

# ---- data ---------------------------------------------------------------------------------------------------


@dataclass
class Cell:
    """A table cell: text, and a tone the HTML colours (good / bad / warn / muted); markdown ignores the tone."""

    text: str
    tone: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Cell]]
    wrap: tuple[int, ...] = ()  # columns whose long text may wrap (reasons, explanations)


@dataclass
class Figure:
    """A rendered figure: ``figures/<name>.png`` beside the markdown, embedded in the HTML."""

    name: str
    title: str
    caption: str
    png: bytes
    width: int = 0
    height: int = 0

    @property
    def path(self) -> str:
        return f"figures/{self.name}.png"


@dataclass
class WorkloadSection:
    title: str  # "mlp:tiny" (+ the machine when several)
    anchor: str
    about: str  # model, batch, data, metric and target
    table: Table
    notes: list[str] = field(default_factory=list)


@dataclass
class Headline:
    label: str  # the workload (and machine), shown strong
    points: list[str]


@dataclass
class Section:
    """A titled section: paragraphs, then a table (energy, cost)."""

    title: str
    anchor: str
    lines: list[str]
    table: Table | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    title: str
    subtitle: str
    machines: list[tuple[str, list[tuple[str, str]]]]  # (machine name, [(key, value)]) for the setup section
    sweep: list[tuple[str, str]]
    merge_note: str | None
    reproduce: list[str]
    headline: list[Headline]
    workloads: list[WorkloadSection]
    interactions: Table | None
    distributed: Table | None
    distributed_notes: list[str]
    tuning: Table | None  # what the techniques found (each technique's ``summarize``)
    claims: Table | None
    claims_note: str | None
    problems: Table | None
    noise: list[str]
    next_steps: list[str]
    method: list[str]
    figures: dict[str, Figure] = field(default_factory=dict)
    input_notes: list[str] = field(default_factory=list)  # what was wrong with the input and what was done about it
    phases: Table | None = None  # where a step's time goes, per set, with the bottleneck it points to
    energy: Section | None = None  # joules per sample and to the target, or why energy was not measured
    cost: Section | None = None  # only with a price per machine-hour
    decisions: list[str] = field(default_factory=list)  # how many verdicts the data decided, above the summary
    time_spent: Section | None = None  # where the sweep's time went: its trials' stages added up
    tuning_figures: list[str] = field(default_factory=list)  # the techniques' result curves, under their table


# ---- number formatting --------------------------------------------------------------------------------------


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def fmt_num(v: float | None) -> str:
    """Throughput-like numbers: thousands separators, about 3 significant digits."""
    if not _ok(v):
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_pct(v: float | None) -> str:
    if not _ok(v):
        return "-"
    return f"{v * 100:.1f}%" if v >= 0.01 else f"{v * 100:.2f}%"


def fmt_flops(f: float | None) -> str:
    if not _ok(f):
        return "-"
    if f >= 1e12:
        return f"{f / 1e12:.1f} TFLOP/s"
    return f"{f / 1e9:,.1f} GFLOP/s"


def _ratio_ci(est: float, lo: float | None, hi: float | None, verdict: str | None, why: str | None = None) -> str:
    ci = "" if not _ok(lo) or not _ok(hi) else (
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
    if not _ok(est):
        return Cell("-")
    return Cell(_ratio_ci(est, lo, hi, verdict, why), TONES.get(verdict or stats.NONE, ""))


def delta_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None,
               why: str | None = None) -> Cell:
    if not _ok(est):
        return Cell("-")
    ci = f" [{lo:+.4f}, {hi:+.4f}]" if _ok(lo) and _ok(hi) else ""
    if verdict in (None, stats.NONE):
        return Cell(f"{est:+.4f}{ci} (no verdict: {why or 'no interval'})", "muted")
    if verdict == stats.INCONCLUSIVE and why and "Holm" in why:  # a decision the family's correction undid
        return Cell(f"{est:+.4f}{ci} inconclusive ({why})", "muted")
    return Cell(f"{est:+.4f}{ci} {verdict}", TONES.get(verdict, ""))


# ---- cells of the workload table ----------------------------------------------------------------------------


def _sps(c: Any) -> Cell:
    if not _ok(c.sps_median):
        return Cell("-")
    spread = f"IQR {fmt_num(c.sps_iqr)}" if c.n_ok > 1 else "1 repeat"
    return Cell(f"{fmt_num(c.sps_median)} ({spread})", "warn" if c.noisy else "")


def _speedup(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
    return ratio_cell(c.speedup, c.speedup_lo, c.speedup_hi, c.speedup_verdict, c.speedup_why)


def _memory(c: Any) -> Cell:
    if _ok(c.peak_bytes):
        rss = f" (RSS {fmt_bytes(c.peak_rss_bytes)})" if _ok(c.peak_rss_bytes) else ""
        return Cell(f"{fmt_bytes(c.peak_bytes)}{rss}")
    if _ok(c.peak_rss_bytes):
        return Cell(f"RSS {fmt_bytes(c.peak_rss_bytes)}")
    return Cell("-")


def _mem_ratio(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
    cell = ratio_cell(c.mem_ratio, c.mem_ratio_lo, c.mem_ratio_hi, c.mem_ratio_verdict, c.mem_ratio_why)
    if c.mem_ratio_source == "RSS":
        cell.text += " (RSS)"
    return cell


def _breakdown(c: Any) -> Cell:
    if c.breakdown_skipped:
        return Cell(f"none: {c.breakdown_skipped}", "muted")
    values = [getattr(c, f"mem_{name}_bytes") for name in BREAKDOWN]
    if not any(_ok(v) for v in values):
        return Cell("-")
    scale, unit = (2**20, "MiB") if max(v for v in values if _ok(v)) >= 2**20 else (2**10, "KiB")
    text = " / ".join(f"{v / scale:.1f}" if _ok(v) else "-" for v in values) + f" {unit}"
    held = getattr(c, "mem_held", None)
    if held:  # what of "other" techniques keep resident, by name
        text += "; other holds " + ", ".join(f"{name} {b / scale:.1f}" for name, b in held.items())
    return Cell(text)


def _one_off(c: Any) -> Cell:
    if _ok(c.probe_s) and c.probe_s > 0:
        first = fmt_secs(c.one_off_s) if _ok(c.one_off_s) else "-"
        return Cell(f"{first} + probes {fmt_secs(c.probe_s)}", "warn")
    if not _ok(c.one_off_s):
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
                 if _ok(c.train_time_s) and _ok(c.equal_time_s) else "")
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
    if not _ok(c.delta_at_time):
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
    if not _ok(c.ttt_lo) or not _ok(c.ttt_hi):
        return "", ""
    high = fmt_secs(c.ttt_hi) if math.isfinite(c.ttt_hi) else "miss"
    return f" [{fmt_secs(c.ttt_lo)}, {high}]", f"{c.ttt_coverage:.0%} interval"


def ttt_cell(c: Any) -> Cell:
    """Censored median time-to-target (training clock, one-off excluded), misses, samples, and the ratio."""
    if c.target is None or not c.n_ttt:
        return Cell("-")
    misses = round(c.ttt_miss_rate * c.n_ttt)
    missed = f"{misses}/{c.n_ttt} missed"
    if not _ok(c.ttt_median) or not math.isfinite(c.ttt_median):
        return Cell(f"not reached: median is a miss ({missed})", "muted" if c.is_reference else "bad")
    interval, coverage = ttt_interval(c)
    asides = [coverage] if coverage else []
    one_off = (c.one_off_s if _ok(c.one_off_s) else 0.0) + (c.probe_s if _ok(c.probe_s) else 0.0)
    if one_off > 0.05 * c.ttt_median and math.isfinite(c.ttt_one_off_median):
        asides.append(f"{fmt_secs(c.ttt_one_off_median)} with one-off")
    text = fmt_secs(c.ttt_median) + interval + (f" ({'; '.join(asides)})" if asides else "")
    text += f"; {fmt_num(c.stt_median)} samples; {missed}"
    if c.is_reference or not _ok(c.ttt_ratio):
        why = f"; {c.ttt_ratio_why}" if c.ttt_ratio_why and not c.is_reference else ""
        return Cell(text + why)
    cell = ratio_cell(c.ttt_ratio, c.ttt_ratio_lo, c.ttt_ratio_hi, c.ttt_ratio_verdict, c.ttt_ratio_why)
    return Cell(f"{text}; {cell.text}", cell.tone)


def _parity(c: Any) -> Cell:
    """The set's parity answer (its worst trial's), that trial's checks against their tolerances, and how the loss
    tolerance was set: calibrated on the reference's harmless run, or the fixed one of records before that."""
    answer = c.parity_answer
    if c.kind == "algorithmic" and answer is None:
        return Cell("n/a (algorithmic: judged by quality)", "muted")
    if answer is None:
        return Cell("-")
    checks = [_parity_check("loss", c.parity_loss_diff, c.parity_loss_tol, c.parity_bug_loss_drift),
              _parity_check("distance", c.parity_distance_diff, c.parity_distance_tol, c.parity_bug_distance_drift)]
    if _ok(c.parity_harmless_drift):
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
    if _ok(bug) and bug <= tol:
        text += f" (a 10% LR bug: {bug:.1e}, no power)"
    return text


def _status(c: Any) -> Cell:
    text = c.status  # the reasons are in the failures table
    tone = "bad" if c.problems else ("muted" if c.skip_reason else "")
    if c.n_contended:
        text += f"; {c.n_contended} contended"
        tone = tone or "warn"
    return Cell(text, tone)


def workload_table(rows: pd.DataFrame, baseline: str) -> Table:
    metric = next((m for m in rows["metric"] if m), "metric")
    columns = ["technique set", "kind", "samples/s median (IQR)", f"speedup vs {baseline} [95% CI]", "peak memory",
               "memory ratio [95% CI]", "memory breakdown (" + " / ".join(BREAKDOWN) + ")",
               "MFU vs device peak (achieved)", "MFU own dtype", "one-off",
               f"{metric} at equal samples (mean ± std; difference [95% CI])", "time to target", "parity",
               "status"]
    body = []
    for c in rows.itertuples():
        body.append([Cell(c.technique), Cell(c.kind, "muted"), _sps(c), _speedup(c), _memory(c), _mem_ratio(c),
                     _breakdown(c), Cell(mfu.cell_text(c)), Cell(mfu.own_text(c), "muted"), _one_off(c),
                     quality_cell(c), ttt_cell(c), _parity(c), _status(c)])
    return Table(columns, body, wrap=(10, 11, 12))


# ---- the whole report ---------------------------------------------------------------------------------------


def _machine_names(analysis: Analysis) -> dict[str, str]:
    machines = analysis.machines
    if len(machines) == 1:
        return {machines[0]: ""}
    return {m: f"machine {i}" for i, m in enumerate(machines, 1)}


def _workload_info(analysis: Analysis, machine: str, workload: str) -> str:
    recs = [r for s in analysis.sweep.sources if s.machine == machine for r in s.records
            if f"{r.workload.get('name')}:{r.workload.get('size')}" == workload and r.workload.get("metric")]
    if not recs:
        return "no trial of this workload finished"
    wl = recs[0].workload
    parts = []
    source = wl.get("source")
    if isinstance(source, dict):  # a user's model (--model): which file, which version
        versions = {(r.workload.get("source") or {}).get("sha256") for r in recs}
        where = source.get("file") or source.get("module")
        parts.append(f"your model {where}:{source.get('function')} (sha256 {str(source.get('sha256'))[:12]})"
                     + (f"; WARNING: records from {len(versions)} versions of the file" if len(versions) > 1 else ""))
    if wl.get("n_params"):
        parts.append(f"{wl['n_params']:,} parameters")
    if wl.get("batch_size"):
        parts.append(f"batch {wl['batch_size']}")
    data = wl.get("dataset")
    if isinstance(data, dict) and data.get("name") and not isinstance(source, dict):
        parts.append(f"data {data['name']}")
    direction = "higher is better" if wl.get("higher_is_better", True) else "lower is better"
    metric = f"metric {wl.get('metric')} ({direction})"
    target = wl.get("target")
    if target is None and isinstance(wl.get("params"), dict):
        target = wl["params"].get("target")
    if target is not None:
        metric += f", validation target {target:g}"
    parts.append(metric)
    quality = [r.quality for r in recs if r.quality]
    if quality:
        q = quality[0]
        parts.append(f"quality budget {q.budget_samples:,} samples ({q.budget_steps:,} steps), evaluated at "
                     f"{len(q.curve) - 1} points")
    return "; ".join(parts)


def _machine_facts(env: dict[str, Any], label: str) -> list[tuple[str, str]]:
    facts = [("machine", label)]
    if not env:
        return facts + [("environment", "no env.json: hardware and software unknown")]
    gpu = env.get("gpu")
    if gpu:
        mem = f", {fmt_bytes(gpu.get('memory_bytes'))}" if gpu.get("memory_bytes") else ""
        facts.append(("GPU", f"{gpu.get('count', 1)} x {gpu.get('name')}{mem}, capability {gpu.get('capability')}"))
    cpu = env.get("cpu_model") or "unknown"
    cores = f"{env.get('cpu_logical')} logical / {env.get('cpu_physical')} physical cores"
    if env.get("cpu_affinity") and env.get("cpu_affinity") != env.get("cpu_logical"):
        cores += f", {env['cpu_affinity']} usable"
    flags = [f for f, on in (env.get("cpu_flags") or {}).items() if on]
    facts.append(("CPU", f"{cpu}; {cores}; {env.get('cpu_capability') or '?'}"
                         + (f"; flags {', '.join(flags)}" if flags else "")))
    if env.get("memory_total_bytes"):
        facts.append(("memory", fmt_bytes(env["memory_total_bytes"])))
    soft = [f"Python {env.get('python')}", f"torch {env.get('torch')}"]
    if env.get("torch_cuda"):
        soft.append(f"CUDA {env['torch_cuda']}")
    soft += [f"{k} {v}" for k, v in sorted((env.get("packages") or {}).items()) if v]
    facts.append(("software", ", ".join(soft)))
    if env.get("platform"):
        facts.append(("platform", str(env["platform"])))
    git = env.get("git") or {}
    if git.get("commit"):
        facts.append(("git commit", git["commit"] + (" (with uncommitted changes)" if git.get("dirty") else "")))
    peaks = env.get("peak_flops") or {}
    if peaks:
        items = []
        for dtype, p in peaks.items():
            if isinstance(p, dict):
                kernel = f" ({p.get('kernel')}, n={p.get('n')})" if p.get("kernel") else ""
                items.append(f"{dtype} {fmt_flops(p.get('flops'))}{kernel}")
        facts.append(("measured peak", "; ".join(items)))
    return facts


def _sweep_facts(analysis: Analysis) -> list[tuple[str, str]]:
    frame = analysis.frame
    sources = analysis.sweep.sources
    facts = [("sweep", ", ".join(dict.fromkeys(str(s) for s in frame["sweep_id"])))]
    facts.append(("workloads", ", ".join(dict.fromkeys(frame["workload"]))))
    facts.append(("technique sets", ", ".join(dict.fromkeys(frame["technique"]))))
    per = frame.groupby(["source", "workload", "technique"])["seed"].nunique()
    seeds = sorted(set(frame["seed"]))
    facts.append(("repeats", f"{int(per.max())} per configuration (seeds {', '.join(map(str, seeds))})"))
    facts.append(("device", ", ".join(dict.fromkeys(frame["device"]))))
    facts.append(("trials", f"{len(frame)} ({int((frame['status'] == 'ok').sum())} ok)"))
    modes = ", ".join(dict.fromkeys(frame["mode"]))
    facts.append(("measured", {"both": "speed and quality", "speed": "speed only (no quality runs)",
                               "quality": "quality only (no speed windows)"}.get(modes, modes)))
    notes: dict[str, int] = {}
    for ns in frame["notes"]:
        for note in ns:
            notes[note] = notes.get(note, 0) + 1
    for note, count in notes.items():
        facts.append(("note", f"{count} of {len(frame)} records: {note}"))
    for s in sources:
        budget = (s.settings or {}).get("budget")
        if budget:
            label = "budget" if len(sources) == 1 else f"budget ({s.name})"
            facts.append((label, ", ".join(f"{k}={v}" for k, v in budget.items())))
    stamps = sorted(t for t in frame["timestamp_utc"] if t)
    if stamps:
        first, last = (t.replace("T", " ").removesuffix("+00:00") for t in (stamps[0], stamps[-1]))
        facts.append(("date", f"{first} to {last} UTC" if first != last else f"{first} UTC"))
    return facts


def _speed_points(analysis: Analysis, rows: pd.DataFrame, others: pd.DataFrame) -> list[str]:
    if not any(_ok(v) for v in rows["sps_median"]) and not any(_ok(v) for v in rows["peak_bytes"]):
        if any(int(n or 0) for n in rows["n_contended"]):
            return ["speed not reported: every timed window here stayed contended (other processes used the cores; "
                    "see the status column): measure again on an idle machine"]
        if not int(sum(int(n or 0) for n in rows["n_ok"])):
            return ["nothing measured here: no trial of this workload finished ok (the status column says why)"]
        return ["speed and memory not measured here (quality runs only: --mode quality)"]
    parts = []
    faster = others[others["speedup_verdict"] == "faster"]
    if len(faster):
        best = faster.loc[faster["speedup"].astype(float).idxmax()]
        extra = []
        if _ok(best["mem_ratio"]):
            extra.append(f"peak memory {best['mem_ratio']:.2f}x" + (" (RSS)" if best["mem_ratio_source"] == "RSS"
                                                                    else ""))
        extra.append(f"quality: {_quality_word(best)}")
        if _ok(best["one_off_s"]) and best["one_off_s"] > 1.0:
            extra.append(f"one-off {fmt_secs(best['one_off_s'])}")
        higher = summary.beyond_winner(summary.undecided(others.itertuples(), "speedup"), best["speedup"])
        parts.append(f"fastest{' decided' if higher else ''}: {best['technique']} at "
                     f"{_ratio_ci(best['speedup'], best['speedup_lo'], best['speedup_hi'], 'faster')} "
                     f"({', '.join(extra)})"
                     + _left_out(higher, "higher", summary.tie_digits(higher, best["speedup"])))
    elif not any(int(r.n_ok) > 0 for r in rows.itertuples() if r.is_reference):
        parts.append(f"no speedups: the reference '{analysis.baseline}' has no successful trial here")
    elif len(others) and all(v in (None, stats.NONE) for v in others["speedup_verdict"]):
        why = next((w for w in others["speedup_why"] if w), "no interval")
        points = ", ".join(f"{r.technique} {r.speedup:.2f}x" for r in others.itertuples() if _ok(r.speedup))
        parts.append(f"no speed verdicts ({why})" + (f"; estimates only: {points}" if points else ""))
    elif len(others):
        parts.append(f"no technique set was faster than {analysis.baseline} by more than "
                     f"{analysis.thresholds.speed:.0%} with 95% confidence")
    smaller = others[others["mem_ratio_verdict"] == "less"]
    if len(smaller):
        least = smaller.loc[smaller["mem_ratio"].astype(float).idxmin()]
        speed = (f", at {least['speedup']:.2f}x speed ({least['speedup_verdict'] or stats.NONE})"
                 if _ok(least["speedup"]) else "")
        lower = summary.beyond_winner(summary.undecided(others.itertuples(), "mem_ratio"), least["mem_ratio"],
                                      lower_wins=True)
        digits = summary.tie_digits(lower, least["mem_ratio"])
        parts.append(f"least memory{' decided' if lower else ''}: {least['technique']} at "
                     f"{least['mem_ratio']:.{digits}f}x peak memory ({least['mem_ratio_source']}){speed}"
                     + _left_out(lower, "lower", digits))
    slower = others[others["speedup_verdict"] == "slower"]
    if len(slower):
        parts.append("slower than the reference: " + ", ".join(
            f"{r.technique} ({r.speedup:.2f}x)" for r in slower.itertuples()))
    same = others[others["speedup_verdict"] == stats.EQUIVALENT]
    if len(same):
        parts.append(f"as fast as the reference (equivalent: the whole interval within +-{analysis.thresholds.speed:.0%})"
                     ": " + ", ".join(f"{r.technique} ({r.speedup:.2f}x)" for r in same.itertuples()))
    open_ = others[others["speedup_verdict"] == stats.INCONCLUSIVE]
    if len(open_):
        parts.append("speed inconclusive: " + ", ".join(
            f"{r.technique} ({r.speedup:.2f}x [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}])" for r in open_.itertuples()))
    return parts


def _left_out(items: list[summary.Undecided], side: str, digits: int = 2) -> str:
    """What a superlative leaves out that measured beyond its winner, so it does not read as "the best set"."""
    if not items:
        return ""
    return f"; left out as undecided, though measured {side}: {summary.left_out_text(items, digits)}"


def _mfu_points(rows: pd.DataFrame) -> list[str]:
    """The headline MFU of every set, against one peak for all (``bench.analyze.mfu``), first in the summary."""
    first = rows.iloc[0]
    values = [(r.technique, mfu.primary(r)) for r in rows.itertuples()]
    values = [(t, v) for t, v in values if v is not None]
    if not values or not first.get("mfu_peak_dtype"):
        return []
    sheet = _ok(first.get("mfu_sheet_peak")) and any(_ok(v) for v in rows["mfu_sheet"])
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
        return "same (exact)"
    verdict = c["delta_verdict"]
    if verdict in (None, stats.NONE):
        return f"{c['metric']} {c['delta']:+.4f}, no verdict" if _ok(c["delta"]) else "not compared"
    if verdict in (stats.EQUIVALENT, stats.INCONCLUSIVE):
        return f"{c['metric']} {c['delta']:+.4f}, {verdict}"
    return f"{c['metric']} {verdict} by {abs(c['delta']):.4f}"


def _quality_points(others: pd.DataFrame) -> list[str]:
    parts = []
    same = [r.technique for r in others.itertuples() if r.exact_quality == "identical"]
    drift = [f"{r.technique}, whose eval curves drift up to {r.curve_max_rel_diff:.1%} of the metric's range from "
             "the reference's (floating-point rounding amplified over the run: its first steps match the reference "
             "and its metric at the full budget is equivalent or its difference includes zero)"
             for r in others.itertuples() if r.exact_quality == "drift"]
    if same or drift:
        parts.append("same quality at equal samples (exact): " + "; ".join(
            ([", ".join(same)] if same else []) + drift))
    for r in others.itertuples():
        if r.exact_quality in ("expected mismatch", "bug", "drift changes quality", "unverified drift"):
            parts.append(f"{r.technique}: {exact_drift(r)}")
    judged = [r for r in others.itertuples() if r.exact_quality not in ("identical", "drift") and r.n_final
              and _ok(r.delta) and not r.n_stopped]
    stopped = [r for r in others.itertuples() if r.n_stopped and _ok(r.delta)]
    if stopped:
        parts.append("metric where early stopping stopped, against the full run of the same seed: " + ", ".join(
            f"{r.technique} ({r.metric} {r.delta:+.4f}" + (f" [{r.delta_lo:+.4f}, {r.delta_hi:+.4f}]"
                                                           if _ok(r.delta_lo) else "")
            + f", {_verdict_words(r.delta_verdict)}; {r.n_stopped}/{r.n_final} runs stopped)" for r in stopped))
    changed = [r for r in judged if r.delta_verdict in ("better", "worse")]
    if changed:
        parts.append("quality differs at equal samples: " + ", ".join(
            f"{r.technique} ({r.metric} {r.delta:+.4f} [{r.delta_lo:+.4f}, {r.delta_hi:+.4f}] {r.delta_verdict})"
            for r in changed))
    alike = [r.technique for r in judged if r.delta_verdict == stats.EQUIVALENT and r.kind != "exact"]
    if alike:
        parts.append("equivalent quality at equal samples (the whole interval within the workload's margin): "
                     + ", ".join(alike))
    open_ = [r.technique for r in judged if r.delta_verdict == stats.INCONCLUSIVE and r.kind != "exact"]
    if open_:
        parts.append("quality at equal samples inconclusive (neither a change nor equivalence shown): "
                     + ", ".join(open_))
    cut = [f"{r.technique} ({r.n_cut})" for r in others.itertuples() if r.n_cut]
    if cut:
        parts.append("quality runs cut by the safety cap, not compared: " + ", ".join(cut))
    return parts


def _verdict_words(verdict: str | None) -> str:
    return verdict or stats.NONE


def _ttt_points(rows: pd.DataFrame, others: pd.DataFrame) -> list[str]:
    ref = next((r for r in rows.itertuples() if r.is_reference), None)
    if ref is None or ref.target is None or not ref.n_ttt:
        return []
    if not _ok(ref.ttt_median) or not math.isfinite(ref.ttt_median):
        head = (f"the reference misses the target {ref.metric} {ref.target:g} in its median run "
                f"({round(ref.ttt_miss_rate * ref.n_ttt)}/{ref.n_ttt} missed)")
    else:
        head = (f"the reference reaches {ref.metric} {ref.target:g} in {fmt_secs(ref.ttt_median)} of training "
                f"({fmt_num(ref.stt_median)} samples; {round(ref.ttt_miss_rate * ref.n_ttt)}/{ref.n_ttt} missed)")
    sooner = [f"{r.technique} {r.ttt_ratio:.2f}x" for r in others.itertuples() if r.ttt_ratio_verdict == "sooner"]
    later = [f"{r.technique} {r.ttt_ratio:.2f}x" for r in others.itertuples() if r.ttt_ratio_verdict == "later"]
    missed = [r.technique for r in others.itertuples()
              if r.n_ttt and (not _ok(r.ttt_median) or not math.isfinite(r.ttt_median))]
    if sooner:
        head += "; sooner: " + ", ".join(sooner)
    if later:
        head += "; later: " + ", ".join(later)
    some = [f"{r.technique} ({round(r.ttt_miss_rate * r.n_ttt)}/{r.n_ttt})" for r in others.itertuples()
            if r.n_ttt and r.technique not in missed and _ok(r.ttt_miss_rate) and r.ttt_miss_rate > 0]
    if missed:
        head += "; median run misses the target: " + ", ".join(missed)
    if some:
        head += "; some runs miss it: " + ", ".join(some)
    return [f"time to target: {head}"]


def _headline(analysis: Analysis, names: dict[str, str]) -> list[Headline]:
    from bench.report.frontier import frontier_points  # it reads the analysis this module renders

    out = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        label = workload + (f" ({names[machine]})" if names[machine] else "")
        others = rows[~rows["is_reference"].astype(bool)]
        caveats = [f"{r.technique}: {c}" for r in others.itertuples() for c in r.caveats]
        parts = _mfu_points(rows) + caveats + _speed_points(analysis, rows, others) + _quality_points(others)
        parts += _ttt_points(rows, others)
        parts += frontier_points(analysis, machine, workload)
        problems = [r for r in rows.itertuples() if r.problems or r.skip_reason]
        if problems:
            parts.append("not all trials ran: " + ", ".join(f"{r.technique} ({r.status})" for r in problems))
        out.append(Headline(label, parts or ["no results"]))
    return out


def _count(words: pd.Series, order: tuple[str, ...]) -> str:
    counts = words.fillna(stats.NONE).value_counts()
    return ", ".join(f"{w} {int(counts[w])}" for w in order if w in counts)


def decisions(analysis: Analysis) -> list[str]:
    """How decisive the data were: speed verdicts decided of those made, how many pairs a sequential design added,
    and how many quality comparisons the family made and kept after Holm's correction."""
    others = analysis.configs[~analysis.configs["is_reference"].astype(bool)]
    speed = others[[_ok(v) for v in others["speedup"]]]
    out = []
    if len(speed):
        decided = sum(w not in (None, *stats.UNDECIDED) for w in speed["speedup_verdict"])
        line = (f"Speed verdicts decided: {decided} of {len(speed)} ("
                + _count(speed["speedup_verdict"], ("faster", "slower", stats.EQUIVALENT, stats.INCONCLUSIVE,
                                                    stats.NONE)) + ")")
        added = int(sum(int(n or 0) for n in speed["n_added"]))
        caps = [int(c) for c in speed["max_looks"] if _ok(c)]
        if caps:
            line += (f"; a sequential design (--repeats auto, up to {max(caps)} pairs) added {added} speed-only "
                     f"pair(s) to {int(sum(int(n or 0) > 0 for n in speed['n_added']))} configuration(s)")
            futile = int(sum(bool(f) for f in speed["speedup_futile"] if _ok(f)))
            if futile:
                undecided = int(sum(w in stats.UNDECIDED for w in speed["speedup_verdict"]))
                line += (f"; {futile} of the {undecided} undecided {'is' if futile == 1 else 'are'} futile: even on an optimistic reading, the "
                         f"cap's pairs would not decide them at the spread seen (a larger --max-repeats or a quieter "
                         f"machine might)")
        widths = [float(h) / float(lo) for lo, h in zip(speed["speedup_lo"], speed["speedup_hi"], strict=True)
                  if _ok(lo) and _ok(h) and lo > 0]
        if widths:
            line += f"; median interval width (hi/lo) {float(np.median(widths)):.2f}"
        out.append(line + ".")
    family = [int(n) for n in others.get("delta_family", pd.Series(dtype=object)) if _ok(n)]
    if family and max(family):
        judged = others[others["kind"] != "exact"]  # the family (bench.analyze.analysis.correct_family)
        kept = sum(w not in (None, *stats.UNDECIDED) for w in judged["delta_verdict"])
        dropped = int(sum(bool(d) for d in judged["delta_holm_dropped"] if _ok(d)))
        out.append(f"Quality at equal samples: {max(family)} comparisons, {kept} decided after Holm's correction "
                   f"for their number" + (f" ({dropped} chance-level decision(s) did not survive it)" if dropped
                                          else "") + ".")
    return out


def _interactions_table(analysis: Analysis, names: dict[str, str]) -> Table | None:
    inter = analysis.interactions
    if inter.empty:
        return None
    rows = []
    for it in inter.itertuples():
        parts = ", ".join(f"{p} {fmt_ratio(s)}" for p, s in zip(it.components, it.parts, strict=True))
        verdict_tone = {MULTIPLY: "", "gains partly cancel": "warn",
                        "more than multiplicative": "good"}.get(it.verdict, "muted")
        observed = fmt_ratio(it.observed)
        ratio = "-"
        if _ok(it.ratio):
            ci = f" [{it.ratio_lo:.2f}, {it.ratio_hi:.2f}]" if _ok(it.ratio_lo) and _ok(it.ratio_hi) else ""
            ratio = f"{it.ratio:.2f}{ci}"
        verdict = it.verdict + (f" ({it.why})" if it.verdict == stats.NONE and it.why else "")
        rows.append([Cell(_where(it.workload, names[it.machine])), Cell(it.technique), Cell(parts),
                     Cell(fmt_ratio(it.product)), Cell(observed), Cell(ratio), Cell(verdict, verdict_tone)])
    return Table(["workload", "combination", "parts alone (speedup)", "product of parts", "observed",
                  "observed / product, paired by seed [95% CI]", "verdict"], rows, wrap=(6,))


def _per_rank(values: tuple[float, ...] | None) -> str:
    return " / ".join(fmt_bytes(v) for v in values) if values else "-"


def _distributed_table(analysis: Analysis, names: dict[str, str]) -> tuple[Table | None, list[str]]:
    """Multi-process sets (and their reference) per workload: throughput counted both ways, per-rank memory, and
    the per-rank model state beside the ZeRO paper's formula."""
    configs = analysis.configs
    multi = configs[configs["world_size"].map(lambda w: (w or 1) > 1)]
    if multi.empty:
        return None, []
    keys = set(zip(multi["machine"], multi["workload"], strict=True))
    rows, notes = [], []
    for c in configs.itertuples():
        if (c.machine, c.workload) not in keys or not ((c.world_size or 1) > 1 or c.is_reference):
            continue
        state, formula = c.model_state_bytes, c.zero_formula_bytes
        match = Cell("-")
        if _ok(state) and _ok(formula) and formula:
            ratio = state / formula
            match = Cell(f"{ratio:.3f}", "good" if abs(ratio - 1) <= 0.01 else "warn")
        clean = (f"{fmt_bytes(c.clean_rss_at_rest_bytes)} / {fmt_bytes(c.clean_rss_peak_bytes)}"
                 if _ok(c.clean_rss_at_rest_bytes) else "-")
        window_rss = _per_rank(c.rank_peak_rss_bytes) if c.rank_peak_rss_bytes else fmt_bytes(c.peak_rss_bytes)
        stage = "" if not _ok(c.zero_stage) else (f"ZeRO-{int(c.zero_stage)}" if c.zero_stage else "DDP")
        step = c.step_time_s
        step_text = f"{step * 1000:.1f} ms" if _ok(step) and step < 1 else fmt_secs(step)
        rows.append([Cell(_where(c.workload, names[c.machine])), Cell(c.technique), Cell(str(c.world_size or 1)),
                     Cell(fmt_num(c.sps_median)), Cell(fmt_num(c.sps_per_device_median)), Cell(step_text),
                     Cell(window_rss), Cell(clean), Cell(fmt_bytes(state)),
                     Cell(f"{fmt_bytes(formula)} ({stage})" if _ok(formula) else "-"), match, _status(c)])
        if c.zero_note:
            notes.append(f"{c.technique}: {c.zero_note}.")
    notes = list(dict.fromkeys(notes))
    notes.insert(0, "samples/s counts every rank's samples (the global batch); per device divides it by the ranks. "
                    "Peak RSS per rank is the timed window's high-water mark under glibc's default malloc, which "
                    "keeps freed blocks; the clean RSS pass after it returns freed memory at once, so at rest shows "
                    "what a rank holds between steps and peak a step's transient on top (the larger over ranks). Model "
                    "state is params + grads + optimizer state from each rank's local shards (the larger over "
                    "ranks), beside the ZeRO paper's formula for that stage, world size and fp32 AdamW.")
    if any(str(m).startswith("cpu") for m in multi["machine"]):
        notes.append("On one CPU machine the ranks share its cores (torchrun gives each rank one thread unless "
                     "--threads says otherwise): expect no speedup there; the memory columns are the point.")
    return Table(["workload", "set", "ranks", "samples/s", "per device", "step time", "peak RSS per rank",
                  "clean RSS at rest / peak", "model state per rank", "ZeRO formula", "measured / formula",
                  "status"], rows), notes


def fmt_ratio(v: float | None) -> str:
    return f"{v:.2f}x" if _ok(v) else "-"


def _where(workload: str, machine_name: str) -> str:
    return workload + (f" ({machine_name})" if machine_name else "")


def _claims_table(analysis: Analysis, names: dict[str, str]) -> Table | None:
    claims = analysis.claims
    if claims.empty:
        return None
    rows = []
    for cl in claims.itertuples():
        metric = {"speedup": "speedup", "model_state_ratio": "model state per rank vs a full replica"}.get(
            cl.metric, "peak memory ratio")
        measured = (_ratio_ci(cl.measured, cl.measured_lo, cl.measured_hi, "").strip() if _ok(cl.measured)
                    else "-")
        if cl.against:  # measured on top of the same set without the technique, not against the reference
            measured += f" over {cl.against}"
        if cl.unmet:
            measured += f"; not the claim's setting: {'; '.join(cl.unmet)}"
        verdict = {"within": "within the claim", "below": "below the claim", "above": "above the claim"}.get(
            cl.verdict, cl.verdict)
        if cl.verdict in (stats.INCONCLUSIVE, stats.NONE) and cl.why_not:
            verdict += f" ({cl.why_not})"
        tone = {"within": "good", "below": "bad" if cl.metric == "speedup" else "good",
                "above": "good" if cl.metric == "speedup" else "bad"}.get(cl.verdict, "muted")
        who = f"{cl.name} in {cl.technique}" if cl.against else cl.technique
        rows.append([Cell(who), Cell(_where(cl.workload, names[cl.machine])),
                     Cell(f"{metric} {cl.low:g}-{cl.high:g}x on {cl.setting}"), Cell(cl.source),
                     Cell(measured), Cell(verdict, tone), Cell("; ".join(cl.why) if cl.why else "-")])
    return Table(["technique", "workload", "published claim", "source", "measured here [95% CI]", "verdict",
                  "why this hardware may differ"], rows, wrap=(2, 3, 4, 5, 6))


def _problems_table(analysis: Analysis, names: dict[str, str]) -> Table | None:
    prob = analysis.problems
    if prob.empty:
        return None
    rows = []
    for r in prob.itertuples():
        tone = "muted" if r.status == "skipped" else "bad"
        rows.append([Cell(_where(r.workload, names[r.machine])), Cell(r.technique), Cell(str(r.seed)),
                     Cell(r.status, tone), Cell(r.reason or "(no reason recorded)")])
    return Table(["workload", "technique set", "seed", "status", "reason"], rows, wrap=(4,))


def _noise(analysis: Analysis, names: dict[str, str]) -> list[str]:
    out = []
    frame = analysis.frame
    ok = frame[frame["status"] == "ok"]
    n_cont = int(sum(bool(c) for c in ok["contended"]))
    if n_cont:
        out.append(f"{n_cont} of {len(ok)} timed windows shared the CPU with other processes (more than 10% of the "
                   "cores busy with foreign work) even after being measured again: they are left out of the speed "
                   "numbers and verdicts.")
    retried = int(sum(len(r) for r in ok["contention_retries"]))
    if retried:
        out.append(f"{retried} timed window(s) were measured again because other processes used the cores "
                   "(budget.contention_retries); only the last window of each trial counts.")
    for c in analysis.configs.itertuples():
        where = _where(c.workload, names[c.machine])
        why = []
        if c.noisy:
            why.append(f"IQR/median of samples/s over repeats is {c.sps_rel_iqr:.0%} (warning above "
                       f"{stats.NOISY_IQR_OVER_MEDIAN:.0%})")
        if c.n_contended:
            why.append(f"{c.n_contended} of {c.n_ok} timed windows were contended (left out of its speed numbers)")
        if why:
            out.append(f"{c.technique} on {where}: {'; '.join(why)}.")
        if c.n_cut:
            out.append(f"{c.technique} on {where}: the safety cap (max_train_seconds) cut {c.n_cut} of its quality "
                       "runs; they are left out of every quality comparison.")
    if not out:
        out.append("None: every configuration's spread is below the warning threshold and no timed window was "
                   "contended.")
    return out


def _next_steps(analysis: Analysis, names: dict[str, str]) -> list[str]:
    several = len(names) > 1
    out = [(f"[{names[f.machine]}] " if several else "") + f.text for f in analysis.findings]
    return out or ["Nothing stands out: no bottleneck or anomaly crossed a threshold."]


def _method(analysis: Analysis) -> list[str]:
    th = analysis.thresholds
    return [
        "Two measurements that never share a budget. Speed: a timed window after warm-up, device sync only at its "
        "edges. Quality: every set of a workload trains the same samples from the same initial weights and "
        "batches, evaluated (untimed) at the same sample counts. The first step's cost beyond a steady step "
        "(compilation) is a one-off, kept out of both and shown on its own.",
        f"Comparisons against '{analysis.baseline}' pair the trials of the same seed (same weights and batches, "
        f"run in the same repeat round; the order of the sets within a round is shuffled). Ratios are geometric "
        f"means with a {stats.CONFIDENCE:.0%} Student-t interval on the per-seed log-ratios (a percentile "
        "bootstrap over 3 seeds cannot reach beyond the extreme pair and covered the truth in 67% of simulated "
        f"cases); a sequential sweep (--repeats auto) adds speed-only pairs while a verdict is open and reads "
        "every look with a repeated confidence interval, which keeps its 95% over all looks up to the cap. No "
        f"verdict below {stats.MIN_REPEATS} repeats; otherwise four answers: a change when the whole interval lies "
        f"beyond the threshold ({th.speed:.0%} for speed, {th.memory:.0%} for memory, {th.time_to_target:.0%} for "
        "time-to-target, the workload's equivalence margin for the metric), equivalent when it lies wholly inside, "
        "inconclusive otherwise (with about how many pairs would decide it). The quality verdicts of this report "
        "are corrected for their number (Holm's step-down procedure).",
        "Samples/s: per trial, samples over the wall time of the timed window; the table shows the median over "
        "repeats and its IQR. MFU (Chowdhery et al. 2022, PaLM, appendix B): achieved FLOP/s = model FLOPs per "
        "step x steps / the window's wall time (the clock of samples/s), the FLOPs counted by torch's "
        "FlopCounterMode on the eager fp32 reference step (matmuls, convolutions and, on GPUs, attention; not "
        "nanoGPT's 6N + 12LTd per token formula: docs/methodology.md compares the two). The headline divides it "
        "by one peak for every set, the device's dense bfloat16 peak (datasheet and calibrated; a CPU's fastest "
        "calibrated dtype), as torchtitan and llm.c quote MFU; 'own dtype' "
        "divides by the calibrated peak of the set's own compute dtype, at the trial's thread count.",
        "Peak memory: the tensor-level peak from a tracked step (params, grads, optimizer state, activations, "
        "other temporaries) where it exists, with the process's peak RSS over the timed window beside it; "
        "torch.compile hides tensors from the tracker, so compiled sets have RSS only and their ratio says (RSS).",
        f"Quality at equal samples, by kind: an exact set must reproduce the reference's eval curve seed by seed "
        f"(every evaluation within {EXACT_CURVE_RTOL:.0%} of the range the reference's metric covered) and then "
        "reads 'same'; a "
        "numeric or algorithmic set shows the metric at the full budget, mean ± std over seeds, and its paired "
        "difference, and its metric at the reference's training clock of the same seed: a set that trained "
        "faster is trained on past its budget to that clock (a continuation; docs/methodology.md), or the cell "
        "says why it could not be.",
        "Time to target: the training clock (evaluation and one-off excluded) at the first evaluation that "
        "reached the workload size's validation target, median over seeds with a miss counted as never (as "
        "AlgoPerf scores it), with the miss rate and the samples it took; the ratio to the reference is given "
        "when neither side missed.",
        "Parity: the first optimizer steps against the eager fp32 reference (its own process, same seed and "
        "batches): losses, and the distance the parameters moved from their initial values (a 10% learning-rate "
        "change moves it by 10%). Both tolerances are calibrated per reference: "
        f"{PARITY_K_TOL:g} x the drift of the same steps from initial weights jittered by a harmless amount ("
        + "; ".join(f"{kind} sets: {name}" for kind, (name, _) in PARITY_HARMLESS.items()) + "), never below "
        "the fixed tolerances (loss, distance: "
        + "; ".join(f"{kind} {loss:.0e}, {dist:.0e}" for kind, (loss, dist) in PARITY_TOLERANCES.items()) + "). "
        "The reference also trains with the learning rate x 1.1: a check that this bug does not exceed has no "
        "power. The answer is mismatch when a check with power is exceeded, ok when every check with power passes, "
        "and inconclusive "
        "otherwise. Records written before the calibration were judged with the fixed tolerances alone, and say so.",
        f"Noise: a warning when IQR/median of per-trial samples/s exceeds {stats.NOISY_IQR_OVER_MEDIAN:.0%}, or "
        "when other processes used more than 10% of the CPU during a timed window.",
    ]


def build(analysis: Analysis, figures: dict[str, Figure] | None = None, input_notes: list[str] | None = None,
          price: cost.Price | None = None) -> Report:
    """The report's content from an analysis (and figures already rendered); ``input_notes`` are shown at the top.
    ``price`` (per machine-hour) replaces the one each sweep recorded, for the Cost section."""
    names = _machine_names(analysis)
    sweep = analysis.sweep
    machines = []
    for label in analysis.machines:
        facts = _machine_facts(sweep.machines.get(label, {}), label)
        machines.append((names[label] or "machine", facts))
    merge_note = None
    if len(sweep.sources) > 1:
        dirs = ", ".join(s.name for s in sweep.sources)
        if len(names) > 1:
            merge_note = (f"This report merges {len(sweep.sources)} sweeps ({dirs}) that ran on {len(names)} "
                          "different machines or software stacks. Their numbers are kept apart: every speedup, "
                          "ratio and difference compares trials on the same machine, and each table says which.")
        else:
            merge_note = (f"This report merges {len(sweep.sources)} sweeps ({dirs}) from the same machine and "
                          "software; their trials are pooled as repeats.")
    made = (reproduce_mod.command(s.env.get("command"), s.path, s.settings) for s in sweep.sources)
    reproduce = list(dict.fromkeys(line for line in made if line))
    reproduce.append("python -m bench report DIR" + (" DIR2 ..." if len(sweep.sources) > 1 else "")
                     + (f" --baseline {analysis.baseline}" if analysis.baseline != "baseline" else "")
                     + "   # re-renders this report from results.jsonl and env.json")

    sections = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        title = _where(workload, names[machine])
        notes = []
        if names[machine]:
            notes.append(f"Ran on {names[machine]}: {machine}.")
        notes += [d for d in [mfu.definition(rows.iloc[0])] if d]
        sections.append(WorkloadSection(title, _anchor(title), _workload_info(analysis, machine, workload),
                                        workload_table(rows, analysis.baseline), notes))

    claims_note = None
    if analysis.baseline != "baseline":
        claims_note = (f"Published claims are stated against plain fp32 training; this report's reference is "
                       f"'{analysis.baseline}', so the measured side of each claim is relative to it.")
    sweep_ids = ", ".join(dict.fromkeys(str(s) for s in analysis.frame["sweep_id"]))
    distributed, distributed_notes = _distributed_table(analysis, names)
    tuning = tuning_table(analysis.frame, lambda machine, workload: _where(workload, names[machine]))
    return Report(
        title=f"trainbench report: {sweep_ids}",
        subtitle=(f"{len(analysis.frame)} trials, {analysis.frame['workload'].nunique()} workloads, "
                  f"{analysis.frame['technique'].nunique()} technique sets, reference '{analysis.baseline}'"),
        machines=machines,
        sweep=_sweep_facts(analysis),
        merge_note=merge_note,
        reproduce=reproduce,
        headline=_headline(analysis, names),
        workloads=sections,
        interactions=_interactions_table(analysis, names),
        distributed=distributed,
        distributed_notes=distributed_notes,
        tuning=tuning,
        claims=_claims_table(analysis, names),
        claims_note=claims_note,
        problems=_problems_table(analysis, names),
        noise=_noise(analysis, names),
        next_steps=_next_steps(analysis, names),
        method=_method(analysis),
        figures=figures or {},
        input_notes=list(input_notes or []),
        phases=_phases_table(analysis, names),
        energy=energy_section(analysis, names),
        cost=cost_section(analysis, names, price),
        decisions=decisions(analysis),
        time_spent=time_section(analysis),
        tuning_figures=[t.result_curve.name for t in techniques.registry().values() if t.result_curve],
    )


def tuning_table(frame: pd.DataFrame, where: Callable[[str, str], str]) -> Table | None:
    """What the techniques found: one row per configuration and technique that reported results, in the words of
    the technique's own ``summarize`` (the seeds of a configuration side by side, in seed order); a technique this
    session has not registered (a plugin not loaded here) reads as the base class lists results: by their keys.
    ``where(machine, workload)`` names the configuration's place."""
    ok = frame[frame["status"] == "ok"]
    known = techniques.registry()
    rows = []
    for (machine, workload, technique), g in ok.groupby(["machine", "workload", "technique"], sort=False):
        per_name: dict[str, list[dict[str, Any]]] = {}
        for results in g.sort_values("seed")["technique_results"]:
            for name, found in (results or {}).items():
                per_name.setdefault(name, []).append(found)
        for name, found in per_name.items():
            text = known.get(name, Technique).summarize(found)
            rows.append([Cell(where(machine, workload)), Cell(technique), Cell(name), Cell(text)])
    if not rows:
        return None
    return Table(["where", "technique set", "technique", "what it found (seeds in order)"], rows, wrap=(3,))


def _phases_table(analysis: Analysis, names: dict[str, str]) -> Table | None:
    """Per set: the phase pass's step time, each phase's share, and the bottleneck the shares point to."""
    rows = analysis.configs[analysis.configs["phase_step_s"].notna()]
    if rows.empty:
        return None
    several = len(names) > 1
    body = []
    for r in rows.itertuples():
        cells = [Cell(_where(r.workload, names[r.machine]) if several else r.workload), Cell(r.technique),
                 Cell(f"{1e3 * r.phase_step_s:.2f} ms")]
        for phase in PHASES:
            share = getattr(r, f"phase_{phase}_share")
            cells.append(Cell(fmt_pct(share), "warn" if phase == "data" and _ok(share) and share >= 0.2 else ""))
        cells.append(Cell(r.phase_diagnosis or "-"))
        body.append(cells)
    return Table(["workload", "set", "step (phase pass)", *PHASES, "bottleneck"], body, wrap=(len(PHASES) + 3,))


# ---- energy and cost ----------------------------------------------------------------------------------------


def _window_energy(analysis: Analysis) -> dict[tuple[str, str, str], list[tuple[float, float | None, str]]]:
    """Per set, each usable trial's (J/sample, samples to target or None, counter): ok trials whose timed window
    had the cores to itself (a contended window's counters also counted the other processes) and measured joules.
    Samples in the window = samples/s x window seconds (= steps x the global batch)."""
    out: dict[tuple[str, str, str], list[tuple[float, float | None, str]]] = {}
    for source in analysis.sweep.sources:
        for r in source.records:
            e, sp = r.energy, r.speed
            if r.status != "ok" or e is None or e.joules is None or sp is None or sp.contended:
                continue
            samples = sp.samples_per_s * sp.window_s
            if not samples:
                continue
            q = r.quality
            stt = None
            if q is not None and not q.cut and q.target is not None:
                stt = math.inf if q.samples_to_target is None else float(q.samples_to_target)
            key = (source.machine, r.workload_label, r.technique_label)
            out.setdefault(key, []).append((cost.energy_per_sample(e.joules, samples), stt, e.source or "?"))
    return out


def _energy_unavailable(analysis: Analysis, names: dict[str, str]) -> dict[str, list[str]]:
    """Why energy was not measured, with the sets each reason applies to (records that have an energy section
    without joules)."""
    reasons: dict[str, list[str]] = {}
    for source in analysis.sweep.sources:
        for r in source.records:
            if r.status == "ok" and r.energy is not None and r.energy.joules is None:
                where = f"{_where(r.workload_label, names[source.machine])} {r.technique_label}"
                sets = reasons.setdefault(r.energy.reason or "no reason recorded", [])
                if where not in sets:
                    sets.append(where)
    return reasons


def energy_section(analysis: Analysis, names: dict[str, str]) -> Section | None:
    """Joules per sample and to the target per set where a counter measured them; one line per reason where none
    did, never an estimate. None when no record has an energy section (quality-only sweeps)."""
    if not any(r.energy is not None for r in analysis.sweep.records):
        return None
    measured = _window_energy(analysis)
    reasons = _energy_unavailable(analysis, names)
    rows = []
    for c in analysis.configs.itertuples():
        trials = measured.get((c.machine, c.workload, c.technique))
        if not trials:
            continue
        per_sample = float(np.median([t[0] for t in trials]))
        to_target = [cost.energy_to_target(t[0], t[1]) for t in trials if t[1] is not None]
        target = "-"
        if to_target:
            med = stats.censored_median([math.inf if v is None else v for v in to_target])
            misses = sum(v is None for v in to_target)
            target = ("miss" if med is None or not math.isfinite(med) else _joules(med)) + \
                (f" ({misses}/{len(to_target)} missed)" if misses else "")
        counters = ", ".join(dict.fromkeys(t[2] for t in trials))
        rows.append([Cell(_where(c.workload, names[c.machine])), Cell(c.technique),
                     Cell(f"{_joules(per_sample)}/sample (n={len(trials)})"), Cell(target), Cell(counters)])
    lines = []
    if rows:
        lines.append("Energy over the timed window, where a hardware counter measured it: joules per sample = the "
                     "window's joules / the samples trained in it (median over uncontended trials); to target = "
                     "each trial's joules per sample x the samples its quality run needed to reach the target, "
                     "median over seeds with a miss counted as never. The steady step's energy only: evaluation, "
                     "the one-off cost and idle time are not in it. What a counter covers: NVML the GPU board "
                     "(summed over the trial's GPUs), RAPL the CPU packages (read once per machine; RAPL's "
                     "separate DRAM domain is not added); neither counts the power supply, fans or cooling.")
    partial = bool(rows) or len(reasons) > 1  # then say which sets each reason covers
    for reason, where in reasons.items():
        lines.append(f"energy: unavailable ({reason})" + (f" for {', '.join(where)}" if partial else ""))
    table = Table(["workload", "set", "energy per sample", "energy to target", "counter"], rows) if rows else None
    return Section("Energy", "energy", lines, table)


def time_section(analysis: Analysis) -> Section | None:
    """Where the sweep's time went: every trial's stages (``TrialRecord.stages``) added up, the measured steps apart
    from the fixed cost. None when no trial ran."""
    frames = [f for f in (analysis.frame, analysis.continuations) if f is not None and not f.empty]
    rows = [row for f in frames for row in zip(f["wall_s"], f["stages"], f["inductor_cache"], strict=True)]
    spent = time_spent.time_spent((wall, stages) for wall, stages, _ in rows)
    if spent is None or not spent.trials:  # nothing ran, or only older trials without stage times
        return None
    lines = ["Each trial's wall time split into the stages its process and its launcher timed (the records' stages; "
             "docs/methodology.md, 'A trial's stages'). The measured steps are the timed windows and the quality "
             "runs' training; the rest is what the trials cost besides them."]
    lines.append(f"{spent.trials} trials took {fmt_secs(spent.wall_s)}: {fmt_secs(spent.measured_s)} "
                 f"({spent.share(spent.measured_s):.0%}) in measured steps, {fmt_secs(spent.fixed_s)} of fixed cost, "
                 f"{fmt_secs(spent.fixed_s / spent.trials)} per trial.")
    caches = [c for _, _, c in rows if c]
    if caches:
        lines.append(f"TorchInductor caches: {caches.count('cold')} trial(s) compiled from an empty cache (cold), "
                     f"{caches.count('warm')} loaded what an earlier trial of their set compiled (warm); the one-off "
                     "cost in the tables is the cold trials'.")
    if spent.unbroken:
        lines.append(f"{spent.unbroken} trial(s) ({fmt_secs(spent.unbroken_s)}) recorded no stage times (an older "
                     "trainbench): they are not in the table.")
    table = Table(["stage", "seconds", "share", "per trial", "what"], [
        [Cell(name + (" (measured)" if name in MEASURED else "")), Cell(fmt_secs(seconds)),
         Cell(f"{spent.share(seconds):.1%}"), Cell(fmt_secs(seconds / spent.trials)), Cell(STAGES.get(name, ""))]
        for name, seconds in spent.stages.items()], wrap=(4,))
    return Section("Where the sweep's time went", "time", lines, table)


def _joules(j: float) -> str:
    a = abs(j)
    if a >= 1e6:
        return f"{j / 1e6:.3g} MJ"
    if a >= 1e3:
        return f"{j / 1e3:.3g} kJ"
    if a >= 1:
        return f"{j:.3g} J"
    return f"{j * 1e3:.3g} mJ"


def _prices(analysis: Analysis, price: cost.Price | None) -> dict[str, cost.Price]:
    """The price per machine-hour of each machine: the one given to the report, else its first sweep's."""
    out: dict[str, cost.Price] = {}
    for source in analysis.sweep.sources:
        found = price or cost.from_settings(source.settings)
        if found is not None:
            out.setdefault(source.machine, found)
    return out


def _machines_used(analysis: Analysis, machine: str, world_size: int | None) -> int:
    """Machines a trial occupied: a multi-process trial of a multi-node sweep ran on ``nnodes`` of them."""
    if (world_size or 1) <= 1:
        return 1
    nnodes = [int((s.settings or {}).get("nnodes") or 1) for s in analysis.sweep.sources if s.machine == machine]
    return max(nnodes or [1])


def _saved_cell(c: Any, p: float, machines_ratio: float = 1.0) -> Cell:
    if c.is_reference:
        return Cell("reference", "muted") if c.n_ok else Cell("-")
    if not _ok(c.speedup):
        return Cell("-")
    lo = c.speedup_lo if _ok(c.speedup_lo) else None
    hi = c.speedup_hi if _ok(c.speedup_hi) else None
    saved, saved_lo, saved_hi = cost.saved_interval(p, c.speedup, lo, hi, machines_ratio)
    text = f"{cost.money(saved)}{cost.interval_text(saved, saved_lo, saved_hi)}"
    if machines_ratio != 1.0:  # faster on more machines can still cost more: the verdict is on the money
        if saved_lo is not None and saved_lo > 0:
            return Cell(f"{text} saved", "good")
        if saved_hi is not None and saved_hi < 0:
            return Cell(f"{text}: extra cost on {machines_ratio:g}x the machines", "bad")
        return Cell(f"{text} ({machines_ratio:g}x the machines; no saving shown: the interval includes 0)", "muted")
    if c.speedup_verdict in (None, stats.NONE):
        return Cell(f"{text} (no verdict: {c.speedup_why or 'no interval'})", "muted")
    if c.speedup_verdict == stats.EQUIVALENT:
        return Cell(f"no saving beyond the threshold (speed equivalent; {text})", "muted")
    if c.speedup_verdict == stats.INCONCLUSIVE:
        if saved_hi is not None and saved_hi < 0:  # slower for sure, though not by the threshold
            return Cell(f"{text}: extra cost (the speedup is inconclusive: below 1, not clear of the threshold)",
                        "muted")
        if saved_lo is not None and saved_lo > 0:
            return Cell(f"{text} saved (the speedup is inconclusive: above 1, not clear of the threshold)", "muted")
        return Cell(f"no saving shown: the speedup is inconclusive ({text})", "muted")
    if c.speedup_verdict == "faster":
        return Cell(f"{text} saved", "good")
    return Cell(f"{text}: extra cost", "bad")


def cost_section(analysis: Analysis, names: dict[str, str], price: cost.Price | None) -> Section | None:
    """Cost per million samples, to the target and of the quality run, and what the speedup saves per 1,000
    training hours (its interval mapped endpoint by endpoint); only where a price is known."""
    prices = _prices(analysis, price)
    if not prices:
        return None
    rows = []
    ref_machines = {(c.machine, c.workload): _machines_used(analysis, c.machine, c.world_size)
                    for c in analysis.configs.itertuples() if c.is_reference}
    for c in analysis.configs.itertuples():
        pr = prices.get(c.machine)
        if pr is None:
            continue
        p, machines = pr.per_hour, _machines_used(analysis, c.machine, c.world_size)
        per_million = cost.per_million_samples(p, c.sps_median, machines) if _ok(c.sps_median) and c.sps_median \
            else None
        target = "-"
        if c.target is not None and c.n_ttt and _ok(c.ttt_one_off_median):
            reached = cost.to_target(p, c.ttt_one_off_median, machines)
            target = "miss" if reached is None else cost.money(reached)
        run = cost.run_cost(p, c.train_time_s, machines) if _ok(c.train_time_s) else None
        rows.append([Cell(_where(c.workload, names[c.machine])), Cell(c.technique),
                     Cell(str(machines)), Cell(cost.money(per_million)), Cell(target), Cell(cost.money(run)),
                     _saved_cell(c, p, machines / ref_machines.get((c.machine, c.workload), 1))])
    bases = list(dict.fromkeys(f"{f'price ({names[m]})' if names[m] else 'price'}: {pr.basis}"
                               for m, pr in prices.items()))
    lines = bases + [
        "The price is per machine-hour (the whole instance, all its devices, whatever the trial used of it); a "
        "multi-process trial of a multi-node sweep counts its nodes as machines. Per million samples = price x "
        "machines / (median samples/s x 3600) x 1e6. To target = price x machines x the median time to target "
        "with the one-off cost (first-step excess and probes) / 3600; a median that misses has no cost ('miss'). "
        "Quality run = price x machines x its median training clock (evaluation excluded) / 3600. Cost to target "
        "and of the quality run are each set's own medians, not paired comparisons: whether a set reaches the "
        "target sooner is the paired time-to-target ratio and its verdict in the workload table. Saved per "
        "1,000 training hours = 1000 x price x (1 - machine ratio / speedup), negative when the set costs more; "
        "the speedup's 95% interval maps to the saving's endpoint by endpoint, and a speedup that is not "
        "significant saves nothing: it says so. The price prices this sweep's measured throughput: it is what "
        "these sets would cost on an instance of that price as fast as the machine that ran them, not a "
        "measurement of that instance."]
    table = Table(["workload", "set", "machines", "cost per million samples", "cost to target", "cost of quality run",
                   f"saved per 1,000 h vs {analysis.baseline} [95% CI]"], rows, wrap=(6,))
    return Section("Cost", "cost", lines, table)


def _anchor(text: str) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return "w-" + (slug or "workload")


__all__ = ["Cell", "Figure", "Headline", "Report", "Section", "Table", "WorkloadSection", "build"]
