"""What a trial costs besides its measured steps, in one command: on a quiet machine, for each isolation asked for,

1. a bare ``python -c "import torch"``: the wall time of the cheapest process that can train anything;
2. a speed-only ``mlp:tiny`` trial with a 0.5 s window (``bench sweep --workloads mlp:tiny --techniques baseline
   --mode speed --window-seconds 0.5 --repeats N``): each trial's wall time as the runner saw it (``wall_s``), and its
   ratio to the bare import;
3. the smoke sweep (``bench sweep --preset smoke``): its wall time and each trial's fixed cost, ``wall_s`` less the
   measured steps (the stages ``window``, ``quality_train``, ``continuation``: docs/methodology.md, "A trial's
   stages"), with the stages that make it up.

    .venv/bin/python scripts/trial_cost.py                       # fork isolation (the default)
    .venv/bin/python scripts/trial_cost.py --isolation fork,fresh --out runs/trial-cost

Every figure is one run on whatever else the machine is doing: run it on a quiet machine, and compare isolations
with ``bench sweep --ab . --ab-isolation fresh`` (interleaved, with intervals), not with two runs of this script.
Exit code 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEASURED = ("window", "quality_train", "continuation")  # bench.measure.stages.MEASURED (kept torch-free here)
ISOLATIONS = ("fork", "fresh")


def bare_import_s(runs: int) -> list[float]:
    """Wall time of ``python -c "import torch"`` (start to exit), ``runs`` times."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - started)
    return times


def sweep(out: Path, isolation: str, *args: str) -> tuple[float, list[dict]]:
    """``python -m bench sweep ARGS --isolation ISOLATION --out OUT``: its wall time and its records."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench", "sweep", *args, "--isolation", isolation, "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"trial_cost: the sweep into {out} failed (exit {proc.returncode}): "
                         f"{' | '.join(proc.stderr.strip().splitlines()[-3:])}")
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return wall, [r for r in records if r.get("status") != "skipped"]


def fixed_s(record: dict) -> float:
    stages = record.get("stages") or {}
    return record["wall_s"] - sum(stages.get(name, 0.0) for name in MEASURED)


def report(out: Path, isolation: str, repeats: int, bare: float) -> list[str]:
    lines = []
    _, trials = sweep(out / f"mlp-speed-{isolation}", isolation, "--preset", "quick", "--workloads", "mlp:tiny",
                      "--techniques", "baseline", "--mode", "speed", "--window-seconds", "0.5", "--repeats",
                      str(repeats))
    walls = [r["wall_s"] for r in trials]
    kinds = sorted({str(r.get("isolation")) for r in trials})
    lines.append(f"mlp:tiny speed-only trial, 0.5 s window ({isolation}; records say {', '.join(kinds)}): wall_s "
                 f"median {statistics.median(walls):.2f} s over {len(walls)} trials (min {min(walls):.2f}, first "
                 f"{walls[0]:.2f}), {statistics.median(walls) / bare:.2f} times the bare import; fixed cost median "
                 f"{statistics.median(map(fixed_s, trials)):.2f} s")
    wall, trials = sweep(out / f"smoke-{isolation}", isolation, "--preset", "smoke")
    fixed = [fixed_s(r) for r in trials]
    by_stage: dict[str, float] = defaultdict(float)
    for r in trials:
        for name, seconds in (r.get("stages") or {}).items():
            if name not in MEASURED:
                by_stage[name] += seconds / len(trials)
    top = ", ".join(f"{name} {s:.3f}" for name, s in sorted(by_stage.items(), key=lambda kv: -kv[1])[:6])
    lines.append(f"smoke sweep ({isolation}): {wall:.0f} s for {len(trials)} trials; fixed cost per trial mean "
                 f"{statistics.mean(fixed):.2f} s, median {statistics.median(fixed):.2f} s, max {max(fixed):.2f} s "
                 f"(mean per stage, s: {top})")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isolation", default="fork", help="comma list of fork, fresh (default fork)")
    p.add_argument("--repeats", type=int, default=5, help="bare imports and mlp:tiny trials per isolation (default 5)")
    p.add_argument("--out", type=Path, default=REPO / "runs" / f"trial-cost-{time.strftime('%Y%m%d-%H%M%S')}",
                   help="where the sweeps go (default runs/trial-cost-<time>/; must not exist)")
    args = p.parse_args(argv)
    isolations = [x.strip() for x in args.isolation.split(",") if x.strip()]
    if not isolations or set(isolations) - set(ISOLATIONS) or args.repeats < 1 or args.out.exists():
        print(f"trial_cost: --isolation takes a comma list of {', '.join(ISOLATIONS)}, --repeats a number >= 1, and "
              f"--out a new directory (got {args.isolation!r}, {args.repeats}, {args.out})", file=sys.stderr)
        return 2
    bare = bare_import_s(args.repeats)
    print(f'bare python -c "import torch": median {statistics.median(bare):.2f} s over {len(bare)} runs '
          f"(min {min(bare):.2f})", flush=True)
    for isolation in isolations:
        for line in report(args.out, isolation, args.repeats, statistics.median(bare)):
            print(line, flush=True)
    print(f"sweeps in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
