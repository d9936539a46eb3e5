"""Generate the docs tables that quote measured numbers from the committed example reports, so the docs can never
say what the reports do not.

    .venv/bin/python -m bench.dev.docs_tables            # rewrites every generated block in the docs
    .venv/bin/python -m bench.dev.docs_tables --check    # exit 1 when a block is out of date (a test runs this)

Each table lives in a marked block of its document::

    <!-- generated: NAME (python -m bench.dev.docs_tables; from reports/...) -->
    | ... the table ... |
    <!-- end generated -->

and is rendered from that report's ``results.jsonl`` through the analysis (``bench.records.reader.load`` + ``analyze``),
with the report's own cell wording (``bench.report.cells``): every comparison carries the verdict word
``bench.analyze.stats.verdict`` gave it (faster/slower, equivalent, inconclusive, no verdict), and a quality verdict that
did not survive Holm's correction over the report's comparisons says so. Two tables come from the technique registry
instead of a report, so a new technique cannot be missing from them: docs/techniques.md's table (name, kind,
options, summary) and docs/commands.md's table of what each technique's row in "What the techniques found" says
(its ``summarize`` docstring); one from the committed reports' env.json files: docs/examples.md's machines, each
named by its fingerprint (``machine_name``); one from the GPU check's plan: docs/gpu.md's cost of the check, part by
part (``bench.plan.gpu.check_plan`` with the first H200 run's costs). The README's result tables open with their machine's fingerprint line.
Only the block's body is rewritten; the prose around it is the author's.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

import techniques
from bench.analyze import analysis
from bench.core import words
from bench.core.files import REPO_DIR
from bench.core.words import say
from bench.dev import docs_figures
from bench.measure.env import datasheet_peak
from bench.records import reader
from bench.report import cells, frontier
from bench.report.cells import fmt_bytes, fmt_num, fmt_pct, fmt_secs
from techniques.base import Kind, Technique

ROOT = REPO_DIR
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.-]+)[^\n]*-->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


@dataclass(frozen=True)
class Spec:
    """One generated table: the document it lives in, the report directory it is rendered from, and how."""

    doc: str  # relative to the repository root
    report: str | None  # a directory holding results.jsonl, relative to the root; None: drawn from the registry
    render: Callable[[Any], list[str]]  # given the report's analysis (None for a registry table)


# ---- cells: every answer worded by bench.report.cells, as the report words it ---------------------------------


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _speed(c: Any) -> str:
    """samples/s with the speedup and its answer in brackets (the reference: 1)."""
    if not _ok(c.sps_median):
        return "-"
    ratio = "1" if c.is_reference else cells.speed_brief(c)
    return f"{fmt_num(c.sps_median)} ({ratio}{_contended(c)})"


def _contended(c: Any) -> str:
    """Windows shared with other processes are left out of the speedup: say how many, as the report's status does."""
    return f"; {c.n_contended} contended window(s) left out" if c.n_contended else ""


def _memory(c: Any) -> str:
    return "1 (reference)" if c.is_reference else cells.memory_brief(c)


def _one_off(c: Any) -> str:
    return cells.one_off_cell(c).text  # the report's own cell: first-step excess, "+ probes"


def _table(columns: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *("| " + " | ".join(r) + " |" for r in esc)]


def _rows(a: analysis.Analysis, workload: str | None = None, order: tuple[str, ...] = ()) -> pd.DataFrame:
    """The configurations of one workload (default: all), in the report's order, or with the sets named in
    ``order`` first in that order (the reading order of the doc's prose)."""
    configs = a.configs if workload is None else a.configs[a.configs["workload"] == workload]
    rank = {label: i for i, label in enumerate(order)}
    keys = [(w, rank.get(t, len(rank)), i) for i, (w, t) in enumerate(zip(configs["workload"], configs["technique"],
                                                                          strict=True))]
    return configs.iloc[sorted(range(len(configs)), key=keys.__getitem__)]


def _step(s: Any) -> str:
    return f"{s * 1000:.1f} ms" if _ok(s) and s < 1 else fmt_secs(s)


