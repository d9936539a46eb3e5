"""The report's content as plain data: headings, tables of text cells, lists, figures.

Both renderers (``markdown.py``, ``html.py``) draw the same ``Report``; neither computes a number. Every string here
is plain text, never markup: names from records and configs (a workload called ``<script>``) are escaped by the
renderer, markdown and HTML alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bench import stats
from bench.analysis import BREAKDOWN, Analysis, fewer_steps

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
    claims: Table | None
    claims_note: str | None
    problems: Table | None
    noise: list[str]
    next_steps: list[str]
    method: list[str]
    figures: dict[str, Figure] = field(default_factory=dict)


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


def fmt_bytes(b: float | None) -> str:
    if not _ok(b):
        return "-"
    mib = b / 2**20
    if mib >= 1024:
        return f"{mib / 1024:.2f} GiB"
    if mib >= 100:
        return f"{mib:.0f} MiB"
    if mib >= 1:
        return f"{mib:.1f} MiB"
    return f"{b / 1024:.0f} KiB"


def fmt_secs(s: float | None) -> str:
    if not _ok(s):
        return "-"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


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


def _ratio_ci(est: float, lo: float | None, hi: float | None, verdict: str | None) -> str:
    if not _ok(lo) or not _ok(hi):
        return f"{est:.2f}x (one repeat: no interval)"
    ci = "" if f"{lo:.2f}" == f"{hi:.2f}" == f"{est:.2f}" else f" [{lo:.2f}, {hi:.2f}]"
    return f"{est:.2f}x{ci} {verdict}"


TONES = {"faster": "good", "slower": "bad", "less": "good", "more": "bad", "better": "good", "worse": "bad",
         "sooner": "good", "later": "bad", "no significant difference": "muted", "not enough repeats": "muted"}


def ratio_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None) -> Cell:
    if not _ok(est):
        return Cell("-")
    return Cell(_ratio_ci(est, lo, hi, verdict), TONES.get(verdict or "", ""))


def delta_cell(est: float | None, lo: float | None, hi: float | None, verdict: str | None) -> Cell:
    if not _ok(est):
        return Cell("-")
    if not _ok(lo) or not _ok(hi):
        return Cell(f"{est:+.4f} (one repeat: no interval)", "muted")
    return Cell(f"{est:+.4f} [{lo:+.4f}, {hi:+.4f}] {verdict}", TONES.get(verdict or "", ""))


# ---- cells of the workload table ----------------------------------------------------------------------------


def _sps(c: Any) -> Cell:
    if not _ok(c.sps_median):
        return Cell("-")
    spread = f"IQR {fmt_num(c.sps_iqr)}" if c.n_ok > 1 else "1 repeat"
    return Cell(f"{fmt_num(c.sps_median)} ({spread})", "warn" if c.noisy else "")


def _speedup(c: Any) -> Cell:
    if c.is_reference:
        return Cell("1 (reference)", "muted") if c.n_ok else Cell("-")
    return ratio_cell(c.speedup, c.speedup_lo, c.speedup_hi, c.speedup_verdict)


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
    cell = ratio_cell(c.mem_ratio, c.mem_ratio_lo, c.mem_ratio_hi, c.mem_ratio_verdict)
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
    return Cell(" / ".join(f"{v / scale:.1f}" if _ok(v) else "-" for v in values) + f" {unit}")


def _final(c: Any) -> Cell:
    if not _ok(c.final_mean):
        return Cell("-")
    return Cell(f"{c.final_mean:.4f} ± {c.final_std:.4f}" + (f" (n={c.n_final})" if c.n_final != c.n_ok else ""))


def _delta(c: Any) -> Cell:
    if c.is_reference:
        return Cell("reference", "muted") if _ok(c.final_mean) else Cell("-")
    return delta_cell(c.delta, c.delta_lo, c.delta_hi, c.delta_verdict)


def _ttt(c: Any) -> Cell:
    if c.target is None or not c.n_ok:
        return Cell("-")
    if not c.n_reached:
        return Cell(f"not reached (0/{c.n_ok})", "muted")
    text = f"{fmt_secs(c.ttt_median)} ({c.n_reached}/{c.n_ok})"
    if _ok(c.ttt_speedup):
        verdict = c.ttt_speedup_verdict
        ci = (f" [{c.ttt_speedup_lo:.2f}, {c.ttt_speedup_hi:.2f}]" if c.ttt_speedup_lo is not None else "")
        text += f", {c.ttt_speedup:.2f}x{ci} {verdict}"
        return Cell(text, TONES.get(verdict or "", ""))
    return Cell(text)


def _parity(c: Any) -> Cell:
    if c.is_reference:
        return Cell("reference", "muted") if c.n_ok else Cell("-")
    if c.parity_kind == "algorithmic":
        return Cell("n/a (algorithmic: judged by accuracy)", "muted")
    if c.parity_ok is None:
        return Cell("-")
    diff = f"{c.parity_diff:.1e}" if _ok(c.parity_diff) else "?"
    tol = f"{c.parity_tol:.0e}" if _ok(c.parity_tol) else "?"
    if c.parity_ok:
        return Cell(f"ok ({diff} ≤ {tol})", "good")
    if c.parity_note:
        return Cell(f"differs ({diff} > {tol}); {c.parity_note}", "warn")
    return Cell(f"MISMATCH ({diff} > {tol})", "bad")


def _status(c: Any) -> Cell:
    text = c.status  # the reasons are in the failures table
    tone = "bad" if c.problems else ("muted" if c.skip_reason else "")
    if c.n_contended:
        text += f"; {c.n_contended} contended"
        tone = tone or "warn"
    return Cell(text, tone)


def workload_table(rows: pd.DataFrame, baseline: str) -> Table:
    metric = next((m for m in rows["metric"] if m), "metric")
    columns = ["technique set", "samples/s median (IQR)", f"speedup vs {baseline} [95% CI]", "peak memory",
               "memory ratio [95% CI]", "memory breakdown (" + " / ".join(BREAKDOWN) + ")", "MFU", f"final {metric} (mean ± std)",
               f"{metric} difference [95% CI]", "time to target", "parity", "status"]
    body = []
    for c in rows.itertuples():
        body.append([Cell(c.technique), _sps(c), _speedup(c), _memory(c), _mem_ratio(c), _breakdown(c),
                     Cell(fmt_pct(c.mfu)), _final(c), _delta(c), _ttt(c), _parity(c), _status(c)])
    return Table(columns, body)


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
    if wl.get("n_params"):
        parts.append(f"{wl['n_params']:,} parameters")
    if wl.get("batch_size"):
        parts.append(f"batch {wl['batch_size']}")
    data = wl.get("dataset")
    if isinstance(data, dict) and data.get("name"):
        parts.append(f"data {data['name']}")
    direction = "higher is better" if wl.get("higher_is_better", True) else "lower is better"
    metric = f"metric {wl.get('metric')} ({direction})"
    target = wl.get("params", {}).get("target") if isinstance(wl.get("params"), dict) else None
    target = next((r.accuracy.get("target") for r in recs if r.accuracy.get("target") is not None), target)
    if target is not None:
        metric += f", target {target:g}"
    parts.append(metric)
    steps = [r.accuracy.get("steps_trained") for r in recs if r.accuracy.get("steps_trained")]
    if steps:
        parts.append(f"{int(sorted(steps)[len(steps) // 2])} training steps per trial")
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


def _headline(analysis: Analysis, names: dict[str, str]) -> list[Headline]:
    out = []
    configs = analysis.configs
    for (machine, workload), rows in configs.groupby(["machine", "workload"], sort=False):
        label = workload + (f" ({names[machine]})" if names[machine] else "")
        others = rows[~rows["is_reference"].astype(bool)]
        faster = others[others["speedup_verdict"] == "faster"]
        parts = []
        if len(faster):
            best = faster.loc[faster["speedup"].astype(float).idxmax()]
            extra = []
            if _ok(best["mem_ratio"]):
                extra.append(f"peak memory {best['mem_ratio']:.2f}x")
            if best["delta_verdict"]:
                extra.append(f"{best['metric']}: {best['delta_verdict']}")
            parts.append(f"fastest: {best['technique']} at {_ratio_ci(best['speedup'], best['speedup_lo'], best['speedup_hi'], 'faster')}"
                         + (f" ({', '.join(extra)})" if extra else ""))
        elif not any(int(r.n_ok) > 0 for r in rows.itertuples() if r.is_reference):
            parts.append(f"no speedups: the reference '{analysis.baseline}' has no successful trial here")
        elif len(others) and all(v in (None, "not enough repeats") for v in others["speedup_verdict"]):
            points = ", ".join(f"{r.technique} {r.speedup:.2f}x" for r in others.itertuples() if _ok(r.speedup))
            parts.append("one repeat per set, so no intervals" + (f"; point estimates: {points}" if points else ""))
        elif len(others):
            parts.append(f"no technique set was significantly faster than {analysis.baseline}")
        smaller = others[others["mem_ratio_verdict"] == "less"]
        if len(smaller):
            least = smaller.loc[smaller["mem_ratio"].astype(float).idxmin()]
            speed = f", at {least['speedup']:.2f}x speed" if _ok(least["speedup"]) else ""
            parts.append(f"least memory: {least['technique']} at {least['mem_ratio']:.2f}x peak memory "
                         f"({least['mem_ratio_source']}){speed}")
        slower = others[others["speedup_verdict"] == "slower"]
        if len(slower):
            parts.append("slower than the reference: " + ", ".join(
                f"{r.technique} ({r.speedup:.2f}x)" for r in slower.itertuples()))
        worse = others[others["delta_verdict"] == "worse"]
        if len(worse):
            ref = next((r for r in rows.itertuples() if r.is_reference), None)
            fewer = {r.technique: fewer_steps(r, ref) for r in worse.itertuples()}
            parts.append("worse final metric: " + ", ".join(
                f"{r.technique} ({r.metric} {r.delta:+.4f} [{r.delta_lo:+.4f}, {r.delta_hi:+.4f}]"
                + (f"; {fewer[r.technique]})" if fewer[r.technique] else ")")
                for r in worse.itertuples()))
        problems = [r for r in rows.itertuples() if r.problems or r.skip_reason]
        if problems:
            parts.append("not all trials ran: " + ", ".join(f"{r.technique} ({r.status})" for r in problems))
        out.append(Headline(label, parts or ["no results"]))
    return out


def _interactions_table(analysis: Analysis, names: dict[str, str]) -> Table | None:
    inter = analysis.interactions
    if inter.empty:
        return None
    rows = []
    for it in inter.itertuples():
        parts = ", ".join(f"{p} {fmt_ratio(s)}" for p, s in zip(it.components, it.parts, strict=True))
        verdict_tone = {"gains multiply": "good", "gains partly cancel": "warn",
                        "more than multiplicative": "good"}.get(it.verdict, "muted")
        observed = ratio_cell(it.observed, it.observed_lo, it.observed_hi, "") if _ok(it.observed) else Cell("-")
        observed.tone = ""
        rows.append([Cell(_where(it.workload, names[it.machine])), Cell(it.technique), Cell(parts),
                     Cell(fmt_ratio(it.product)), Cell(observed.text.strip()),
                     Cell(f"{it.ratio:.2f}" if _ok(it.ratio) else "-"), Cell(it.verdict, verdict_tone)])
    return Table(["workload", "combination", "parts alone (speedup)", "product of parts", "observed [95% CI]",
                  "observed / product", "verdict"], rows, wrap=(6,))


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
        verdict = {"within": "within the claim", "below": "below the claim", "above": "above the claim"}.get(
            cl.verdict, cl.verdict)
        if cl.certain is False:
            verdict += " (not significant: the interval reaches the claimed range)"
        elif cl.certain is None and cl.verdict in ("below", "above"):
            verdict += " (no interval)"
        tone = {"within": "good", "below": "bad" if cl.metric == "speedup" else "good",
                "above": "good" if cl.metric == "speedup" else "bad"}.get(cl.verdict, "muted")
        if cl.certain is False:
            tone = "muted"
        rows.append([Cell(cl.technique), Cell(_where(cl.workload, names[cl.machine])),
                     Cell(f"{metric} {cl.low:g}-{cl.high:g}x on {cl.setting}"), Cell(cl.source),
                     Cell(measured), Cell(verdict, tone), Cell("; ".join(cl.why) if cl.why else "-")])
    return Table(["technique", "workload", "published claim", "source", "measured here [95% CI]", "verdict",
                  "why this hardware may differ"], rows, wrap=(2, 3, 5, 6))


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
                   "cores busy with foreign work): their throughput may be understated.")
    for c in analysis.configs.itertuples():
        where = _where(c.workload, names[c.machine])
        why = []
        if c.noisy:
            why.append(f"IQR/median of samples/s over repeats is {c.sps_rel_iqr:.0%} (warning above "
                       f"{stats.NOISY_IQR_OVER_MEDIAN:.0%})")
        if c.n_contended:
            why.append(f"{c.n_contended} of {c.n_ok} timed windows were contended")
        if why:
            out.append(f"{c.technique} on {where}: {'; '.join(why)}.")
        if c.n_budget_cut:
            out.append(f"{c.technique} on {where}: training was cut by the time budget in {c.n_budget_cut} of "
                       f"{c.n_ok} trials, so its final metric saw fewer steps.")
    if not out:
        out.append("None: every configuration's spread is below the warning threshold and no timed window was "
                   "contended.")
    return out


def _next_steps(analysis: Analysis, names: dict[str, str]) -> list[str]:
    several = len(names) > 1
    out = [(f"[{names[f.machine]}] " if several else "") + f.text for f in analysis.findings]
    return out or ["Nothing stands out: no bottleneck or anomaly crossed a threshold."]


def _method(analysis: Analysis) -> list[str]:
    return [
        f"Speedup: ratio of median samples/s against '{analysis.baseline}' on the same workload and machine. The "
        f"{stats.CONFIDENCE:.0%} interval is a percentile bootstrap over trials ({stats.N_RESAMPLES} resamples, "
        "fixed seed): each repeat is one process and one seed, the unit of replication. A ratio whose interval "
        "contains 1 (a difference whose interval contains 0) is reported as no significant difference.",
        "Samples/s: per trial, samples over the wall time of the timed window (after warm-up, device sync at its "
        "edges); the table shows the median over repeats and its IQR.",
        "Peak memory: the tensor-level peak from a tracked step (params, grads, optimizer state, activations, "
        "other temporaries) where it exists, with the process's peak RSS over the timed window beside it; "
        "torch.compile hides tensors from the tracker, so compiled sets have RSS only and their ratio says (RSS).",
        "MFU: model FLOPs per step (FlopCounterMode on the eager fp32 step) / median step time / this machine's "
        "measured matmul peak for the dtype in use (Chowdhery et al. 2022, PaLM, appendix B).",
        "Final metric: the last evaluation of each trial, mean ± sample standard deviation over seeds; the "
        "difference is a difference of means with a bootstrap interval.",
        "Time to target: training time (evaluation excluded) of the first evaluation that reached the workload's "
        "target, median over the trials that reached it; 'sooner' compares it with the reference's.",
        "Parity: the first losses against an eager fp32 reference with the same seed and batches; exact "
        "techniques must match within 1e-3 relative, numeric ones (reduced precision) within 5e-2.",
        f"Noise: a warning when IQR/median of per-trial samples/s exceeds {stats.NOISY_IQR_OVER_MEDIAN:.0%}, or "
        "when other processes used more than 10% of the CPU during a timed window.",
    ]


def build(analysis: Analysis, figures: dict[str, Figure] | None = None) -> Report:
    """The report's content from an analysis (and figures already rendered)."""
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
    reproduce = list(dict.fromkeys(s.env.get("command") for s in sweep.sources if s.env.get("command")))
    reproduce.append("python -m bench report DIR" + (" DIR2 ..." if len(sweep.sources) > 1 else "")
                     + (f" --baseline {analysis.baseline}" if analysis.baseline != "baseline" else "")
                     + "   # re-renders this report from results.jsonl and env.json")

    sections = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        title = _where(workload, names[machine])
        notes = []
        if names[machine]:
            notes.append(f"Ran on {names[machine]}: {machine}.")
        sections.append(WorkloadSection(title, _anchor(title), _workload_info(analysis, machine, workload),
                                        workload_table(rows, analysis.baseline), notes))

    claims_note = None
    if analysis.baseline != "baseline":
        claims_note = (f"Published claims are stated against plain fp32 training; this report's reference is "
                       f"'{analysis.baseline}', so the measured side of each claim is relative to it.")
    sweep_ids = ", ".join(dict.fromkeys(str(s) for s in analysis.frame["sweep_id"]))
    distributed, distributed_notes = _distributed_table(analysis, names)
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
        claims=_claims_table(analysis, names),
        claims_note=claims_note,
        problems=_problems_table(analysis, names),
        noise=_noise(analysis, names),
        next_steps=_next_steps(analysis, names),
        method=_method(analysis),
        figures=figures or {},
    )


def _anchor(text: str) -> str:
    slug = "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return "w-" + (slug or "workload")


__all__ = ["Cell", "Figure", "Headline", "Report", "Table", "WorkloadSection", "build"]
