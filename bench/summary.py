"""The end-of-sweep summary: one row per workload x technique set (the full report lives in bench.report).

The numbers come from ``bench.analysis`` (computed once, the same as the report's): speedup is the ratio of median
throughputs against the baseline set of the same workload; memory ratio compares the tensor-level peak where both
sides have one, else peak RSS (marked), since the two are not comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import analysis
from bench.results import TrialRecord

BASELINE = analysis.BASELINE


@dataclass
class SummaryRow:
    workload: str
    techniques: str
    n_ok: int
    n_total: int
    samples_per_s: float | None
    speedup: float | None
    peak_bytes: float | None
    peak_rss_bytes: float | None
    memory_ratio: float | None
    memory_ratio_source: str | None
    mfu: float | None
    metric: str | None
    final_mean: float | None
    final_std: float | None
    parity_ok: bool | None
    note: str


def summarize(records: list[TrialRecord], baseline: str = BASELINE) -> list[SummaryRow]:
    """One row per workload x technique set, the reference first in each workload."""
    if not records:
        return []
    configs = analysis.configurations(analysis.records_frame(records), baseline)
    rows = []
    for c in configs.itertuples():
        notes = list(c.problems) + ([f"skipped: {c.skip_reason}"] if c.skip_reason else [])
        if c.n_contended:
            notes.append("other processes used the CPU during timing")
        rows.append(SummaryRow(
            workload=c.workload,
            techniques=c.technique,
            n_ok=c.n_ok,
            n_total=c.n_total,
            samples_per_s=c.sps_median,
            speedup=1.0 if c.is_reference and c.sps_median else c.speedup,
            peak_bytes=c.peak_bytes,
            peak_rss_bytes=c.peak_rss_bytes,
            memory_ratio=1.0 if c.is_reference and (c.peak_bytes or c.peak_rss_bytes) else c.mem_ratio,
            memory_ratio_source=("tensors" if c.peak_bytes else "RSS") if c.is_reference else c.mem_ratio_source,
            mfu=c.mfu,
            metric=c.metric if c.n_ok else None,
            final_mean=c.final_mean,
            final_std=c.final_std,
            parity_ok=c.parity_ok,
            note="; ".join(notes)[:300],
        ))
    return rows


COLUMNS = ["workload", "techniques", "ok", "samples/s", "speedup", "peak MB", "peak RSS MB", "mem ratio", "MFU",
           "final metric", "parity", "notes"]


def row_cells(row: SummaryRow) -> list[str]:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    mem_ratio = "-" if row.memory_ratio is None else f"{row.memory_ratio:.2f}" + (
        " (RSS)" if row.memory_ratio_source == "RSS" else "")
    final = "-" if row.final_mean is None else f"{row.metric} {row.final_mean:.4f} ± {row.final_std:.4f}"
    parity = {None: "-", True: "ok", False: "MISMATCH"}[row.parity_ok]
    return [
        row.workload, row.techniques, f"{row.n_ok}/{row.n_total}", num(row.samples_per_s, ",.0f"),
        num(row.speedup, ".2f") + ("x" if row.speedup else ""),
        num(row.peak_bytes and row.peak_bytes / 2**20, ".1f"), num(row.peak_rss_bytes and row.peak_rss_bytes / 2**20, ".0f"),
        mem_ratio, "-" if row.mfu is None else f"{row.mfu:.1%}", final, parity, row.note or "",
    ]


def to_markdown(rows: list[SummaryRow], title: str = "Sweep summary") -> str:
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = [f"# {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(esc(c) for c in row_cells(row)) + " |")
    lines += ["", "Speedup: ratio of median samples/s against `baseline` on the same workload. "
              "Memory ratio: tensor-level peak (tracked) where both sides have it, else peak RSS. "
              "MFU: model FLOPs (eager fp32 step) per second over the measured matmul peak for the dtype in use. "
              "Final metric: mean ± std over repeats."]
    return "\n".join(lines) + "\n"
