"""Command line: ``python -m bench {sweep,list,report,compare,profile,env,export,tune}``. The only module that prints.

Bad input (unknown workload or technique, bad option, malformed TOML) gets one line on stderr naming what is
valid, and exit code 2. Results already recorded are never lost: an interrupted sweep resumes with --resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench import workloads
from bench.analyze import cost
from bench.analyze import summary as summary_mod
from bench.core.files import REPO_DIR, write_atomic
from bench.plan.config import PRESETS, ConfigError, SweepConfig, build_config
from bench.plan.planner import available_packages, resolve_device
from bench.records.results import RecordError, TrialRecord

EXIT_USAGE = 2
OBJECTIVE_NAMES = ("throughput", "time-to-target", "memory")  # bench.run.tune.OBJECTIVES (imported lazily there)

# Piped output (CI logs, files) gets a wide console instead of rich's 80-column default.
out = Console() if sys.stdout.isatty() else Console(width=180)
err = Console(stderr=True)


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run workloads x technique sets x repeats, record results.jsonl and a summary",
        description="Run a sweep. Settings come from the preset, then --config, then the flags given here.",
    )
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="starting settings (default: quick; smoke takes about a minute, standard is for a laptop)")
    p.add_argument("--config", type=Path, help="TOML file with the same fields as the flags (see docs/commands.md)")
    p.add_argument("--workloads", help="comma list of name[:size], e.g. mlp,gpt:small (see `python -m bench list`)")
    p.add_argument("--techniques",
                   help="comma list of technique sets; '+' joins a combination, ':k=v' sets options, "
                        "e.g. bf16,grad_accum:steps=4,bf16+compile (baseline is always added)")
    p.add_argument("--model", action="append", metavar="[NAME=]PATH.py:FUNCTION",
                   help="your own model: a function that builds it (docs/models.md), e.g. my_model.py:build or "
                        "package.module:build; repeatable. It becomes a workload named NAME (default: the file's "
                        "name) at its build's default size; the sweep runs only the models unless --workloads is "
                        "given too")
    p.add_argument("--blocks", metavar="ATTR.PATH",
                   help="dotted path of a --model's nn.ModuleList of repeated blocks (for checkpointing, per-block "
                        "compile, FSDP), when it has no `blocks` attribute and is not found by itself")
    p.add_argument("--technique", action="append", metavar="PATH.py:CLASS",
                   help="your own technique class (a techniques.Technique subclass, docs/plugins.md), e.g. "
                        "my_tech.py:MyTechnique; repeatable. Then name it in --techniques")
    p.add_argument("--repeats", metavar="N|auto",
                   help="repeats (seeds) per configuration: a whole number for a fixed design, or auto (the quick and "
                        "standard presets' default): 3 full trials, then speed-only pairs beside a baseline trial "
                        "while a configuration's speed or memory verdict is open, under a stopping rule that keeps "
                        "its error rate over every look (docs/methodology.md)")
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="a sequential design's cap: pairs per configuration at most (default with auto: 8); with "
                        "--repeats N, a sequential design starting from N")
    p.add_argument("--decide-within", type=float, metavar="SECONDS",
                   help="time the sequential phase may spend, shared by the open configurations, the closest to a "
                        "decision first (default: half the wall time of the planned trials)")
    p.add_argument("--threshold", default="5%",
                   help="with --ab: the smallest throughput change of B against A that counts, as a percentage or "
                        "fraction (default 5%%); the sequential phase adds pairs while B's verdict against this "
                        "threshold is open, and the printed comparison uses it (pass the same to bench compare)")
    p.add_argument("--seed", type=int, help="seed of repeat 0 (repeat r uses seed + r)")
    p.add_argument("--mode", choices=["speed", "quality", "both"],
                   help="what each trial measures: speed (timed window and memory), quality (the quality run: "
                        "metric at equal samples, time-to-target), or both (default)")
    p.add_argument("--steps", type=int,
                   help="quality budget: optimizer steps at the workload's batch, the same samples for every set "
                        "(default: each workload size's documented budget, the one its target was set for)")
    p.add_argument("--eval-points", type=int,
                   help="evaluations over the quality budget (default: the workload size's)")
    p.add_argument("--seconds", type=float,
                   help="safety cap on a quality run's training clock; a run it cuts is marked and not compared")
    p.add_argument("--window-steps", type=int, help="minimum steps in the timed window")
    p.add_argument("--window-seconds", type=float, help="minimum seconds in the timed window")
    p.add_argument("--timeout", type=float, help="seconds before a trial process is killed (recorded as timeout)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory passes after training (clean RSS pass, tensor-memory breakdown)")
    p.add_argument("--threads", type=int, help="torch threads per trial process (default: torch's choice)")
    p.add_argument("--nproc", type=int,
                   help="processes per node for data-parallel / sharding sets (ddp, zero1-3, deepspeed), started "
                        "with torchrun (gloo on CPU, NCCL on CUDA); other sets run in one process as the reference")
    p.add_argument("--nnodes", type=int, help="nodes taking part (multi-node: run the same sweep on every node)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (multi-node; node 0 records results)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous, the same on every node (multi-node)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device for every trial (default: auto)")
    _add_executor(p)
    _add_price(p)
    p.add_argument("--out", type=Path, help="output directory (default: reports/<preset>-<UTC time>/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the sweep in --out: finished trials are kept and not rerun; its settings must not "
                        "change (budget, mode, device, threads, processes, seed)")
    p.add_argument("--extend", action="store_true",
                   help="with --resume: add the workloads, technique sets or repeats given here to the sweep in --out "
                        "(without it, a resume that changes the plan is refused)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")
    p.add_argument("--ab", metavar="REV_OR_DIR",
                   help="A/B run: every trial runs with this checkout's code (OUT/a) and with another's (OUT/b), "
                        "alternating; REV_OR_DIR is a git revision (checked out into a temporary worktree) or a "
                        "directory holding another checkout ('.' for an A/A run); writes OUT/compare.md")


def _add_executor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", choices=["local", "slurm", "submitit-local"],
                   help="where trials run: local (default: this machine, one trial at a time), slurm (one job per "
                        "trial through submitit; --out must be on a filesystem the nodes share), or submitit-local "
                        "(the submitit path on this machine, to try it); a resumed sweep keeps its executor "
                        "(docs/clusters.md)")
    p.add_argument("--slurm-partition", metavar="NAME", help="Slurm partition for the trial jobs")
    p.add_argument("--slurm-gpus-per-trial", type=int, metavar="N",
                   help="GPUs each trial job gets (its --nproc processes use them; default 0)")
    p.add_argument("--slurm-cpus-per-trial", type=int, metavar="N",
                   help="cores each trial job gets; without it a job has its node to itself (--exclusive), so "
                        "timed trials never share cores")
    p.add_argument("--slurm-option", action="append", metavar="KEY=VALUE",
                   help="any other Slurm parameter of the jobs, e.g. account=ml, qos=high, constraint=h100; "
                        "repeatable")
    p.add_argument("--max-running", type=int, metavar="N",
                   help="at most N trial jobs queued or running at once (slurm: no cap by default; submitit-local: "
                        "1, so timed trials never share this machine)")
    p.add_argument("--slurm-poll-seconds", type=float, metavar="S",
                   help="how often the submitter asks Slurm about its jobs (default 15; submitit-local: 0.5)")
    p.add_argument("--shard", metavar="I/N",
                   help="run shard I of N (I from 0): every N-th workload of the plan, with all its technique sets "
                        "and repeats, so each machine holds whole comparisons; merge with `bench report DIR1 DIR2 "
                        "...`")


def _add_price(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--price-per-hour", type=float, metavar="PRICE",
                       help="price of the machine per hour (the whole instance, all its devices), e.g. 2.50: adds "
                            "a Cost section to the report (cost per million samples, to the target, saved per "
                            "1,000 training hours)")
    group.add_argument("--instance", metavar="NAME",
                       help="take the price per hour from an example on-demand price (as listed 2025; check the "
                            f"current one): {', '.join(cost.INSTANCES)}; a config's [prices] table adds others")


def _add_list(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("list", help="show workloads (with sizes) and techniques (with kind, options, availability)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="device to check availability against")


def _add_env(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="print this machine's fingerprint (and measured peak FLOP/s with --peaks)")
    p.add_argument("--peaks", action="store_true", help="also measure matmul peak FLOP/s (a few seconds)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two sweep directories: faster / slower / equivalent / inconclusive per configuration",
        description="Match the trials of two sweeps by workload, technique set and options (and trials by id, so "
                    "the comparison is paired), and report per configuration throughput and peak memory as "
                    "geometric-mean ratios NEW/BASE and the metric at equal samples as a difference, each with its "
                    "95% interval (t, or a sequential design's repeated interval) and its verdict: faster / slower / "
                    "equivalent / inconclusive, and an overall verdict across configurations. Exit code 1 when --fail-on trips, "
                    "2 on bad input. See docs/regression.md.",
    )
    p.add_argument("base", type=Path, metavar="BASE_DIR", help="the reference sweep directory")
    p.add_argument("new", type=Path, metavar="NEW_DIR", help="the sweep directory judged against it")
    p.add_argument("--threshold", default="5%",
                   help="smallest throughput change that counts, as a percentage or fraction (default 5%%); a "
                        "change counts when its whole 95%% interval lies beyond it (memory: 1%%; the metric: any "
                        "difference)")
    p.add_argument("--fail-on", default="",
                   help="exit 1 when any configuration is: slower, more-memory, worse-metric, failed (NEW trials "
                        "failed where BASE ran), or regression (all of these); a comma list")
    p.add_argument("--out", type=Path, help="also write the comparison as markdown to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="render report.md and report.html from one or more sweep directories",
        description="Re-render a sweep's report from its results.jsonl (+ env.json): per workload speedups with 95% "
                    "intervals, memory, MFU, one-off costs, quality at equal samples, time-to-target, parity; "
                    "figures; claims check; failures; "
                    "noise warnings; what to try next. Several directories are merged into one report (sweeps from "
                    "different machines are kept apart).",
    )
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="sweep directories (each holds results.jsonl)")
    p.add_argument("--baseline", default="baseline",
                   help="technique set every speedup and difference is measured against (default: baseline)")
    p.add_argument("--format", default="md,html", help="comma list of formats to write: md, html (default: both)")
    p.add_argument("--threshold", default="5%",
                   help="smallest speed change that counts, as a percentage or fraction (default 5%%); a change "
                        "counts when its whole 95%% interval lies beyond it")
    p.add_argument("--out", type=Path,
                   help="directory to write into (default: DIR itself; required with several DIRs)")
    _add_price(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="find the bottleneck of one workload x technique set: phase breakdown, top operators, a trace",
        description="Build one workload with one technique set exactly as a sweep trial does, then: warm-up steps; "
                    "a phase pass (each labelled region of the step timed: data wait, host-to-device copy, forward, "
                    "backward, optimizer, other; with its share and spread); a pass under torch.profiler that "
                    "writes a Chrome/Perfetto trace and ranks operators by self time; and a diagnosis that names "
                    "the bottleneck and the technique to try. See docs/profiling.md.",
    )
    p.add_argument("workload", nargs="?", help="name[:size] (see `python -m bench list`); omit with --model")
    p.add_argument("--techniques", default="baseline",
                   help="ONE technique set ('+' joins techniques, ':k=v' sets options), e.g. loader:workers=2 or "
                        "bf16+compile (default: baseline)")
    p.add_argument("--model", action="append", metavar="[NAME=]PATH.py:FUNCTION",
                   help="profile your own model (docs/models.md) instead of a built-in workload")
    p.add_argument("--blocks", metavar="ATTR.PATH", help="dotted path of the --model's repeated blocks")
    p.add_argument("--technique", action="append", metavar="PATH.py:CLASS",
                   help="your own technique class (docs/plugins.md); then name it in --techniques")
    p.add_argument("--steps", type=int, default=5, help="profiled steps in the trace (default 5)")
    p.add_argument("--phase-steps", type=int, default=20,
                   help="steps of the phase pass, timed without the profiler (default 20)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps first, at least 1 (default 3; compilation happens here)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model and the batch order (default 0)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="device (default: auto)")
    p.add_argument("--out", type=Path,
                   help="directory for profile.json, profile.md and trace.json (default: "
                        "profiles/<workload>-<set>-<UTC time>/)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def _add_export(sub: argparse._SubParsersAction) -> None:
    from bench.report.exporters import DEFAULT_OUT, TARGETS

    p = sub.add_parser(
        "export",
        help="write sweeps' trials where other tools read them: parquet, csv, mlflow, tensorboard",
        description="Write the trials of one or more sweep directories for other tools, from results.jsonl alone: "
                    "parquet or csv (bench.load's typed frame, one row per trial; nested columns as JSON text), "
                    "mlflow (one experiment per sweep, one run per trial with its parameters, metrics, eval curve, "
                    "record and report, in a local SQLite or file tracking store, no server; exporting again "
                    "updates the runs and never duplicates them), tensorboard (event files, one run per trial: "
                    "training loss and eval curve against samples, speed and memory numbers, the HParams table). "
                    "Each target but csv needs its extra: pip install 'trainbench[parquet|mlflow|tensorboard]'. "
                    "See docs/commands.md.",
    )
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="sweep directories (each holds results.jsonl)")
    p.add_argument("--to", required=True, choices=list(TARGETS), help="the format or tool to write")
    p.add_argument("--out",
                   help="where to write (default, with one DIR: " + ", ".join(f"DIR/{v} for {k}" for k, v in
                                                                          DEFAULT_OUT.items()) +
                        "; required with several DIRs); mlflow: a .db file is a SQLite store (artifacts in "
                        "mlartifacts/ beside it), another path a file store; sqlite:///PATH and file:PATH URIs work "
                        "too")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness (and MLflow) does")


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search for the best technique set for one model under your limits, with its evidence",
        description="Search the combinations of the techniques that run here for the best set for ONE workload "
                    "(or --model): singles first, then greedy forward selection (add the technique that helps "
                    "the current best most, keep it only when its verdict says it helps), each comparison stopped "
                    "by the sequential design's stopping rule as soon as it is decided. Trials are sweep trials "
                    "(one process each, results.jsonl, env.json, sweep.toml in --out; `bench report` renders it); "
                    "the search is a function of the records, so --resume continues it. Writes tune.md and "
                    "tune.json. Exit code 2 on bad input or when no measured set fits under --memory-limit. See "
                    "docs/tune.md.",
    )
    p.add_argument("--workloads", help="the ONE workload to tune, name[:size], e.g. gpt:small (see `python -m bench "
                                       "list`); or give --model")
    p.add_argument("--model", action="append", metavar="[NAME=]PATH.py:FUNCTION",
                   help="your own model instead: a function that builds it (docs/models.md), e.g. my_model.py:build")
    p.add_argument("--blocks", metavar="ATTR.PATH", help="dotted path of a --model's nn.ModuleList of repeated blocks")
    p.add_argument("--technique", action="append", metavar="PATH.py:CLASS",
                   help="your own technique class (docs/plugins.md), offered to the search like the built-in ones")
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="the trials' budgets (speed window, quality run) come from this preset (default: quick)")
    p.add_argument("--config", type=Path, help="TOML file with sweep settings (docs/commands.md); flags win")
    p.add_argument("--objective", metavar="|".join(OBJECTIVE_NAMES),
                   help="what the best set maximises: throughput (samples/s, default), time-to-target (the "
                        "workload's documented target, from quality runs) or memory (the smallest peak)")
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="a set whose peak memory (tensor peak, CUDA allocator peak, or RSS where the tracker is "
                        "blind) exceeds this is infeasible, e.g. 512MiB, 8GiB, 2000000000 (bytes)")
    p.add_argument("--quality", metavar="same|within=X|any",
                   help="how much of the metric at equal samples you will give up: same (default: nothing), "
                        "within=X (at most X of the metric), any (not checked); exact sets are always the same")
    p.add_argument("--techniques",
                   help="restrict the candidates to these single techniques (':k=v' sets options), e.g. "
                        "bf16,grad_accum:steps=4,checkpointing (default: every registered technique that runs here)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="trial wall time the whole search may spend (default: no limit); may be raised on --resume")
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="pairs per comparison at most: the sequential design's cap (default 8)")
    p.add_argument("--nproc", type=int,
                   help="processes for the data-parallel / sharding candidates (ddp, zero1-3, deepspeed), started "
                        "with torchrun; other sets run in one process")
    p.add_argument("--seed", type=int, help="seed of the first round (round r uses seed + r mod 3)")
    p.add_argument("--steps", type=int, help="quality runs: optimizer steps (default: the workload size's budget)")
    p.add_argument("--seconds", type=float,
                   help="safety cap on a quality run's training clock (default: the preset's); a run it cuts is not "
                        "compared, so raise it (with --timeout) for workloads whose budget takes longer")
    p.add_argument("--window-steps", type=int, help="minimum steps in each trial's timed window")
    p.add_argument("--window-seconds", type=float, help="minimum seconds in each trial's timed window")
    p.add_argument("--timeout", type=float, help="seconds before a trial process is killed (recorded as timeout)")
    p.add_argument("--threads", type=int, help="torch threads per trial process (default: torch's choice)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device for every trial (default: auto)")
    p.add_argument("--out", type=Path, help="output directory (default: reports/tune-<UTC time>/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the search in --out (after Ctrl-C or kill -9): its settings are read from there")
    p.add_argument("--dry-run", action="store_true",
                   help="plan only: print the candidates, what is not tried and why, and the size of the exhaustive "
                        "space (with the sweep that would measure it); runs and writes nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="trainbench: measure training-acceleration techniques side by side.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_sweep(sub)
    _add_list(sub)
    _add_env(sub)
    _add_compare(sub)
    _add_report(sub)
    _add_profile(sub)
    _add_export(sub)
    _add_tune(sub)
    return parser


# ---- sweep --------------------------------------------------------------------------------------------------


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
    return build_config(args.preset or "quick", overrides, config_path)


def progress_text(trial_id: str, record: TrialRecord | None, side: str = "") -> str:
    """The progress bar's last line: ``gpt:tiny/bf16/seed0/r0: ok 1,234 samples/s`` (or why it is not ok)."""
    head = f"{side} {trial_id}" if side else trial_id
    if record is None:
        return f"{head}: already done"
    sps = record.speed.samples_per_s if record.speed else None
    detail = f"{sps:,.0f} samples/s" if record.status == "ok" and sps else (record.reason or "")[:60]
    return f"{head}: {record.status} {detail}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``): handled like Ctrl-C, so finished trials are kept and the running
    trial's processes are killed."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def interrupted_word(exc: BaseException) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def interrupted_code(exc: BaseException) -> int:
    return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.extend and not args.resume:
        raise ConfigError("--extend grows a sweep that exists: use it with --resume --out DIR")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _sweep(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sweep(args: argparse.Namespace) -> int:
    if args.ab and args.executor not in (None, "local"):
        raise ConfigError("--ab runs both sides on this machine, back to back, so drift hits both alike; it does not "
                          f"combine with --executor {args.executor}")
    if args.threshold != "5%" and not args.ab:
        raise ConfigError("--threshold sets the A/B comparison's threshold (sweep --ab); a sweep's report takes its "
                          "own: python -m bench report DIR --threshold ...")
    if args.ab:  # A/B: both sides interleaved, then compared (bench/run/ab.py)
        return _sweep_ab(args)
    from bench.run import executors
    from bench.run.runner import Launch, SweepRunner, default_out_dir

    cfg = sweep_config_from_args(args, args.out)
    executor = executors.from_args(args.executor, args.out, args.resume, args.slurm_partition,
                                   args.slurm_gpus_per_trial, args.slurm_cpus_per_trial, args.max_running,
                                   args.slurm_option, args.slurm_poll_seconds)
    # A batch executor's trials run on other machines: the device is resolved there (its setup job).
    device = resolve_device(cfg.device) if executor.name == "local" else None
    out_dir = args.out or default_out_dir(cfg)
    command = "python -m bench " + shlex.join(args.argv)
    launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    runner = SweepRunner(cfg, out_dir, device, resume=args.resume, command=command, launch=launch, extend=args.extend,
                         executor=executor)

    runner.claim()  # bad input (the directory, a resume that changes settings) is one line, before the banner
    where = f"on {device}" if device is not None else f"through the {executor.name} executor"
    shard = f" (shard {args.shard})" if runner.cfg.shard else ""
    err.print(f"[bold]trainbench[/] sweep '{runner.cfg.name}'{shard} {where} -> {out_dir}")
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=err, transient=False) as bar:
        task = bar.add_task("trials", total=None, last="measuring peak FLOP/s...")

        skipped = []

        def on_progress(p) -> None:  # type: ignore[no-untyped-def]
            if p.record is None:
                skipped.append(p.trial.trial_id)
            bar.update(task, total=p.total, completed=p.done, last=progress_text(p.trial.trial_id, p.record))

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
    if not runner.recorder:
        out.print(f"node {args.node_rank} took part in the trials in {wall:.0f} s; node 0 records the results and "
                  "writes the summary and the report")
        return 0
    from bench.api import write_summary

    price = runner.cfg.price
    _print_summary(write_summary(out_dir, records, wall, cfg.name, price.per_hour if price else None), price)
    from bench.report import write_report

    for path in write_report([out_dir]).values():
        out.print(f"report: {path}", markup=False, highlight=False)
    out.print(f"wall time {wall:.0f} s; results in {out_dir}")
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
    command = "python -m bench " + shlex.join(args.argv)
    other = ab.resolve_checkout(args.ab)
    try:
        launch = Launch(nnodes=cfg.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
        runner = ab.AbRunner(cfg, out_dir, device, other, resume=args.resume, command=command, extend=args.extend,
                             launch=launch, threshold=parse_threshold(args.threshold))
        runner.claim()  # bad input is one line, before the banner
        err.print(f"[bold]trainbench[/] A/B sweep '{runner.cfg.name}' on {device}: this checkout (A) vs {args.ab} "
                  f"(B) -> {out_dir}")
        started = time.perf_counter()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}"), console=err, transient=False) as bar:
            task = bar.add_task("trials", total=None, last="measuring peak FLOP/s...")

            def on_progress(p: ab.AbProgress) -> None:
                last = progress_text(p.trial.trial_id, p.record, side=p.side.upper())
                bar.update(task, total=p.total, completed=p.done, last=last)

            try:
                result = runner.run(on_progress)
            except KeyboardInterrupt as exc:
                err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/a and "
                          f"{out_dir}/b; continue with: python -m bench sweep --ab {shlex.quote(args.ab)} --resume "
                          f"--out {out_dir}")
                return interrupted_code(exc)
    finally:
        ab.release(other)
    if result is None:
        out.print(f"node {args.node_rank} took part in the A/B trials; node 0 records and compares them")
        return 0
    out.print(result.markdown, markup=False, highlight=False)
    out.print(f"wall time {time.perf_counter() - started:.0f} s; A/B results in {out_dir} (compare.md)")
    return 0