# ---- machines -------------------------------------------------------------------------------------------------


def machine_name(env: dict[str, Any]) -> str:
    """A machine named by what it is, from its env.json: the GPU, or the CPU model with the instruction sets that
    decide its low-precision speed ("AMD EPYC (AVX2 only)", "AMD EPYC (AVX-512, avx512_bf16)", "Intel Xeon (AMX)").
    Every doc names a machine this way; "the project's 2-core VM" has been three different CPUs."""
    gpu = env.get("gpu") or {}
    if gpu.get("name"):
        return f"{gpu.get('count', 1)} x {gpu['name']}"
    model = re.sub(r"\((?:R|TM)\)|\bProcessor\b|\bCPU\b", "", str(env.get("cpu_model") or "unknown CPU"))
    flags = {f for f, on in (env.get("cpu_flags") or {}).items() if on}
    if "amx_bf16" in flags:
        isa = "AMX"
    elif "avx512_bf16" in flags:
        isa = "AVX-512, avx512_bf16"
    elif "avx512f" in flags:
        isa = "AVX-512, no avx512_bf16"
    elif "avx2" in flags:
        isa = "AVX2 only"
    else:
        isa = str(env.get("cpu_capability") or "ISA unknown")
    return f"{' '.join(model.split())} ({isa})"


def _peaks(env: dict[str, Any]) -> str:
    """The calibrated matmul peaks, largest first: TFLOP/s on a GPU, GFLOP/s on a CPU."""
    peaks = {d: p["flops"] for d, p in (env.get("peak_flops") or {}).items() if isinstance(p, dict) and p.get("flops")}
    unit, scale = ("TFLOP/s", 1e12) if (env.get("gpu") or {}).get("name") else ("GFLOP/s", 1e9)
    return ", ".join(f"{d} {v / scale:,.0f}" for d, v in sorted(peaks.items(), key=lambda kv: -kv[1])) + f" {unit}"


def fingerprint(env: dict[str, Any]) -> str:
    """One line naming the machine a report ran on: what it is, its cores or memory, the software, the date and the
    calibrated matmul peaks (at the trials' thread count), all from env.json."""
    gpu = env.get("gpu") or {}
    size = (f"{gpu['memory_bytes'] / 2**30:,.0f} GiB, compute capability {gpu.get('capability', '?')}"
            if gpu.get("memory_bytes") else f"{env.get('cpu_logical', '?')} cores")
    when = str(env.get("timestamp_utc", ""))[:10]
    threads = "" if gpu.get("name") else f" at {env.get('torch_threads', '?')} threads"
    return (f"Machine (env.json): {machine_name(env)}, {size}; torch {env.get('torch', '?')}; {when}; calibrated "
            f"matmul peaks{threads}: {_peaks(env)}.")


EXAMPLE_LINK = re.compile(r"reports/([\w.-]+)")


def named_examples(root: Path | None = None) -> list[Path]:
    """The example folders under reports/ that README.md and docs/*.md name: the committed examples. A user's own
    sweeps (runs/, or anything else left under reports/) are never read, so a sweep run before the tests cannot
    make the docs look stale."""
    root = root or ROOT
    names: set[str] = set()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if doc.is_file():
            names.update(EXAMPLE_LINK.findall(doc.read_text()))
    return sorted(root / "reports" / n for n in names if (root / "reports" / n).is_dir())


def machines(_: analysis.Analysis | None = None, root: Path | None = None) -> list[str]:
    """docs/examples.md: every example report the docs name, with the machine it ran on (its env.json's
    fingerprint), so a doc that quotes a report can say which machine it was. A report of several sweeps (one per
    workload) has a row each; one of many runs (the A/A gates' sides) is named by its folder, from its first
    env.json."""
    root = root or ROOT
    rows = []
    for top in named_examples(root):
        if (top / "results.jsonl").is_file():
            found = [top]
        else:
            found = sorted(p.parent for p in top.glob("*/results.jsonl")) or sorted(
                p.parent for p in top.rglob("results.jsonl"))[:1]
        for d in found:
            env = reader.read_source(d).env  # through the one reader
            shown = d if d.parent == top or d == top else top
            rel = shown.relative_to(root)
            rows.append([f"[`{rel.relative_to('reports')}`](../{rel}/)", str(env.get("timestamp_utc", ""))[:10],
                         machine_name(env), _peaks(env)])
    return _table(["report", "date", "machine (env.json)", "calibrated matmul peaks"], rows)


