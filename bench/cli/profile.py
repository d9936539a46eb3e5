"""``bench profile``: one workload x technique set, its phase breakdown, top operators and a trace
(``bench.run.profile`` measures; this prints)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from bench.cli.common import err, out
from bench.core.errors import ConfigError
from bench.plan.config import build_config
from bench.plan.planner import resolve_device

if TYPE_CHECKING:
    from bench.run.profile import Profile


def cmd_profile(args: argparse.Namespace) -> int:
    from bench.run import profile as profile_mod

    for name in ("steps", "phase_steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 1:
        raise ConfigError(f"--warmup must be >= 1 (the first step pays one-off costs such as compilation), "
                          f"got {args.warmup}")
    if not args.workload and not args.model:
        raise ConfigError("name a workload (e.g. `python -m bench profile cnn:tiny`) or give --model PATH.py:FUNCTION")
    overrides = {"workloads": args.workload, "techniques": args.techniques, "models": args.model,
                 "blocks": args.blocks, "technique_plugins": args.technique, "device": args.device,
                 "threads": args.threads, "seed": args.seed, "mode": "speed", "repeats": 1}
    cfg = build_config("quick", overrides)
    device = resolve_device(cfg.device)
    workload, techs = profile_mod.validate(cfg, device, args.out)  # bad input: one line, before the banner
    out_dir = args.out or profile_mod.default_out_dir(workload.label, techs.label)

    def banner() -> None:
        err.print(f"[bold]trainbench[/] profile {workload.label} / {techs.label} on {device} -> {out_dir}",
                  markup=True, highlight=False, soft_wrap=True)

    result = profile_mod.profile(cfg, device, out_dir, args.steps, args.phase_steps, args.warmup, on_built=banner)
    profile_mod.write(result, out_dir)
    _print_profile(result, out_dir)
    return 0


def _print_profile(result: Profile, out_dir: Path) -> None:
    from bench.run import profile as profile_mod

    table = Table(title=f"Where a step's time goes ({result.phases.steps} steps, mean "
                        f"{result.phases.step_s * 1e3:.2f} ms)")
    for col in ("phase", "mean ms", "median ms", "IQR ms", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for row in profile_mod.phase_rows(result.phases):
        table.add_row(*row)
    out.print(table)
    rows = {"host operators by self CPU time": [(o.name, o.calls, o.per_step_s, o.share) for o in result.top_ops],
            "device kernels by device time": [(k.short, k.calls, k.per_step_s, k.share) for k in result.top_kernels]}
    for title, found in rows.items():  # one kind of event per table: no time counted twice
        if not found:
            continue
        ops = Table(title=f"Top {title} ({result.profiled_steps} profiled steps)")
        for col in ("name", "calls", "ms/step", "share"):
            ops.add_column(col, justify="left" if col == "name" else "right", overflow="fold")
        for name, calls, per_step, share in found[:10]:
            ops.add_row(name, str(calls), f"{per_step * 1e3:.3f}", f"{100 * share:.1f}%")
        out.print(ops)
    if (busy := profile_mod.busy_line(result.phases)) is not None:
        out.print(busy, markup=False, highlight=False)
    out.print(f"diagnosis: {result.phases.diagnosis}", markup=False, highlight=False)
    out.print(f"trace: {result.trace}; profile.md and profile.json in {out_dir}", markup=False, highlight=False)