def _print_summary(rows: list[summary_mod.SummaryRow], price: cost.Price | None = None) -> None:
    # The terminal gets the columns that fit; notes go below the table (summary.md and the report have all).
    shown = [c for c in summary_mod.COLUMNS if c != "notes"]
    table = Table(title="Summary (against baseline; see summary.md for the legend)")
    for col in shown:
        table.add_column(col, overflow="fold")
    notes = []
    for row in rows:
        cells = dict(zip(summary_mod.COLUMNS, summary_mod.row_cells(row), strict=True))
        table.add_row(*(cells[c] for c in shown))
        if cells.get("notes"):
            notes.append(f"{cells['workload']} {cells['techniques']}: {cells['notes']}")
    out.print(table)
    for note in notes:
        out.print(f"note: {note}", markup=False, highlight=False)
    for line in summary_mod.cost_lines(rows, price.per_hour if price else None):
        out.print(f"cost: {line}", markup=False, highlight=False)


# ---- list / env ---------------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    import techniques
    from bench.plan import plugins
    from techniques.base import Context

    plugins.load_entry_points()
    device = resolve_device(args.device)
    wl_table = Table(title="Workloads (sizes with their quality budget and validation target)")
    for col in ("name", "sizes", "available", "about"):
        wl_table.add_column(col, overflow="fold")
    for name, cls in sorted(workloads.registry().items()):
        wl = cls()
        reason = wl.check()
        sizes = "; ".join(_size_text(size, wl.size_params(size)) for size in cls.sizes)
        wl_table.add_row(name, sizes, "yes" if reason is None else f"no: {reason}", cls.summary)
    out.print(wl_table)

    ctx = Context(device=device, available_packages=available_packages())
    t_table = Table(title=f"Techniques (availability on {device})")
    for col in ("name", "kind", "options", f"runs on {device}", "about"):
        t_table.add_column(col, overflow="fold")
    for name, cls in sorted(techniques.registry().items()):
        reason = cls().check(ctx)
        t_table.add_row(name, cls.kind.value, cls.option_help() or "-", "yes" if reason is None else f"no: {reason}",
                        cls.summary)
    out.print(t_table)
    return 0