# ---- the tables ---------------------------------------------------------------------------------------------


def front_page(a: analysis.Analysis) -> list[str]:
    """README: a sweep's machine (its fingerprint, so the line cannot go stale), then one row per workload x set."""
    rows, last = [], None
    for c in _rows(a).itertuples():
        speed = cells.speed_brief(c)
        memory = cells.memory_brief(c)
        rows.append([c.workload if c.workload != last else "", c.technique, fmt_num(c.sps_median), speed, memory,
                     cells.quality_brief(c, 3), cells.ttt_brief(c), _one_off(c)])
        last = c.workload
    return [fingerprint(a.sweep.sources[0].env), ""] + _table(
        ["workload", "set", "samples/s", "speedup [95% CI]", "peak memory", "quality at equal samples",
         "time to target", "one-off"], rows)


def gpu_front_page(a: analysis.Analysis) -> list[str]:
    """README: a GPU sweep's sets against the reference, led by the machine's fingerprint from its env.json (so the
    line cannot go stale): samples/s, the speedup with its interval and verdict, the achieved FLOP/s and their
    share of the GPU's dense bf16 datasheet peak (the denominator torchtitan's and llm.c's MFU use)."""
    env = a.sweep.sources[0].env
    gpu, peaks = env.get("gpu") or {}, env.get("peak_flops") or {}
    sheet = datasheet_peak(str(gpu.get("name", "")), "bfloat16")
    calibrated = ", ".join(f"{d} {v['flops'] / 1e12:,.0f}" for d, v in peaks.items() if v.get("flops"))
    when = str(env.get("timestamp_utc", ""))[:10]
    lines = [f"Machine (env.json): one {gpu.get('name', 'unknown GPU')} ({gpu.get('memory_bytes', 0) / 2**30:,.0f} "
             f"GiB, compute capability {gpu.get('capability', '?')}), torch {env.get('torch', '?')}, {when}; "
             f"calibrated matmul peaks {calibrated} TFLOP/s"
             + (f"; datasheet dense bfloat16 {sheet / 1e12:,.1f} TFLOP/s." if sheet else "."), ""]
    achieved = a.frame[a.frame["status"] == "ok"].groupby(["workload", "technique"])["achieved_flops"].median()
    rows, last = [], None
    for c in _rows(a).itertuples():
        speed = cells.speed_brief(c)
        flops = achieved.get((c.workload, c.technique))
        share = fmt_pct(flops / sheet) if _ok(flops) and sheet else "-"
        rows.append([c.workload if c.workload != last else "", c.technique, f"{c.n_ok}", fmt_num(c.sps_median),
                     speed, f"{flops / 1e12:,.0f}" if _ok(flops) else "-", share])
        last = c.workload
    return lines + _table(["workload", "set", "trials", "samples/s", "speedup [95% CI]", "achieved TFLOP/s",
                           "of the datasheet's bfloat16 peak"], rows)


def claims_check(a: analysis.Analysis) -> list[str]:
    """README: a sweep's sets beside their published speed claims (the report's claims check, one row per claim)."""
    rows = []
    by_set = {(c.workload, c.technique): c for c in _rows(a).itertuples()}
    for cl in a.claims.itertuples():
        if cl.metric != "speedup":
            continue
        c = by_set.get((cl.workload, cl.technique))
        measured = _speed(c) if c is not None else "-"
        memory = _memory(c) if c is not None else "-"
        verdict = cells.claim_cell(cl.verdict, cl.why_not, brief=True).text
        rows.append([cl.workload, cl.technique, measured, memory, f"{cl.low:g}-{cl.high:g}x ({cl.source})", verdict])
    return _table(["workload", "set", "samples/s (speedup [95% CI])", "peak memory", "published claim",
                   "claims check"], rows)


