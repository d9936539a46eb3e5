"""``summary.md``, written beside a sweep's records at its end, and the rows the terminal shows."""

from __future__ import annotations

from pathlib import Path


def write_summary(out_dir: Path, records: list, wall_s: float, name: str, price_per_hour: float | None = None
                  ) -> list:
    """summary.md beside the records (with cost amounts when a price is known); returns the summary rows (the CLI
    prints them)."""
    from bench.analyze import summary as summary_mod
    from bench.analyze import time_spent
    from bench.core.files import write_atomic

    rows = summary_mod.summarize(records, max_looks=summary_mod.design_of(Path(out_dir)),
                                 env=summary_mod.env_of(Path(out_dir)))
    md = summary_mod.to_markdown(rows, title=f"Sweep '{name}' summary", price_per_hour=price_per_hour)
    md += f"\nWall time of this invocation: {wall_s:.0f} s. Records: {len(records)} in results.jsonl.\n"
    spent = time_spent.summary_line(time_spent.of_records(records))
    md += f"\n{spent}\n" if spent else ""
    write_atomic(Path(out_dir) / "summary.md", md)
    return rows