def _size_text(size: str, params: dict) -> str:
    budget = f"{params['quality_steps']} steps x batch {params.get('batch_size', '?')}" \
        if params.get("quality_steps") else "no budget"
    target = f"target {params['target']:g}" if params.get("target") is not None else "no target yet"
    return f"{size} ({budget}, {target})"


def cmd_env(args: argparse.Namespace) -> int:
    from bench.measure import env as envmod

    info = envmod.fingerprint(REPO_DIR)
    if args.peaks:
        info["peak_flops"] = envmod.calibrate_peaks(resolve_device(args.device))
    out.print_json(json.dumps(info, default=str))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.analyze import compare as compare_mod
    from bench.records.reader import blocking_file

    threshold = compare_mod.parse_threshold(args.threshold)
    fail_on = compare_mod.parse_fail_on(args.fail_on)
    comp = compare_mod.compare_dirs(args.base, args.new, threshold)
    md = compare_mod.to_markdown(comp, title=f"Compare {args.new} against {args.base}")
    if args.out:
        blocker = blocking_file(args.out.parent)
        if blocker is not None:
            raise compare_mod.CompareError(f"cannot write {args.out}: {blocker} is a file, not a directory")
        try:  # whole or not at all: a CI step may read it while another writes
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.out, md)
        except OSError as exc:  # a directory, a path under a file, unwritable: exit 2 through main
            raise compare_mod.CompareError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    out.print(md, markup=False, highlight=False)
    failing = comp.failing(fail_on)
    if failing:
        for key, why in failing:
            err.print(f"regression: {key.label}: {', '.join(sorted(why))}", markup=False, highlight=False)
        return 1
    return 0



