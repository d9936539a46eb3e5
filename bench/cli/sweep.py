"""``bench sweep`` (and ``sweep --ab``): the flags to a config, the runner's progress as a bar, the summary table.
The trials run in ``bench.run.runner.SweepRunner`` (``bench.run.ab.AbRunner`` for --ab)."""

from __future__ import annotations

import argparse
import shlex
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from bench.plan.planner import resolve_device

if TYPE_CHECKING:
    from bench.records.results import TrialRecord
    from bench.run.runner import SweepRunner


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
    if args.threshold != "5%" and not args.ab:
        raise ConfigError("--threshold sets the A/B comparison's threshold (sweep --ab); a sweep's report takes its "
                          "own: python -m bench report DIR --threshold ...")
    if args.ab:  # A/B: both sides interleaved, then compared (bench/run/ab.py)
        return _sweep_ab(args)
    return _sweep_one(args)


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int, str], None]]:
    """A bar of trials on stderr, with the time taken and rich's estimate of the time left (from the pace of the
    trials so far); yields ``show(total, done, last line)``."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=err,
                  transient=False) as bar:
        task = bar.add_task("trials", total=None, last="measuring peak FLOP/s...")
        yield lambda total, done, last: bar.update(task, total=total, completed=done, last=last)


def _sweep_one(args: argparse.Namespace) -> int:
    from bench.run import executors
    from bench.run.runner import Launch, SweepRunner, default_out_dir

    cfg = sweep_config_from_args(args, args.out)
    executor = executors.from_args(args.executor, args.out, args.resume, args.slurm_partition,
                                   args.slurm_gpus_per_trial, args.slurm_cpus_per_trial, args.max_running,
                                   args.slurm_option, args.slurm_poll_seconds)
    # A batch executor's trials run on other machines: the device is resolved there (its setup job).
    device = resolve_device(cfg.device) if executor.name == "local" else None
    out_dir = args.out or default_out_dir(cfg)
    launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    runner = SweepRunner(cfg, out_dir, device, resume=args.resume, command=command_line(args), launch=launch,
                         extend=args.extend, executor=executor)

    runner.claim()  # bad input (the directory, a resume that changes settings) is one line, before the banner
    where = f"on {device}" if device is not None else f"through the {executor.name} executor"
    shard = f" (shard {args.shard})" if runner.cfg.shard else ""
    err.print(f"[bold]trainbench[/] sweep '{runner.cfg.name}'{shard} {where} -> {out_dir}")
    started = time.perf_counter()
    skipped: list[str] = []
    with _progress_bar() as show:

        def on_progress(p) -> None:  # type: ignore[no-untyped-def]
            if p.record is None:
                skipped.append(p.trial.trial_id)
            show(p.total, p.done, progress_text(p.trial.trial_id, p.record))

        try:
            records = runner.run(on_progress)
        except KeyboardInterrupt as exc:
            queued = "" if executor.name == "local" else (
                f"; trial jobs already submitted keep running ({executor.name}) and --resume waits for them")
            err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/results.jsonl{queued}; "
                      f"continue with: python -m bench sweep --resume --out {out_dir}")
            return interrupted_code(exc)
    wall = time.perf_counter() - started
    if skipped:
        err.print(f"resumed: {len(skipped)} trial(s) already done were not run again")
    return _sweep_done(args, runner, records, cfg.name, wall)


def _sweep_done(args: argparse.Namespace, runner: SweepRunner, records: list[TrialRecord], name: str,
                wall: float) -> int:
    """Node 0: summary.md and the report written, the summary printed. Other nodes: that node 0 does so."""
    if not runner.recorder:
        out.print(f"node {args.node_rank} took part in the trials in {wall:.0f} s; node 0 records the results and "
                  "writes the summary and the report")
        return 0
    from bench.report import summary as summary_mod
    from bench.report import write_report
    from bench.report.summary import write_summary

    out_dir, price = runner.out_dir, runner.cfg.price
    summary = write_summary(out_dir, records, wall, name, price.per_hour if price else None)
    paths = [f"report: {path}" for path in write_report([out_dir]).values()]
    for line in summary.terminal([*paths, f"wall time {wall:.0f} s; results in {out_dir}"]):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in summary_mod.cost_lines(summary.rows, price.per_hour) if price else []:  # summary.md has them too
        for part in textwrap.wrap(f"cost: {line}", summary_mod.WIDTH, subsequent_indent="  "):
            out.print(part, markup=False, highlight=False)
    return 0


def _sweep_ab(args: argparse.Namespace) -> int:
    """``sweep --ab`` (bench/run/ab.py): run, print the comparison, exit 0 (gate with ``bench compare OUT/a OUT/b
    --fail-on``)."""
    from bench.analyze.compare import parse_threshold
    from bench.run import ab
    from bench.run.runner import Launch, default_out_dir

    # The same layering as a plain sweep; when resuming, side a's resolved sweep.toml is the config.
    cfg = sweep_config_from_args(args, args.out / "a" if args.out is not None else None)
    device = resolve_device(cfg.device)
    default = default_out_dir(cfg)
    out_dir = args.out or default.with_name(default.name + "-ab")
    other = ab.resolve_checkout(args.ab)
    try:
        launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
        runner = ab.AbRunner(cfg, out_dir, device, other, resume=args.resume, command=command_line(args),
                             extend=args.extend, launch=launch, threshold=parse_threshold(args.threshold))
        runner.claim()  # bad input is one line, before the banner
        err.print(f"[bold]trainbench[/] A/B sweep '{runner.cfg.name}' on {device}: this checkout (A) vs {args.ab} "
                  f"(B) -> {out_dir}")
        started = time.perf_counter()
        with _progress_bar() as show:

            def on_progress(p: ab.AbProgress) -> None:
                show(p.total, p.done, progress_text(p.trial.trial_id, p.record, side=p.side.upper()))

            try:
                result = runner.run(on_progress)
            except KeyboardInterrupt as exc:
                err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/a and "
                          f"{out_dir}/b; continue with: python -m bench sweep --ab {shlex.quote(args.ab)} "
                          f"--resume --out {out_dir}")
                return interrupted_code(exc)
    finally:
        ab.release(other)
    if result is None:
        out.print(f"node {args.node_rank} took part in the A/B trials; node 0 records and compares them")
        return 0
    out.print(result.markdown, markup=False, highlight=False)
    out.print(f"wall time {time.perf_counter() - started:.0f} s; A/B results in {out_dir} (compare.md)")
    return 0
