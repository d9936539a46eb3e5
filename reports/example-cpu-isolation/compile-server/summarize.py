"""The warm compile trials of the four sweeps beside this file, in the order they ran: their mean build stage, one-off
cost and wall time per trial. 1 and 3 ran commit cd33a74 (compile sets fork from the compile server), 2 and 4 commit
798f1bb (they fork from the one server). Run: python reports/example-cpu-isolation/compile-server/summarize.py"""

import json
from pathlib import Path

for d in sorted(p for p in Path(__file__).parent.iterdir() if p.is_dir()):
    rs = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines()]
    warm = [r for r in rs if "compile" in r["technique_label"] and (r.get("caches") or {}).get("inductor") == "warm"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    print(f"{d.name}: {len(warm)} warm compile trials; build {mean([r['stages']['build'] for r in warm]):.2f} s, "
          f"one-off {mean([r['stages']['one_off'] for r in warm]):.2f} s, wall {mean([r['wall_s'] for r in warm]):.2f} s")
