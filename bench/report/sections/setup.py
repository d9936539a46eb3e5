"""Setup: the machine (from env.json: hardware, software, calibrated peaks), the sweep (workloads, sets, repeats,
budget, dates) and the lines that reproduce it."""

from __future__ import annotations

from typing import Any

from bench.analyze.analysis import Analysis
from bench.core.text import fmt_bytes
from bench.report import reproduce as reproduce_mod
from bench.report.cells import fmt_flops
from bench.report.document import Code, Facts, Paragraph, Part, Section
from bench.report.sections import Context

ORDER = 20


def build(ctx: Context) -> Section:
    analysis, sweep = ctx.analysis, ctx.analysis.sweep
    machines = [(ctx.names[label] or "machine", _machine_facts(sweep.machines.get(label, {}), label))
                for label in analysis.machines]
    tail = [Facts(_sweep_facts(analysis)), Paragraph("Reproduce:"), Code("\n".join(reproduce_lines(analysis)))]
    if not ctx.several:
        return Section("Setup", "setup", "Setup", [Facts(machines[0][1]), *tail])
    parts = [Part(name, [Facts(facts)]) for name, facts in machines]
    return Section("Setup", "setup", "Setup", [], parts=[*parts, Part("Sweep", tail)])


def reproduce_lines(analysis: Analysis) -> list[str]:
    """The commands that made each sweep again, then the one that re-renders this report."""
    sweep = analysis.sweep
    made = (reproduce_mod.command(s.env.get("command"), s.path, s.settings) for s in sweep.sources)
    lines = list(dict.fromkeys(line for line in made if line))
    lines.append("python -m bench report DIR" + (" DIR2 ..." if len(sweep.sources) > 1 else "")
                 + (f" --baseline {analysis.baseline}" if analysis.baseline != "baseline" else "")
                 + "   # re-renders this report from results.jsonl and env.json")
    return lines


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
