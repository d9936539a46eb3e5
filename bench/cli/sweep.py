"""``bench sweep`` (and ``sweep --ab``): the flags to a config, the workflow's progress as a bar, the summary table.
The sweep runs in ``bench.run.workflow`` (``sweep``, ``sweep_ab``), as it does from ``bench.sweep``."""

from __future__ import annotations

import argparse
import shlex
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bench.cli.common import (
    command_line,
    err,
    interrupted_code,
    interrupted_word,
    out,
    progress_text,
    sigterm_as_interrupt,
)
from bench.core.errors import ConfigError
from bench.plan.config import SweepConfig, build_config

if TYPE_CHECKING:
    from bench.run.ab import AbProgress
    from bench.run.runner import Progress


def sweep_config_from_args(args: argparse.Namespace, resume_dir: Path | None) -> SweepConfig:
    """Preset, then --config (or ``resume_dir/sweep.toml`` when resuming), then the flags given."""
    config_path = args.config
    if args.resume:
        if args.out is None:
            raise ConfigError("--resume needs --out DIR (the sweep directory to continue)")
        if config_path is None and resume_dir is not None and (resume_dir / "sweep.toml").exists():
            config_path = resume_dir / "sweep.toml"
    budget = {
        "train_steps": args.steps,
        "eval_points": args.eval_points,
        "max_train_seconds": args.seconds,
        "min_steps": args.window_steps,
        "min_seconds": args.window_seconds,
        "timeout_s": args.timeout,
        "memory": False if args.no_memory else None,
    }
    overrides = {
        "workloads": args.workloads,
        "techniques": args.techniques,
        "repeats": args.repeats,
        "max_repeats": args.max_repeats,
        "decide_within": args.decide_within,
        "order": getattr(args, "order", None),
        "seed": args.seed,
        "device": args.device,
        "threads": args.threads,
        "mode": args.mode,
        "nproc": args.nproc,
        "nnodes": args.nnodes,
        "budget": {k: v for k, v in budget.items() if v is not None} or None,
        "models": args.model,
        "blocks": args.blocks,
        "technique_plugins": args.technique,
        "price_per_hour": args.price_per_hour,
        "instance": args.instance,
        "shard": args.shard,
        "isolation": args.isolation,
    }
    return build_config(args.preset, overrides, config_path)  # no --preset: gpu on CUDA, else quick


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.extend and not args.resume:
        raise ConfigError("--extend grows a sweep that exists: use it with --resume --out DIR")
    with sigterm_as_interrupt():
        return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    if args.ab and args.executor not in (None, "local"):
        raise ConfigError("--ab runs both sides on this machine, back to back, so drift hits both alike; it does not "
                          f"combine with --executor {args.executor}")
    if args.ab_isolation and not args.ab:
        raise ConfigError("--ab-isolation sets how side B's trials start in an A/B run: use it with --ab .")
    if args.threshold != "5%" and not args.ab:
        raise ConfigError("--threshold sets the A/B comparison's threshold (sweep --ab); a sweep's report takes its "
                          "own: python -m bench report DIR --threshold ...")
    if args.ab:  # A/B: both sides interleaved, then compared (bench/run/ab.py)
        return _sweep_ab(args)
    return _sweep_one(args)


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int, str], None]]:
    """A bar of trials on stderr, with the time taken and rich's estimate of the time left (from the pace of the
    trials so far); yields ``show(total, done, last line)``. Where stderr is no terminal (a file, a CI log) a bar
    redraws nothing readable: one line per finished trial instead."""
    if not err.is_terminal:
        started, shown = time.perf_counter(), [-1]

        def line(total: int, done: int, last: str) -> None:
            if done != shown[0]:
                shown[0] = done
                err.print(f"[{done}/{total}] {time.perf_counter() - started:.0f} s {last}", markup=False,
                          highlight=False, soft_wrap=True)

        yield line
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=err,
                  transient=False) as bar:
        task = bar.add_task("trials", total=None, last="measuring peak FLOP/s...")
        yield lambda total, done, last: bar.update(task, total=total, completed=done, last=last)