def model_techniques(a: analysis.Analysis) -> list[str]:
    """docs/model-techniques.md: one workload's sets, speed and quality side by side (quality at equal time, the
    one-off costs and MFU are in the report: three tables of eight columns left no room for the doc's prose)."""
    rows = []
    for c in _rows(a).itertuples():
        quality = f"{c.final_mean:.4f} ± {c.final_std:.4f} (reference)" if c.is_reference else cells.quality_brief(c)
        rows.append([c.technique, _speed(c), _memory(c), quality, cells.ttt_brief(c)])
    return _table(["set", "samples/s (speedup [95% CI])", "memory ratio", "quality at equal samples [95% CI]",
                   "time to target"], rows)


def _technique_result(a: analysis.Analysis, c: Any) -> dict[str, Any]:
    """The first ok trial's technique results of a set (byte counts and rounds repeat exactly over seeds)."""
    f = a.frame
    mine = f[(f["workload"] == c.workload) & (f["technique"] == c.technique) & (f["status"] == "ok")]
    return next((r for r in mine["technique_results"] if r), {}) if len(mine) else {}


def _plain_data_parallel(c: Any) -> bool:
    """The set is one plain data-parallel technique (ZeRO stage 0: DDP), which all-reduces every gradient once."""
    tech = techniques.registry().get(c.names[0]) if len(c.names) == 1 else None
    return tech is not None and tech.zero_stage == 0


def _bytes_per_sample(a: analysis.Analysis, c: Any) -> str:
    if c.is_reference:
        return "-"
    found = _technique_result(a, c)
    for name, result in found.items():
        comm = ((result or {}).get("communication") or {}).get("quality_run") or {}
        if comm.get("bytes_per_sample") is not None:
            text = f"{comm['bytes_per_sample']:,.0f}"
            fed = (result or {}).get("federated") or {}
            if fed.get("bytes_down_per_round"):
                text += (f" (all-reduce); {fed['bytes_down_per_round'] / 1e6:.2f} MB down and "
                         f"{fed['bytes_up_per_round'] / 1e6:.2f} MB up per round")
            sent_by = getattr(techniques.registry().get(name), "sent_by", None)  # one rank's traffic, not all
            return text + (f" ({sent_by})" if sent_by else "")
    if _plain_data_parallel(c) and _ok(c.n_params) and c.batch_size:  # all-reduces every fp32 gradient once
        return f"{4 * c.n_params / c.batch_size:,.0f} (computed)"
    return "-"


def _state(a: analysis.Analysis, c: Any) -> str:
    if c.is_reference:
        return f"- / {fmt_bytes(c.clean_rss_at_rest_bytes)}"
    state = fmt_bytes(c.model_state_bytes) if _ok(c.model_state_bytes) else "-"
    extra = next((r.get("simulation_state_bytes") for r in _technique_result(a, c).values()
                  if isinstance(r, dict) and r.get("simulation_state_bytes")), None)
    if extra:
        state += f" (+ {fmt_bytes(extra)} simulation state)"
    return f"{state} / {fmt_bytes(c.clean_rss_at_rest_bytes)}"


def _ttt_rounds(a: analysis.Analysis, c: Any) -> str:
    text = cells.ttt_brief(c)
    rounds = next(((r.get("rounds_completed") or {}).get("quality_run") for r in _technique_result(a, c).values()
                   if isinstance(r, dict) and r.get("rounds_completed")), None)
    return text + (f"; {rounds} rounds" if rounds else "")


def _spread(values: list[float]) -> str:
    """Mean over seeds with the range: an estimate, not a verdict."""
    if not values:
        return "-"
    mean = sum(values) / len(values)
    return f"{mean:.3g} ({min(values):.3g} to {max(values):.3g})" if len(values) > 1 else f"{mean:.3g}"


