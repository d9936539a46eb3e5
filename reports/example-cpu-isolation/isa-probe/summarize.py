"""The compile trials of the four sweeps beside this file, in the order they ran (their records, N-COMMIT.results.jsonl,
kept under names no report tool picks up): each set's cold trial's one-off cost, and the warm trials' mean one-off
cost and wall time. 1 and 3 ran commit 41670c6 (the compile server asks TorchInductor's per-process questions about
the machine before it forks), 2 and 4 commit 5e332c8 (each compiling trial asks them itself).
Run: python reports/example-cpu-isolation/isa-probe/summarize.py"""

import json
from pathlib import Path

for path in sorted(Path(__file__).parent.glob("*.results.jsonl")):
    rs = [json.loads(line) for line in path.read_text().splitlines()]
    compiled = [r for r in rs if "compile" in r["technique_label"]]
    cold = {f"{r['workload']['name']}:{r['workload']['size']}": r["stages"]["one_off"]
            for r in compiled if r["caches"]["inductor"] == "cold"}
    warm = [r for r in compiled if r["caches"]["inductor"] == "warm"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{path.name.removesuffix('.results.jsonl')}: cold one-off "
          + ", ".join(f"{w} {s:.1f} s" for w, s in cold.items())
          + f"; {len(warm)} warm trials: one-off {mean([r['stages']['one_off'] for r in warm]):.2f} s, "
          f"wall {mean([r['wall_s'] for r in warm]):.2f} s")
