"""Results per workload: one table per workload (and machine) with every set's speed, memory, MFU, one-off cost,
quality at equal samples, time to target, parity and status; then the figures that span the workloads."""

from __future__ import annotations

import pandas as pd

from bench.analyze import mfu
from bench.analyze.analysis import Analysis
from bench.records.frame import BREAKDOWN
from bench.report.cells import (
    breakdown_cell,
    mem_ratio_cell,
    memory_cell,
    one_off_cell,
    parity_cell,
    quality_cell,
    speedup_cell,
    sps_cell,
    status_cell,
    ttt_cell,
)
from bench.report.document import Cell, FigureRef, Lines, Paragraph, Part, Section, Table
from bench.report.sections import Context, anchor

ORDER = 30


def build(ctx: Context) -> Section:
    analysis = ctx.analysis
    parts = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        title = ctx.where(workload, machine)
        notes = [f"Ran on {ctx.names[machine]}: {machine}."] if ctx.names[machine] else []
        notes += [d for d in [mfu.definition(rows.iloc[0])] if d]
        blocks = [Paragraph(_workload_info(analysis, machine, workload), quiet=True), workload_table(rows, analysis.baseline)]
        parts.append(Part(title, blocks + ([Lines(notes)] if notes else []), anchor(title)))
    figures = [FigureRef(name) for name in ("memory", "pareto", "curves", "frontier")]
    return Section("Results per workload", "results", "Results", [], parts=parts, after=figures)


def workload_table(rows: pd.DataFrame, baseline: str) -> Table:
    metric = next((m for m in rows["metric"] if m), "metric")
    columns = ["technique set", "kind", "samples/s median (IQR)", f"speedup vs {baseline} [95% CI]", "peak memory",
               "memory ratio [95% CI]", "memory breakdown (" + " / ".join(BREAKDOWN) + ")",
               "MFU vs device peak (achieved)", "MFU own dtype", "one-off",
               f"{metric} at equal samples (mean ± std; difference [95% CI])", "time to target", "parity",
               "status"]
    body = []
    for c in rows.itertuples():
        body.append([Cell(c.technique), Cell(c.kind, "muted"), sps_cell(c), speedup_cell(c), memory_cell(c), mem_ratio_cell(c),
                     breakdown_cell(c), Cell(mfu.cell_text(c)), Cell(mfu.own_text(c), "muted"), one_off_cell(c),
                     quality_cell(c), ttt_cell(c), parity_cell(c), status_cell(c)])
    return Table(columns, body, wrap=(10, 11, 12))


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
