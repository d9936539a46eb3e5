"""Calibrate a workload size's validation target from baseline quality runs (how every documented target was set).

    .venv/bin/python scripts/calibrate_targets.py --workloads mlp:tiny,gpt:tiny,cnn:tiny --seeds 5

For each workload size: the plain baseline trains its documented quality budget (``quality_steps`` at its batch)
once per seed, in this process. The target is the less demanding of two values: the median over the seeds of the
metric at the evaluation nearest ``--fraction`` (default 0.7) of the budget (the median run reaches it with 30% of
its budget to spare), and the worst seed's best evaluation (every calibration run reaches it within the budget, so
a baseline seed that learns slowly is not scored as a miss). Time-to-target is then measured inside the budget, and
a set that learns more slowly than every baseline seed misses it (the AlgoPerf and MLPerf practice of targets set
from reference runs). The metric is deterministic for a seed, so this can run on a busy machine. It prints each
seed's curve and the proposed target, rounded to 3 significant digits; copy the target into the workload's
``sizes`` and its docstring.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.plan.config import ConfigError, parse_workloads  # noqa: E402
from bench.trial import TrialSpec, run  # noqa: E402


def calibrate(workload: str, size: str, seeds: int, fraction: float, reference_dir: str, device: str = "cpu") -> None:
    budget = {"train_steps": 0, "eval_points": 0, "parity_steps": 0, "max_train_seconds": 1e9, "timeout_s": 2e9,
              "memory": False}
    at_fraction, best, higher = [], [], True
    print(f"\n## {workload}:{size}\n")
    for seed in range(seeds):
        spec = TrialSpec(sweep_id="calibrate", trial_id=f"{workload}:{size}/baseline/seed{seed}", workload=workload,
                         size=size, techniques=[], seed=seed, repeat=seed, device=device, budget=budget,
                         mode="quality", reference_dir=reference_dir)
        rec = run(spec)
        if rec.status != "ok":
            print(f"seed {seed}: {rec.status}: {rec.reason}")
            continue
        q = rec.quality
        higher = q.higher_is_better
        wanted = fraction * q.steps_trained
        point = min(q.curve[1:], key=lambda p: abs(p[1] - wanted))
        at_fraction.append(point[-1])
        metrics = [p[-1] for p in q.curve[1:]]
        best.append(max(metrics) if higher else min(metrics))
        curve = ", ".join(f"{p[-1]:.4g}" for p in q.curve)
        print(f"seed {seed}: {q.metric} at steps {[p[1] for p in q.curve]}: {curve}; at step {point[1]}: "
              f"{point[-1]:.4g} ({q.train_time_s:.1f} s of training)")
    if not at_fraction:
        return
    median = statistics.median(at_fraction)
    worst_best = min(best) if higher else max(best)
    target = min(median, worst_best) if higher else max(median, worst_best)
    digits = 3 - int(math.floor(math.log10(abs(target)))) - 1 if target else 3
    scale = 10.0**digits  # round to 3 significant digits in the lenient direction, so every seed still reaches it
    lenient = (math.floor(target * scale + 1e-9) if higher else math.ceil(target * scale - 1e-9)) / scale
    print(f"\ntarget ({'higher' if higher else 'lower'} is better): median over {len(at_fraction)} seeds of the "
          f"metric at {fraction:.0%} of the budget {median:.5g}; the worst seed's best evaluation {worst_best:.5g}; "
          f"the less demanding: {target:.5g} -> {lenient:g} (rounded in the lenient direction)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp:tiny,gpt:tiny,cnn:tiny", help="comma list of name:size")
    parser.add_argument("--seeds", type=int, default=5, help="baseline runs per workload size (default 5)")
    parser.add_argument("--fraction", type=float, default=0.7, help="where in the budget the target sits")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the baseline trains (cuda: the GPU sizes, e.g. gpt:gpt2-124m-b32)")
    args = parser.parse_args(argv)
    try:
        specs = parse_workloads(args.workloads)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="trainbench-calibrate-") as refs:
        for spec in specs:
            calibrate(spec.name, spec.size, args.seeds, args.fraction, refs, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