def preference(a: analysis.Analysis) -> list[str]:
    """docs/preference.md: per method over its seeds, the gold reward at the end against the baseline (the report's
    verdict, Holm-corrected with the report's other quality comparisons), its best during the run, the proxy and
    the KL at the end, and the estimated compute to the gold target."""
    rows = []
    for c in _rows(a).itertuples():
        got = frontier.set_outcomes(a, c.machine, c.workload).get(c.technique)
        if got is None:
            continue
        cost = got["compute_to_target"]
        to_target = "-" if cost is None else (
            "no training" if cost == 0 else f"{frontier.fmt_flops(cost)} (median; {got['reached']}/{got['seeds']} "
                                           "reached it)")
        rows.append([c.technique, cells.quality_brief(c, 3), _spread(got["best"]), _spread(got["proxy_end"]),
                     _spread(got["kl_end"]), to_target])
    return _table(["set", "gold reward at the end (vs baseline, 95% CI)", "best gold during the run",
                   "proxy reward at the end", "KL to the start at the end (nats)",
                   "compute to the gold target (est. FLOPs)"], rows)


def sweep_order(a: analysis.Analysis) -> tuple[str, ...]:
    """The sets in the order the sweep listed them (its sweep.toml), the reference first: the reading order of
    the doc's prose, which the example sweep was written in."""
    listed = [t for s in a.sweep.sources for t in ((s.settings or {}).get("techniques") or [])]
    return tuple(dict.fromkeys([a.baseline, *listed]))


def parallelism(a: analysis.Analysis) -> list[str]:
    """docs/parallelism.md: the sets on two gloo ranks against one process (the reference's row first)."""
    metric = next((m for m in a.configs["metric"] if m), "metric")
    rows = []
    for c in _rows(a, order=sweep_order(a)).itertuples():
        label = f"{c.technique} (1 process)" if c.is_reference else c.technique
        rows.append([label, _speed(c), _state(a, c), _bytes_per_sample(a, c), cells.quality_brief(c, 3),
                     _ttt_rounds(a, c)])
    return _table(["set", "samples/s (speedup [95% CI])", "model state / clean RSS at rest, per rank",
                   "bytes per sample", f"{metric} at equal samples [95% CI]", "time to target"], rows)


def _per_rank(values: Any) -> str:
    if not values:
        return "-"
    return " / ".join(fmt_bytes(v) for v in values)


def distributed(workload: str) -> Callable[[analysis.Analysis], list[str]]:
    """docs/distributed.md: DDP and the ZeRO stages on one workload, memory per rank beside the formula."""

    def render(a: analysis.Analysis) -> list[str]:
        rows = []
        for c in _rows(a, workload).itertuples():
            label = f"{c.technique} (1 process)" if c.is_reference else c.technique
            rss = fmt_bytes(c.peak_rss_bytes) if c.is_reference else _per_rank(c.rank_peak_rss_bytes)
            formula = "-" if c.is_reference else fmt_bytes(c.zero_formula_bytes)
            rows.append([label, _speed(c), _step(c.step_time_s), rss,
                         f"{fmt_bytes(c.clean_rss_at_rest_bytes)} / {fmt_bytes(c.clean_rss_peak_bytes)}",
                         "-" if c.is_reference else fmt_bytes(c.model_state_bytes), formula])
        return _table(["set", "samples/s, global (speedup [95% CI])", "step", "peak RSS per rank (timed)",
                       "clean RSS at rest / peak (per rank)", "model state per rank", "ZeRO formula"], rows)

    return render


# ---- tables of the registry (no report: what the techniques declare) -----------------------------------------

OPTIONS_SHOWN = 5  # options listed in the technique table; beyond, "..."


def _options(tech: type[Technique]) -> str:
    """A technique's options as typed on the command line: ``name=default``, a choice's values after its default."""
    hints = typing.get_type_hints(tech.Options)
    parts = []
    for f in dataclasses.fields(tech.Options):
        choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal else ()
        if choices:
            parts.append(f"`{f.name}=" + "|".join(str(c) for c in sorted(choices, key=lambda c: c != f.default)) + "`")
        elif f.default is not dataclasses.MISSING:  # as typed: true/false, not Python's True/False
            default = str(f.default).lower() if isinstance(f.default, bool) else f.default
            parts.append(f"`{f.name}={default}`")
        else:
            parts.append(f"`{f.name}`")
    return ", ".join(parts[:OPTIONS_SHOWN]) + (", ..." if len(parts) > OPTIONS_SHOWN else "") if parts else "-"


