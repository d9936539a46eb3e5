"""``python -m bench.dev.gpu_plan [--left-s S] [--today]``: what ``scripts/gpu_check.sh`` will run, as shell
assignments on stdout and the estimate in words on stderr (``bench.plan.gpu`` computes it)."""

from __future__ import annotations

import argparse
import sys

from bench.plan.gpu import TARGET, TODAY, check_plan, describe, shell


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.dev.gpu_plan [--left-s S] [--today]``: gpu_check.sh's plan as shell assignments on stdout, the
    estimate in words on stderr; exit 1 when the planned trials do not fit. ``--left-s``: the seconds left of the
    slot after the GPU tests (default: a whole slot, the tests' cap taken out)."""
    parser = argparse.ArgumentParser(prog="python -m bench.dev.gpu_plan", description=main.__doc__)
    parser.add_argument("--left-s", type=float, help="the slot's seconds left after the GPU tests")
    parser.add_argument("--today", action="store_true", help="estimate with today's trial costs, not the target's")
    args = parser.parse_args(argv)
    costs = TODAY if args.today else TARGET
    plan = check_plan(costs=costs) if args.left_s is None else check_plan(args.left_s, costs, tests_s=0.0)
    print(shell(plan))
    for line in describe(plan):
        print(line, file=sys.stderr)
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
