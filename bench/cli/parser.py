"""The command line's options: one ``_add_*`` per command (``build_parser``). Help texts are the reference for the
flags: `--help` prints them, and docs/commands.md names the ones that matter."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.analyze import cost
from bench.plan.config import PRESETS

OBJECTIVE_NAMES = ("throughput", "time-to-target", "memory")  # bench.run.tune.OBJECTIVES (imported lazily there)


def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run workloads x technique sets x repeats, record results.jsonl and a summary",
        description="Run a sweep. Settings come from the preset, then --config, then the flags given here.",
    )
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="starting settings (default: gpu where the trials run on CUDA, else quick; smoke takes "
                        "about a minute, standard is for a laptop; docs/gpu.md)")
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
    _add_design(p)
    _add_budget(p)
    _add_processes(p)
    _add_executor(p)
    _add_price(p)
    _add_output(p)


def _add_design(p: argparse.ArgumentParser) -> None:
    """How many trials: repeats, the sequential design, seeds, what a trial measures."""
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
    p.add_argument("--order", choices=["shuffled", "priority"],
                   help="run order: shuffled (default: each repeat's configurations in a seeded random order) or "
                        "priority (the sets in the order given, the baseline beside the first, each through all its "
                        "repeats before the next, so a sweep cut short has its first comparisons complete)")
    p.add_argument("--threshold", default="5%",
                   help="with --ab: the smallest throughput change of B against A that counts, as a percentage or "
                        "fraction (default 5%%); the sequential phase adds pairs while B's verdict against this "
                        "threshold is open, and the printed comparison uses it (pass the same to bench compare)")
    p.add_argument("--seed", type=int, help="seed of repeat 0 (repeat r uses seed + r)")
    p.add_argument("--mode", choices=["speed", "quality", "both"],
                   help="what each trial measures: speed (timed window and memory), quality (the quality run: "
                        "metric at equal samples, time-to-target), or both (default)")


def _add_budget(p: argparse.ArgumentParser) -> None:
    """What one trial spends: the quality budget, the timed window, the timeout, the memory passes; its threads."""
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


def _add_processes(p: argparse.ArgumentParser) -> None:
    """Where a trial's processes run: processes per node, nodes, the device."""
    p.add_argument("--nproc", type=int,
                   help="processes per node for the multi-process sets: data parallel and sharding (ddp, "
                        "zero1-3, deepspeed, fedavg, local_sgd) and model parallel (tp, pp), started with torchrun "
                        "(gloo on CPU, NCCL on CUDA); other sets run in one process as the reference. Each rank "
                        "runs --threads threads (1 without it), so with --threads a set of N ranks uses N times the "
                        "reference's cores, which the report labels")
    p.add_argument("--nnodes", type=int, help="nodes taking part (multi-node: run the same sweep on every node)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (multi-node; node 0 records results)")
    p.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous, the same on every node (multi-node)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device for every trial (default: auto)")
    p.add_argument("--isolation", choices=["fork", "fresh"],
                   help="how each one-process trial's process starts: fork (default: from a server that imported "
                        "torch and the harness once) or fresh (a new interpreter each, which imports torch again); "
                        "torchrun trials always start fresh; every record says which (docs/methodology.md)")


def _add_output(p: argparse.ArgumentParser) -> None:
    """Where the sweep goes, resuming it, and the A/B run."""
    p.add_argument("--out", type=Path, help="output directory (default: runs/<preset>-<UTC time>/; runs/ is git-ignored)")
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
    p.add_argument("--ab-isolation", choices=["fork", "fresh"],
                   help="with --ab .: side B's trials start this way, side A's as --isolation says, so the A/B run "
                        "compares the two ways of starting a trial (against another checkout both sides start "
                        "fresh)")


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
    p.add_argument("--model", metavar="PATH.py:FUNCTION",
                   help="your model (as sweep --model takes it): checked once, then which techniques run on it and "
                        "why the others would be skipped")
    p.add_argument("--nproc", type=int, default=2,
                   help="with --model: the ranks multi-process techniques are asked about (default 2)")


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
                        "runs/profile-<workload>-<set>-<UTC time>/)")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def _add_export(sub: argparse._SubParsersAction) -> None:
    from bench.records.export_targets import DEFAULT_OUT, TARGETS

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
    _add_tune_trials(p)
    p.add_argument("--out", type=Path, help="output directory (default: runs/tune-<UTC time>/)")
    p.add_argument("--resume", action="store_true",
                   help="continue the search in --out (after Ctrl-C or kill -9): its settings are read from there")
    p.add_argument("--dry-run", action="store_true",
                   help="plan only: print the candidates, what is not tried and why, and the size of the exhaustive "
                        "space (with the sweep that would measure it); runs and writes nothing")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the harness does")


def _add_tune_trials(p: argparse.ArgumentParser) -> None:
    """The search's budget and its trials' settings (as a sweep's)."""
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="trial wall time the whole search may spend (default: no limit); may be raised on --resume")
    p.add_argument("--max-repeats", type=int, metavar="N",
                   help="pairs per comparison at most: the sequential design's cap (default 8)")
    p.add_argument("--nproc", type=int,
                   help="processes for the multi-process candidates: data parallel and sharding (ddp, zero1-3, "
                        "deepspeed) and model parallel (tp, pp), started with torchrun; other sets run in one process")
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


def _add_reproduce(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="rerun a sweep's recorded configuration into a new directory and say whether its results reproduce",
        description="Rerun the sweep in DIR (a committed example, or any sweep directory) with the configuration it "
                    "recorded (DIR/sweep.toml and the command in DIR/env.json, as its report's Reproduce line "
                    "gives it) into a new directory, then compare the new run with DIR through the one verdict "
                    "engine (as bench compare does) and say per configuration (workload x technique set): "
                    "reproduced (the throughput ratio new/committed is equivalent within --threshold), differs "
                    "(faster or slower, with the ratio and its interval) or cannot tell (inconclusive, with about "
                    "how many pairs would decide it, or too few pairs). A line before the table names how this "
                    "machine differs from the one that made DIR (env.json). A report, not a gate: exit code 0 "
                    "whatever the answers, 2 on bad input.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="the sweep directory to reproduce (holds sweep.toml, "
                                                         "env.json and results.jsonl), e.g. reports/example-cpu")
    p.add_argument("--out", type=Path,
                   help="directory for the new run (default: runs/reproduce-<name of DIR>-<UTC time>/)")
    p.add_argument("--threshold", default="5%",
                   help="the throughput change that counts, as a percentage or fraction (default 5%%): reproduced "
                        "when the whole 95%% interval of new/committed lies within it, differs when beyond it")
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
    _add_reproduce(sub)
    return parser