def _registered(reference: str = analysis.BASELINE) -> list[type[Technique]]:
    """The built-in techniques: the reference set first, then by kind (exact, numeric, algorithmic), by name."""
    order = list(Kind)
    return sorted(techniques.registry().values(), key=lambda t: (t.name != reference, order.index(t.kind), t.name))


def technique_table(_: analysis.Analysis | None = None) -> list[str]:
    """docs/techniques.md: every registered technique, its kind, options and summary (``bench list`` says which run here)."""
    rows = [[f"`{t.name}`", t.kind.value, _options(t), t.summary] for t in _registered()]
    return _table(["name", "kind", "options", "what"], rows)


def gpu_check_cost(_: analysis.Analysis | None = None) -> list[str]:
    """What scripts/gpu_check.sh costs on an H200, part by part, by its plan (the first H200 run's costs); each part's
    split by stage is left to ``python -m bench.dev.gpu_plan``, which prints it."""
    from bench.plan import gpu

    plan = gpu.check_plan(costs=gpu.H200)
    keep = [i for i, c in enumerate(gpu.COST_COLUMNS) if c != "by stage (s)"]
    return _table([gpu.COST_COLUMNS[i] for i in keep], [[r[i] for i in keep] for r in gpu.cost_rows(plan)])


def gpu_preset_size(_: analysis.Analysis | None = None) -> list[str]:
    """docs/gpu.md: the gpu preset's sizes on one H200 (``bench.plan.gpu.size_rows``), then the whole preset's time
    (``preset_s``): estimates from the first H200 run's costs, not measurements."""
    from bench.plan import gpu
    from bench.plan.config import TechniqueSet, build_config

    cfg = build_config("gpu", {"device": "cuda"})
    trials = cfg.repeats * len(cfg.workloads) * len({TechniqueSet(()), *cfg.techniques})  # as preset_s counts them
    planned, sequential = gpu.preset_s(gpu.H200)
    return _table(gpu.SIZE_COLUMNS, gpu.size_rows()) + [
        "", f"The whole preset, every configuration assumed to run: {trials} planned trials in about "
        f"{planned / 60:.0f} minutes, and at most half that again for the sequential phase: "
        f"{(planned + sequential) / 60:.0f} minutes at most (estimates)."]


def glossary(_: analysis.Analysis | None = None) -> list[str]:
    """docs/methodology.md: every answer word and term, with what it means (``bench.core.words``, where the code
    that writes them reads them too)."""
    rows = [[say(w) if w.text not in words.TERMS else w.text, words.definition(w)] for w in words.glossary()]
    return _table(["word", "what it means"], rows)


# The committed sweeps a method card quotes: each machine's canonical examples (a folder of several sweeps is read
# sweep by sweep). A card lists what these measured of its technique alone, against each sweep's reference.
CARD_REPORTS = ("reports/example-cpu", "reports/example-cpu-auto", "reports/example-cpu-bf16",
                "reports/example-cpu-2rank", "reports/example-cpu-model-techniques/cnn",
                "reports/example-cpu-model-techniques/gpt", "reports/example-cpu-model-techniques/mlp",
                "reports/example-cpu-parallelism/gpt", "reports/example-cpu-parallelism/mlp",
                "reports/example-cpu-user-models-structure", "reports/example-cpu-outside-model",
                "reports/example-cpu-preference", "reports/example-cpu-bottleneck", "reports/example-cpu-convergence",
                "reports/example-h200-first")