def cmd_report(args: argparse.Namespace) -> int:
    from bench.analyze.analysis import Thresholds
    from bench.analyze.compare import parse_threshold
    from bench.report import InputError, parse_formats, write_report

    price = cost.resolve(args.price_per_hour, args.instance)  # an unknown instance: one line, exit 2 (main)
    try:
        thresholds = Thresholds(speed=parse_threshold(args.threshold))
        paths = write_report(args.dirs, out_dir=args.out, baseline=args.baseline, formats=parse_formats(args.format),
                             thresholds=thresholds, price=price)
    except InputError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the records hold
        return EXIT_USAGE
    for path in paths.values():
        out.print(f"report: {path}", markup=False, highlight=False)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from bench.records.reader import InputError
    from bench.report.exporters import export

    if args.to == "mlflow" and not args.verbose:  # MLflow and its migrations log each step at INFO
        try:
            import mlflow  # noqa: F401  (its import sets its loggers' levels: lower them after it)
        except ImportError:
            pass  # export() says which extra to install
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        done = export(args.dirs, args.to, args.out)
    except InputError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # one line, whatever the records hold
        return EXIT_USAGE
    news = f" ({done.created} new, {done.updated} updated)" if args.to in ("mlflow", "tensorboard") else ""
    out.print(f"{args.to}: {done.trials} trials{news} -> {done.where}", markup=False, highlight=False)
    out.print(f"view with: {done.view}", markup=False, highlight=False)
    return 0


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
    table = Table(title=f"Where a step's time goes ({result.phases.steps} steps, mean "
                        f"{result.phases.step_s * 1e3:.2f} ms)")
    for col in ("phase", "mean ms", "median ms", "IQR ms", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for row in profile_mod.phase_rows(result.phases):
        table.add_row(*row)
    out.print(table)
    ops = Table(title=f"Top operators by {result.self_time_by} self time ({result.profiled_steps} profiled steps)")
    for col in ("operator", "calls", "self ms/step", "share"):
        ops.add_column(col, justify="left" if col == "operator" else "right", overflow="fold")
    for op in result.top_ops[:10]:
        ops.add_row(op.name, str(op.calls), f"{op.per_step_s * 1e3:.3f}", f"{100 * op.share:.1f}%")
    out.print(ops)
    out.print(f"diagnosis: {result.phases.diagnosis}", markup=False, highlight=False)
    out.print(f"trace: {result.trace}; profile.md and profile.json in {out_dir}", markup=False, highlight=False)
    return 0


# ---- tune ---------------------------------------------------------------------------------------------------


TUNE_FILE = "tune.toml"  # the search's own settings beside sweep.toml (what --resume reads back)


def cmd_tune(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _tune(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _tune_options(args: argparse.Namespace) -> dict:
    """The search's options: the flags given, else (on --resume) what the directory recorded, else the defaults.
    A resume may raise --budget; any other option that differs from the recorded one is refused."""
    import tomllib

    given = {"objective": args.objective, "memory_limit": args.memory_limit, "quality": args.quality,
             "techniques": args.techniques, "budget": args.budget}
    stored: dict = {}
    if args.resume:
        path = args.out / TUNE_FILE
        if not path.is_file():
            raise ConfigError(f"--resume --out {args.out}: no {TUNE_FILE} there, so no search to continue (a sweep "
                              "directory resumes with `bench sweep --resume`)")
        try:
            stored = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--resume: {path} is not valid TOML ({exc}); restore it or start a new --out") from None
        for key, value in given.items():
            if key != "budget" and value is not None and key in stored and str(stored[key]) != str(value):
                raise ConfigError(f"--resume: --{key.replace('_', '-')} {value} differs from the search's "
                                  f"{stored[key]} in {args.out}; resume without it, or start a new --out")
            if key != "budget" and value is not None and key not in stored:
                raise ConfigError(f"--resume: the search in {args.out} ran without --{key.replace('_', '-')}; "
                                  "resume without it, or start a new --out")
    merged = {**stored, **{k: v for k, v in given.items() if v is not None}}
    return {"objective": merged.get("objective", "throughput"), "memory_limit": merged.get("memory_limit"),
            "quality": merged.get("quality", "same"), "techniques": merged.get("techniques"),
            "budget": merged.get("budget")}


@dataclass
class _TuneSetup:
    """What ``tune``'s options resolve to before anything runs (bad input raised as ConfigError on the way)."""

    opts: dict
    cfg: Any
    settings: Any  # bench.run.tune.Settings
    refuse: Callable[[Any], str | None]  # the planner's reason a set cannot run here, or None
    kinds: dict[str, str]  # candidate label -> kind
    device: str
    limit: int | None


def _tune_setup(args: argparse.Namespace) -> _TuneSetup:
    import dataclasses

    from bench.plan.config import DEFAULT_MAX_REPEATS, parse_technique_sets
    from bench.plan.planner import incompatibility, world_size_for
    from bench.run import tune
    from techniques.base import set_kind

    if args.resume and args.out is None:
        raise ConfigError("--resume needs --out DIR (the tune directory to continue)")
    opts = _tune_options(args)
    goal = tune.objective_of(opts["objective"])
    limit = tune.parse_size(opts["memory_limit"]) if opts["memory_limit"] is not None else None
    quality = tune.Quality.parse(opts["quality"])
    if opts["budget"] is not None and not (math.isfinite(opts["budget"]) and opts["budget"] > 0):
        raise ConfigError(f"--budget must be a number of seconds > 0, got {opts['budget']}")
    if args.max_repeats is not None and not 3 <= args.max_repeats <= 200:
        raise ConfigError(f"--max-repeats must be between 3 (the fewest pairs that give a verdict) and 200, got "
                          f"{args.max_repeats}")
    config_path = args.config
    if args.resume and config_path is None and (args.out / "sweep.toml").exists():
        config_path = args.out / "sweep.toml"
    budget = {"train_steps": args.steps, "max_train_seconds": args.seconds, "min_steps": args.window_steps,
              "min_seconds": args.window_seconds, "timeout_s": args.timeout}
    overrides = {"workloads": args.workloads, "models": args.model, "blocks": args.blocks,
                 "technique_plugins": args.technique, "seed": args.seed, "device": args.device,
                 "threads": args.threads, "nproc": args.nproc,
                 "budget": {k: v for k, v in budget.items() if v is not None} or None}
    if not args.resume and not args.workloads and not args.model and config_path is None:
        raise ConfigError("name the workload to tune (--workloads gpt:small) or give --model PATH.py:FUNCTION")
    cfg = build_config(args.preset or "quick", overrides, config_path)
    if len(cfg.workloads) != 1:
        raise ConfigError(f"tune searches for one model; got {len(cfg.workloads)} workloads "
                          f"({', '.join(w.label for w in cfg.workloads)}): give one --workloads NAME[:SIZE] or one "
                          "--model")
    workload = cfg.workloads[0]
    if goal.name == "time-to-target" and workloads.get(workload.name).size_params(workload.size).get("target") is None:
        raise ConfigError(f"--objective time-to-target: workload {workload.label} documents no target (its "
                          "build's result may give one: docs/models.md); use throughput or memory")
    device = resolve_device(cfg.device)

    def refuse(techs) -> str | None:  # type: ignore[no-untyped-def]
        return incompatibility(techs, workload, device, world_size_for(techs, cfg.world_size))

    restrict = parse_technique_sets(opts["techniques"]) if opts["techniques"] else None
    singles, skipped = tune.candidate_singles(workload, refuse, restrict)
    kinds = {s.label: set_kind(x.resolve() for x in s.specs).value for s in singles}
    quality_runs = goal.mode == "both" or (quality.rule != "any" and any(k != "exact" for k in kinds.values()))
    cap = args.max_repeats or (cfg.max_repeats if args.resume and cfg.max_repeats else DEFAULT_MAX_REPEATS)
    cfg = dataclasses.replace(cfg, name="tune", techniques=tuple(singles) or (tune.BASELINE,), repeats=3,
                              max_repeats=cap, mode="both" if quality_runs else "speed")
    settings = tune.Settings(workload, tuple(singles), goal.name, limit, quality, cap, opts["budget"], cfg.seed,
                             cfg.world_size, tuple(skipped))
    return _TuneSetup(opts, cfg, settings, refuse, kinds, device, limit)


def _tune(args: argparse.Namespace) -> int:
    import tomli_w

    from bench.run import tune
    from bench.run.runner import SweepRunner, default_out_dir

    t = _tune_setup(args)
    settings, refuse, limit = t.settings, t.refuse, t.limit
    if args.dry_run:
        return _tune_dry_run(settings, refuse, t.kinds)
    out_dir = args.out or default_out_dir(t.cfg)
    command = "python -m bench " + shlex.join(args.argv)
    runner = SweepRunner(t.cfg, out_dir, t.device, resume=args.resume, command=command)
    runner.claim()  # bad input (the directory, a resume that changes settings): one line, before anything runs
    try:
        write_atomic(out_dir / TUNE_FILE, tomli_w.dumps({k: v for k, v in t.opts.items() if v is not None}))
        limits = (f", memory limit {tune.size_text(limit)}" if limit else "") + (
            f", budget {t.opts['budget']:g} s" if t.opts["budget"] else "")
        err.print(f"[bold]trainbench[/] tune {settings.workload.label} on {t.device} ({settings.objective}{limits}, "
                  f"quality {settings.quality.label}): {len(settings.singles)} candidates, "
                  f"{len(settings.not_tried)} not tried -> {out_dir}")
        env = runner.prepare()
        started = time.perf_counter()
        while True:
            step = tune.next_step(settings, runner.store.read(), refuse)
            if step.done:
                break
            runner.launcher.prepare_references(step.pending)
            for trial, record in runner.executor.run(runner, step.pending, env):
                runner.store.append(record)
                err.print(progress_text(trial.trial_id, record), markup=False, highlight=False)
    except KeyboardInterrupt as exc:
        records = runner.store.read()
        tune.write(out_dir, tune.result_dict(records, tune.next_step(settings, records, refuse), settings))
        err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/results.jsonl; "
                  f"continue with: python -m bench tune --resume --out {out_dir}")
        return interrupted_code(exc)
    finally:
        runner.close()
    return _tune_finish(out_dir, runner.store.read(), step, settings, time.perf_counter() - started)


def _tune_finish(out_dir: Path, records: list, step: Any, settings: Any, wall: float) -> int:
    """Write tune.json/tune.md, the summary and the report; print the recommendation; the exit code."""
    from bench.api import write_summary
    from bench.report import write_report
    from bench.run import tune

    snippets = tune.snippets_for(step.recommended)
    result = tune.result_dict(records, step, settings, wall)
    paths = tune.write(out_dir, result, snippets)
    write_summary(out_dir, records, wall, "tune")
    report = write_report([out_dir])
    _print_tune(result, snippets)
    for path in (*paths.values(), *report.values()):
        out.print(f"wrote {path}", markup=False, highlight=False)
    if step.recommended is None:
        peak = step.smallest_peak
        if peak is not None:
            print(f"error: no measured set fits under --memory-limit {tune.size_text(settings.memory_limit)}: the "
                  f"smallest peak found is {tune.size_text(peak[1])} ({peak[2]}) of {peak[0]}", file=sys.stderr)
            return tune.EXIT_INFEASIBLE
        print(f"error: {one_line(step.stop)}", file=sys.stderr)
        return tune.EXIT_NOTHING
    return 0


def _print_tune(result: dict, snippets: str) -> None:
    from bench.run import tune

    if result["recommended"]:
        out.print(f"recommended: {result['recommended']} ({result['stop']})", markup=False, highlight=False)
        for against, c in result["comparisons"].items():
            role = "runner-up " if against == result["runner_up"] else ""
            out.print(f"  against the {role}{against}: speed {c['speed']}; memory {c['memory']}; quality "
                      f"{c['quality']}" + (f"; time to target {c['time_to_target']}" if "time_to_target" in c else ""),
                      markup=False, highlight=False)
    out.print(f"search: {result['trials']} trials, {result['trial_time_s']:.0f} s of trial time, "
              f"{len(result['trace'])} steps in the trace (tune.md)", markup=False, highlight=False)
    for n in result["not_tried"][:20]:
        out.print(f"  not tried: {n['set']}: {one_line(n['why'], 160)}", markup=False, highlight=False)
    if len(result["not_tried"]) > 20:
        out.print(f"  ... and {len(result['not_tried']) - 20} more (tune.md)", markup=False, highlight=False)
    if snippets:
        out.print(f"\n{tune.SNIPPET_HEADING}:\n\n{snippets}", markup=False, highlight=False)


def _tune_dry_run(settings, refuse, kinds) -> int:  # type: ignore[no-untyped-def]
    from bench.run import tune

    out.print(f"tune {settings.workload.label}: objective {settings.objective}, quality {settings.quality.label}, "
              f"memory limit {tune.size_text(settings.memory_limit) if settings.memory_limit else 'none'}, world "
              f"size {settings.world_size}, cap {settings.cap}", markup=False, highlight=False)
    out.print(f"candidates ({len(settings.singles)}): " + (", ".join(f"{s.label} ({kinds[s.label]})"
                                                                     for s in settings.singles) or "none"),
              markup=False, highlight=False)
    for label, why in settings.not_tried:
        out.print(f"  not tried: {label}: {one_line(why, 200)}", markup=False, highlight=False)
    space, cut = tune.exhaustive(settings.singles, refuse)
    more = "more than " if cut else ""
    out.print(f"exhaustive space: {more}{len(space)} sets the planner accepts (and the baseline); the search measures "
              f"{len(settings.singles)} singles first, then at most one stage per technique added", markup=False,
              highlight=False)
    if space and not cut and len(space) <= 512:
        out.print("the exhaustive sweep of the same candidates: python -m bench sweep --workloads "
                  f"{settings.workload.label} --techniques {','.join(s.label for s in space)} --mode speed "
                  f"--repeats auto --max-repeats {settings.cap}"
                  + (f" --nproc {settings.world_size}" if settings.world_size > 1 else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 0


COMMANDS = {"tune": cmd_tune, "profile": cmd_profile, "sweep": cmd_sweep, "list": cmd_list, "env": cmd_env, "compare": cmd_compare, "report": cmd_report,
            "export": cmd_export}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded in env.json: how to reproduce this run
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except (ConfigError, workloads.WorkloadError, RecordError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)  # one line, never wrapped
        return EXIT_USAGE


def one_line(message: str, limit: int = 1000) -> str:
    """The error as one line (echoed input is quoted and cut where it is echoed; this is the last guard)."""
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
