"""``python -m bench.dev.gpu_plan``: what ``scripts/gpu_check.sh`` will run and what it will cost, as shell
assignments on stdout and the estimate in words on stderr (``bench.plan.gpu`` computes it).

    python -m bench.dev.gpu_plan                                  # a whole slot on a GPU, the first H200 run's costs
    python -m bench.dev.gpu_plan --left-s 420 --out OUT           # what the script asks: after its tests, for OUT
    python -m bench.dev.gpu_plan --rehearse --out OUT --config-out FILE   # the CPU rehearsal's, its sweep config
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tomli_w

from bench.plan.gpu import CHECK_BUDGET_S, describe, plan_for, shell, sweep_toml


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every planned group ends within the slot with the margin, 1 when the cap will cut some (the
    script goes on: the cap keeps what finishes), 2 on bad input."""
    parser = argparse.ArgumentParser(prog="python -m bench.dev.gpu_plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--left-s", type=float,
                        help="the seconds left of the slot after the GPU tests (default: a whole slot, the tests in)")
    parser.add_argument("--budget-s", type=float, default=CHECK_BUDGET_S, help="the whole slot (default 480)")
    parser.add_argument("--out", type=Path, help="the check's output directory: its done trials, cached references "
                                                 "and (same machine) measured costs are used")
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal's plan (gpu_check.sh --rehearse)")
    parser.add_argument("--config-out", type=Path, help="write the check's sweep config (TOML) here")
    args = parser.parse_args(argv)
    if args.left_s is not None and args.left_s < 0:
        print(f"gpu_plan: --left-s must be >= 0, got {args.left_s:g}", file=sys.stderr)
        return 2
    device = "cpu" if args.rehearse else "cuda"
    budget = args.left_s if args.left_s is not None else args.budget_s
    plan = plan_for(args.out, budget, device, args.rehearse, tests_s=0.0 if args.left_s is not None else None)
    if args.config_out is not None:
        args.config_out.write_text(tomli_w.dumps(sweep_toml(plan.cfg)))
    print(shell(plan, str(args.config_out) if args.config_out is not None else None))
    for line in describe(plan):
        print(line, file=sys.stderr)
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