def _sweep_one(args: argparse.Namespace) -> int:
    cfg = sweep_config_from_args(args, args.out)  # first: bad input is refused before the runner and report load

    from bench.report import summary as summary_mod
    from bench.run import executors, workflow
    from bench.run.launcher import Launch

    executor = executors.from_args(args.executor, args.out, args.resume, args.slurm_partition,
                                   args.slurm_gpus_per_trial, args.slurm_cpus_per_trial, args.max_running,
                                   args.slurm_option, args.slurm_poll_seconds)
    launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    started: list[workflow.Start] = []
    with ExitStack() as stack:  # the bar starts with the banner, after the claim: bad input is one line
        bar: list[Callable[[int, int, str], None]] = []

        def banner(s: workflow.Start) -> None:
            started.append(s)
            where = f"on {s.device}" if s.device is not None else f"through the {s.executor} executor"
            shard = f" (shard {args.shard})" if s.cfg.shard else ""
            err.print(f"[bold]trainbench[/] sweep '{s.cfg.name}'{shard} {where} -> {s.out_dir}")
            for warning in s.warnings:
                err.print(f"[yellow]warning[/]: {warning}", highlight=False)
            bar.append(stack.enter_context(_progress_bar()))

        def on_progress(p: Progress) -> None:
            bar[0](p.total, p.done, progress_text(p.trial.trial_id, p.record))

        try:
            done = workflow.sweep(cfg, args.out, resume=args.resume, extend=args.extend, command=command_line(args),
                                  launch=launch, executor=executor, on_start=banner, on_progress=on_progress)
        except KeyboardInterrupt as exc:
            if not started:
                raise
            out_dir = started[0].out_dir
            queued = "" if executor.name == "local" else (
                f"; trial jobs already submitted keep running ({executor.name}) and --resume waits for them")
            err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/results.jsonl{queued}; "
                      f"continue with: python -m bench sweep --resume --out {out_dir}")
            return interrupted_code(exc)
    if done.resumed:
        err.print(f"resumed: {done.resumed} trial(s) already done were not run again")
    if not done.recorder:
        out.print(f"node {args.node_rank} took part in the trials in {done.wall_s:.0f} s; node 0 records the results "
                  "and writes the summary and the report")
        return 0
    price = done.cfg.price
    paths = [f"report: {path}" for path in done.report.values()]
    for line in done.summary.terminal([*paths, f"wall time {done.wall_s:.0f} s; results in {done.out_dir}"]):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in summary_mod.cost_lines(done.summary.rows, price.per_hour) if price else []:  # summary.md has them
        for part in textwrap.wrap(f"cost: {line}", summary_mod.WIDTH, subsequent_indent="  "):
            out.print(part, markup=False, highlight=False)
    return 0


def _sweep_ab(args: argparse.Namespace) -> int:
    """``sweep --ab`` (``bench.run.workflow.sweep_ab``): run, print the comparison, exit 0 (gate with ``bench compare
    OUT/a OUT/b --fail-on``)."""
    from bench.analyze.compare import parse_threshold
    from bench.run import workflow
    from bench.run.launcher import Launch

    # The same layering as a plain sweep; when resuming, side a's resolved sweep.toml is the config.
    cfg = sweep_config_from_args(args, args.out / "a" if args.out is not None else None)
    launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    threshold = parse_threshold(args.threshold)
    started: list[workflow.Start] = []
    clock = time.perf_counter()
    with ExitStack() as stack:  # the bar starts with the banner, after the claim: bad input is one line
        bar: list[Callable[[int, int, str], None]] = []

        def banner(s: workflow.Start) -> None:
            started.append(s)
            err.print(f"[bold]trainbench[/] A/B sweep '{s.cfg.name}' on {s.device}: this checkout (A) vs {args.ab} "
                      f"(B) -> {s.out_dir}")
            bar.append(stack.enter_context(_progress_bar()))

        def on_progress(p: AbProgress) -> None:
            bar[0](p.total, p.done, progress_text(p.trial.trial_id, p.record, side=p.side.upper()))

        try:
            result = workflow.sweep_ab(cfg, args.ab, args.out, threshold=threshold,
                                       resume=args.resume, extend=args.extend, command=command_line(args),
                                       launch=launch, on_start=banner, on_progress=on_progress,
                                       isolation_b=args.ab_isolation)
        except KeyboardInterrupt as exc:
            if not started:
                raise
            out_dir = started[0].out_dir
            again = f" --ab-isolation {args.ab_isolation}" if args.ab_isolation else ""
            err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/a and "
                      f"{out_dir}/b; continue with: python -m bench sweep --ab {shlex.quote(args.ab)}{again} "
                      f"--resume --out {out_dir}")
            return interrupted_code(exc)
    if result is None:
        out.print(f"node {args.node_rank} took part in the A/B trials; node 0 records and compares them")
        return 0
    out.print(result.markdown, markup=False, highlight=False)
    out.print(f"wall time {time.perf_counter() - clock:.0f} s; A/B results in {result.out_dir} (compare.md)")
    return 0