def card_measured(name: str) -> Callable[[Any], list[str]]:
    """A method card's "Measured" block: for each committed sweep that ran the technique alone, the machine (named
    by its fingerprint), the report, and each workload's speedup and peak-memory ratio with their answers, worded
    as the report words them (a quality-only sweep is named, its answers left to its report). Nothing else a card
    says is a measurement."""

    def render(analyse: Callable[[str], analysis.Analysis]) -> list[str]:
        lines = []
        for report in CARD_REPORTS:
            a = analyse(report)
            alone = a.configs["names"].map(lambda names: tuple(names or ()) == (name,)) if len(a.configs) else []
            rows = list(a.configs[alone].itertuples()) if any(alone) else []  # alone, any options
            cells_ = [f"{c.workload}{'' if c.technique == name else ' ' + c.technique} {_card_speed(c)}, "
                      f"memory {cells.memory_brief(c)}" for c in rows if cells.known(c.speedup) or cells.known(c.mem_ratio)]
            if cells_:
                lines.append(f"- {machine_name(a.sweep.sources[0].env)}, `{report}`: " + "; ".join(cells_) + ".")
            elif rows:  # a quality-only sweep (no speed window): say where it was measured, not "not measured"
                shown = ", ".join(dict.fromkeys(c.workload for c in rows))
                lines.append(f"- {machine_name(a.sweep.sources[0].env)}, `{report}`: {shown}, quality and time to "
                             "target only (no speed window): their answers are in its report.md.")
        return lines or ["- Not measured alone in a committed report."]

    return render


def _card_speed(c: Any) -> str:
    """A card's speed answer; where the report gives none (every window contended, say), that it gave none."""
    speed = cells.speed_brief(c)
    return speed if speed != "-" else "no speed answer (its report.md says why)"


def _cards() -> dict[str, Spec]:
    """One "Measured" block per registered technique, in its module's docstring."""
    out = {}
    for name, tech in techniques.registry().items():
        module = Path(inspect.getfile(tech)).relative_to(ROOT)
        out[f"card-{name}"] = Spec(str(module), None, card_measured(name))
    return out


TABLES: dict[str, Spec] = {
    "readme-example-cpu-auto": Spec("README.md", "reports/example-cpu-auto", front_page),
    "readme-example-h200-first": Spec("README.md", "reports/example-h200-first", gpu_front_page),
    "model-techniques-gpt": Spec("docs/model-techniques.md", "reports/example-cpu-model-techniques/gpt",
                                 model_techniques),
    "model-techniques-cnn": Spec("docs/model-techniques.md", "reports/example-cpu-model-techniques/cnn",
                                 model_techniques),
    "model-techniques-mlp": Spec("docs/model-techniques.md", "reports/example-cpu-model-techniques/mlp",
                                 model_techniques),
    "parallelism-gpt": Spec("docs/parallelism.md", "reports/example-cpu-parallelism/gpt", parallelism),
    "parallelism-mlp": Spec("docs/parallelism.md", "reports/example-cpu-parallelism/mlp", parallelism),
    "distributed-mlp-large": Spec("docs/distributed.md", "reports/example-cpu-2rank", distributed("mlp:large")),
    "distributed-gpt-tiny": Spec("docs/distributed.md", "reports/example-cpu-2rank", distributed("gpt:tiny")),
    "preference": Spec("docs/preference.md", "reports/example-cpu-preference", preference),
    "examples-bf16-claim": Spec("docs/examples.md", "reports/example-cpu-bf16", claims_check),
    "examples-machines": Spec("docs/examples.md", None, machines),
    "techniques": Spec("docs/techniques.md", None, technique_table),
    "glossary": Spec("docs/methodology.md", None, glossary),
    "gpu-check-cost": Spec("docs/gpu.md", None, gpu_check_cost),
    "gpu-preset-size": Spec("docs/gpu.md", None, gpu_preset_size),
}
CARDS = _cards()
ALL = {**TABLES, **CARDS}


# ---- rendering and checking ---------------------------------------------------------------------------------


def analyser(root: Path = ROOT) -> Callable[[str], analysis.Analysis]:
    """``analyse(report)``: a committed report's analysis (``reports/...`` under ``root``), each analysed once."""
    cache: dict[str, analysis.Analysis] = {}

    def analyse(report: str) -> analysis.Analysis:
        if report not in cache:
            if not (root / report / "results.jsonl").is_file():
                raise docs_figures.FigureError(f"{report} is not a committed report (no results.jsonl)")
            cache[report] = analysis.analyze(reader.load([root / report]))
        return cache[report]

    return analyse


