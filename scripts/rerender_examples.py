"""Re-render every committed example report (report.md, report.html, figures, summary.md) from its results.jsonl,
after a change to the analysis or the report; no trial is run. A committed tune search's tune.json and tune.md are
replayed from its records (the search is a function of them), keeping its recorded elapsed time. Then refresh the
docs tables quoted from them.

    .venv/bin/python scripts/rerender_examples.py && .venv/bin/python -m bench.dev.docs_tables
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from bench.analyze import cost
from bench.report import summary as summary_mod
from bench.run import workflow

REPORTS = Path(__file__).resolve().parent.parent / "reports"


def resummarize(d: Path) -> None:
    """summary.md again, keeping its title and wall-time line (the report command does not write it)."""
    old = (d / "summary.md").read_text().splitlines()
    title = old[0].lstrip("# ").strip()
    wall = next((line for line in old if line.startswith("Wall time of this invocation")), None)
    settings = tomllib.loads((d / "sweep.toml").read_text()) if (d / "sweep.toml").is_file() else None
    price = cost.from_settings(settings)
    md = summary_mod.markdown_of(d, title=title, price_per_hour=price.per_hour if price else None)
    (d / "summary.md").write_text(md + (f"\n{wall}\n" if wall else ""))


def main() -> int:
    # The sides of an A/B run (a directory beside ab.json, e.g. reports/example-cpu-aa-rate) are compared, not
    # reported: their record is the comparison (compare.md), so they get no report of their own.
    dirs = sorted(p.parent for pattern in ("example-*/**/results.jsonl", "tune-*/results.jsonl")
                  for p in REPORTS.glob(pattern) if not (p.parent.parent / "ab.json").is_file())
    for d in dirs:
        subprocess.run([sys.executable, "-m", "bench", "report", str(d)], check=True, stdout=subprocess.DEVNULL)
        if (d / "summary.md").is_file():
            resummarize(d)
        if (d / "tune.json").is_file():
            workflow.rewrite_tune(d)
        print(f"re-rendered {d.relative_to(REPORTS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
