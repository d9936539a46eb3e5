"""``bench list`` and ``bench env``: what this machine offers (workloads, techniques, its fingerprint)."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from bench import workloads
from bench.cli.common import out
from bench.core.files import REPO_DIR
from bench.plan.planner import available_packages, resolve_device


def cmd_list(args: argparse.Namespace) -> int:
    import techniques
    from bench.plan import plugins
    from techniques.base import Context

    plugins.load_entry_points()
    device = resolve_device(args.device)
    if getattr(args, "model", None):
        return _list_for_model(args.model, device, args.nproc)
    wl_table = Table(title="Workloads (sizes with their quality budget and validation target)")
    for col in ("name", "sizes", "available", "about"):
        wl_table.add_column(col, overflow="fold")
    for name, cls in sorted(workloads.registry().items()):
        wl = cls()
        reason = wl.check()
        sizes = "; ".join(_size_text(size, wl.size_params(size)) for size in cls.sizes)
        wl_table.add_row(*map(escape, (name, sizes, "yes" if reason is None else f"no: {reason}", cls.summary)))
    out.print(wl_table)
    out.print(_gpu_sizes_table())

    ctx = Context(device=device, available_packages=available_packages())
    t_table = Table(title=f"Techniques (availability on {device})")
    for col in ("name", "kind", "options", f"runs on {device}", "about"):
        t_table.add_column(col, overflow="fold")
    for name, cls in sorted(techniques.registry().items()):
        reason = cls().check(ctx)
        # escaped: rich reads "[deepspeed]" in an install hint as markup and drops it
        t_table.add_row(*map(escape, (name, cls.kind.value, cls.option_help() or "-",
                                      "yes" if reason is None else f"no: {reason}", cls.summary)))
    out.print(t_table)
    return 0


def _list_for_model(source: str, device: object, nproc: int) -> int:
    """``bench list --model``: which techniques run on the user's model, and why each other one is skipped."""
    import techniques
    from bench.plan.planner import applicability

    spec, reasons = applicability(source, device, nproc)  # type: ignore[arg-type]
    runs = [name for name, why in reasons.items() if why is None]
    table = Table(title=f"Techniques on {spec.label} ({source}) on {device}, multi-process ones with {nproc} ranks")
    for col in ("name", "kind", f"runs on {spec.name}", "about"):
        table.add_column(col, overflow="fold")
    known = techniques.registry()
    for name, why in reasons.items():
        table.add_row(*map(escape, (name, known[name].kind.value, "yes" if why is None else f"no: {why}",
                                    known[name].summary)))
    out.print(table)
    out.print(f"{len(runs)} of {len(reasons)} techniques run on {spec.label}: {', '.join(runs)}", markup=False,
              highlight=False, soft_wrap=True)
    return 0


def _size_text(size: str, params: dict) -> str:
    budget = f"{params['quality_steps']} steps x batch {params.get('batch_size', '?')}" \
        if params.get("quality_steps") else "no budget"
    target = f"target {params['target']:g}" if params.get("target") is not None else "no target yet"
    return f"{size} ({budget}, {target})"


def _gpu_sizes_table() -> Table:
    """The gpu preset's sizes with their expected step time on one H200: estimates from FLOPs and the first H200
    run's throughput (bench.plan.gpu, docs/gpu.md), not measurements."""
    from bench.plan import gpu

    table = Table(title="GPU sizes (the gpu preset's) on one H200: estimates, not measured (docs/gpu.md)")
    for col in gpu.SIZE_COLUMNS:
        table.add_column(col, overflow="fold")
    for row in gpu.size_rows():
        table.add_row(*row)
    return table


def cmd_env(args: argparse.Namespace) -> int:
    from bench.measure import env as envmod

    info = envmod.fingerprint(REPO_DIR)
    if args.peaks:
        info["peak_flops"] = envmod.calibrate_peaks(resolve_device(args.device))
    out.print_json(json.dumps(info, default=str))
    return 0