def render(names: list[str] | None = None, root: Path = ROOT,
           analyse: Callable[[str], analysis.Analysis] | None = None) -> dict[str, str]:
    """{block name: its body} for ``names`` (default: every table), each report analysed once."""
    analyse = analyse or analyser(root)
    out = {}
    for name in names or list(ALL):
        spec = ALL[name]
        given = analyse if name in CARDS else analyse(spec.report) if spec.report else None  # a card reads several
        out[name] = "\n".join(spec.render(given)) + "\n"
    return out


def prose_files(root: Path = ROOT) -> list[Path]:
    """Where a measured figure may stand in prose: the README, the docs and the method cards."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "techniques").glob("*.py"))]


def figure_problems(root: Path = ROOT, analyse: Callable[[str], analysis.Analysis] | None = None
                    ) -> tuple[list[str], dict[str, str]]:
    """Stale or broken inline figures (``bench.dev.docs_figures``), one line each; and {file: its text with every
    figure rendered again} for the files that change."""
    analyse = analyse or analyser(root)
    found: list[str] = []
    rewritten: dict[str, str] = {}
    for path in prose_files(root):
        if not path.is_file():
            continue
        text = path.read_text()
        if "<!-- figure " not in text:
            continue
        rel = str(path.relative_to(root))
        try:
            new = docs_figures.update(text, analyse, root)
        except docs_figures.FigureError as exc:
            found.append(f"{rel}: a figure marker cannot be rendered: {exc}")
            continue
        if new != text:
            found.append(f"{rel} is out of date (its figures): run python -m bench.dev.docs_tables")
            rewritten[rel] = new
    return found, rewritten


def update(text: str, bodies: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with each block named in ``bodies`` given its body; and the names of blocks it holds that no table
    renders (a typo in a marker)."""
    unknown: list[str] = []

    def replace(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in bodies:
            unknown.append(name)
            return m.group(0)
        return m.group(1) + bodies[name] + m.group(4)

    return BLOCK.sub(replace, text), unknown


def problems(bodies: dict[str, str], root: Path = ROOT) -> tuple[list[str], dict[str, str]]:
    """What is wrong with the docs under ``root`` given the rendered ``bodies``: stale, missing and unknown blocks,
    one line each; and {doc: its text with every block brought up to date} for the docs that change."""
    found: list[str] = []
    rewritten: dict[str, str] = {}
    for doc in dict.fromkeys(spec.doc for name, spec in ALL.items() if name in bodies):
        text = (root / doc).read_text()
        mine = {n: b for n, b in bodies.items() if ALL[n].doc == doc}
        present = [m.group("name") for m in BLOCK.finditer(text)]
        found += [f"{doc} has no block '{n}': add <!-- generated: {n} --> and <!-- end generated --> where it goes"
                  for n in mine if n not in present]
        new, unknown = update(text, mine)
        found += [f"{doc}: no table is called '{n}' (known: {', '.join(mine)})" for n in unknown]
        if new != text:
            stale = [n for n in mine if n in present and update(text, {n: mine[n]})[0] != text]
            found.append(f"{doc} is out of date (blocks {', '.join(stale)}): run python -m bench.dev.docs_tables")
            rewritten[doc] = new
    return found, rewritten


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--check"]):
        print("usage: python -m bench.dev.docs_tables [--check]", file=sys.stderr)
        return 2
    analyse = analyser(root)
    found, rewritten = problems(render(root=root, analyse=analyse), root)
    if argv == ["--check"]:
        found += figure_problems(root, analyse)[0]
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    for doc, text in rewritten.items():
        (root / doc).write_text(text)
        print(f"wrote {doc}")
    more, figures = figure_problems(root, analyse)  # on the tables' new text
    for path, text in figures.items():
        (root / path).write_text(text)
        print(f"wrote {path}")
    left = [line for line in [*found, *more] if "out of date" not in line]  # missing or broken ones need a hand
    for line in left:
        print(line, file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
