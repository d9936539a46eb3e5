"""Energy: joules per sample and to the target where a hardware counter measured them; why not, where none did."""

from __future__ import annotations

import math

import numpy as np

from bench.analyze import cost, stats
from bench.analyze.analysis import Analysis
from bench.report.cells import joules
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 80


def build(ctx: Context) -> Section | None:
    return energy_section(ctx)


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


def _energy_unavailable(ctx: Context) -> dict[str, list[str]]:
    """Why energy was not measured, with the sets each reason applies to (records that have an energy section
    without joules)."""
    analysis = ctx.analysis
    reasons: dict[str, list[str]] = {}
    for source in analysis.sweep.sources:
        for r in source.records:
            if r.status == "ok" and r.energy is not None and r.energy.joules is None:
                where = f"{ctx.where(r.workload_label, source.machine)} {r.technique_label}"
                sets = reasons.setdefault(r.energy.reason or "no reason recorded", [])
                if where not in sets:
                    sets.append(where)
    return reasons


def energy_section(ctx: Context) -> Section | None:
    """Joules per sample and to the target per set where a counter measured them; one line per reason where none
    did, never an estimate. None when no record has an energy section (quality-only sweeps)."""
    analysis = ctx.analysis
    if not any(r.energy is not None for r in analysis.sweep.records):
        return None
    measured = _window_energy(analysis)
    reasons = _energy_unavailable(ctx)
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
            target = ("miss" if med is None or not math.isfinite(med) else joules(med)) + \
                (f" ({misses}/{len(to_target)} missed)" if misses else "")
        counters = ", ".join(dict.fromkeys(t[2] for t in trials))
        rows.append([Cell(ctx.where(c.workload, c.machine)), Cell(c.technique),
                     Cell(f"{joules(per_sample)}/sample (n={len(trials)})"), Cell(target), Cell(counters)])
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
    blocks = [*(Paragraph(line, quiet=True) for line in lines), *([table] if table else [])]
    return Section("Energy", "energy", "Energy", blocks)
