"""Data-parallel and sharded trials: throughput counted both ways, per-rank memory, and the per-rank model state
beside the ZeRO paper's formula."""

from __future__ import annotations

from bench.report.cells import fmt_bytes, fmt_num, fmt_secs, known, per_rank, status_cell
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 70


def build(ctx: Context) -> Section | None:
    table, notes = _distributed_table(ctx)
    if table is None:
        return None
    return Section("Data-parallel and sharded trials", "distributed", "Data-parallel",
                   [table, *(Paragraph(n, quiet=True) for n in notes)])


def _distributed_table(ctx: Context) -> tuple[Table | None, list[str]]:
    """Multi-process sets (and their reference) per workload: throughput counted both ways, per-rank memory, and
    the per-rank model state beside the ZeRO paper's formula."""
    analysis = ctx.analysis
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
        if known(state) and known(formula) and formula:
            ratio = state / formula
            match = Cell(f"{ratio:.3f}", "good" if abs(ratio - 1) <= 0.01 else "warn")
        clean = (f"{fmt_bytes(c.clean_rss_at_rest_bytes)} / {fmt_bytes(c.clean_rss_peak_bytes)}"
                 if known(c.clean_rss_at_rest_bytes) else "-")
        window_rss = per_rank(c.rank_peak_rss_bytes) if c.rank_peak_rss_bytes else fmt_bytes(c.peak_rss_bytes)
        stage = "" if not known(c.zero_stage) else (f"ZeRO-{int(c.zero_stage)}" if c.zero_stage else "DDP")
        step = c.step_time_s
        step_text = f"{step * 1000:.1f} ms" if known(step) and step < 1 else fmt_secs(step)
        rows.append([Cell(ctx.where(c.workload, c.machine)), Cell(c.technique), Cell(str(c.world_size or 1)),
                     Cell(fmt_num(c.sps_median)), Cell(fmt_num(c.sps_per_device_median)), Cell(step_text),
                     Cell(window_rss), Cell(clean), Cell(fmt_bytes(state)),
                     Cell(f"{fmt_bytes(formula)} ({stage})" if known(formula) else "-"), match, status_cell(c)])
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
