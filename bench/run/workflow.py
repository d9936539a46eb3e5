"""The one workflow behind ``python -m bench`` and ``bench.sweep`` / ``bench.tune``: the entry points parse and
print; everything between a resolved config and the files a run leaves is here.

- ``sweep``: claim the directory (bad input is one ``ConfigError`` before anything runs), resume, prepare
  (env.json with the calibrated peaks, the parity references), run the trials (and the sequential phase), then
  write summary.md and the report. Returns a ``SweepResult`` holding the summary rows the terminal shows.
- ``sweep_ab``: ``sweep --ab`` (``bench.run.ab``): both sides interleaved, then compared (OUT/compare.md).
- ``tune``: the search (``bench.run.tune``) through the sweep's runner, then ``finish_tune``: tune.json, tune.md
  and its figure, summary.md and the report. Interrupted, the partial result is written before the interrupt goes
  on to the caller.
- ``reproduce``: a committed sweep's recorded configuration (a sweep's config, or a tune's setup) run again by
  ``sweep`` or ``tune`` into a new directory, then compared with the committed one through the one verdict engine
  (``bench.analyze.compare.compare_dirs``).

Two callbacks let a caller show the work: ``on_start(Start)`` once the directory is claimed (the CLI's banner),
``on_progress(Progress)`` after each trial (the CLI's bar, the API's ``on_trial``). Library code logs; nothing here
prints. An interrupt (Ctrl-C, or SIGTERM turned into one by the CLI) reaches the caller after the trials finished
so far are saved; a resume continues from them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.core.files import RUNS_DIR
from bench.plan.config import SweepConfig
from bench.plan.planner import resolve_device
from bench.records.results import TrialRecord
from bench.run.executors import Executor, LocalExecutor
from bench.run.launcher import Launch
from bench.run.runner import Progress, SweepRunner, default_out_dir, utc_stamp

if TYPE_CHECKING:
    import torch

    from bench.analyze.compare import Comparison
    from bench.report.summary import Summary
    from bench.run import ab, tune_setup
    from bench.run import tune as tune_mod

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """A run whose directory is claimed, about to start (what a banner says)."""

    out_dir: Path
    cfg: SweepConfig  # as claimed: a resume with --extend may have grown the plan
    device: torch.device | None  # None: a batch executor resolves it on the nodes
    executor: str  # "local", "slurm", "submitit-local"
    warnings: tuple[str, ...] = ()  # what the caller should hear before the trials start (oversubscribed cores)


@dataclass
class SweepResult:
    """What a finished sweep left: its records, summary rows and report (none on the nodes that do not record)."""

    out_dir: Path
    cfg: SweepConfig
    records: list[TrialRecord]
    wall_s: float
    resumed: int  # trials already in results.jsonl, not run again
    recorder: bool  # node 0 (or the only node): it wrote summary.md and the report
    summary: Summary | None = None  # summary.md's rows and the terminal's lines (bench.report.summary)
    report: dict[str, Path] = field(default_factory=dict)  # the report's files by format


@dataclass
class TuneResult:
    """What a finished (or interrupted) search left: tune.json's content and every file written."""

    out_dir: Path
    result: dict[str, Any]  # tune.json's content (bench.run.tune.result_dict)
    snippets: str  # the recommended set's plain-PyTorch snippets (tune.md's last section)
    step: tune_mod.Step
    settings: tune_mod.Settings
    records: list[TrialRecord]
    wall_s: float
    written: list[Path] = field(default_factory=list)  # tune.json, tune.md (+ its figure), the report's files
    summary: Summary | None = None  # summary.md's rows and the terminal's lines


@dataclass
class ReproduceResult:
    """A committed sweep run again (``run``, in ``out_dir``) and its comparison with the committed one: BASE the
    committed run, NEW the new one."""

    committed: Path
    out_dir: Path
    run: SweepResult | TuneResult
    comparison: Comparison


StartCallback = Callable[[Start], None]
ProgressCallback = Callable[[Progress], None]


# ---- a sweep ----------------------------------------------------------------------------------------------------


def sweep(cfg: SweepConfig, out: Path | str | None = None, *, resume: bool = False, extend: bool = False,
          command: str = "", launch: Launch | None = None, executor: Executor | None = None,
          on_start: StartCallback | None = None, on_progress: ProgressCallback | None = None) -> SweepResult:
    """Run the sweep ``cfg`` into ``out`` (default ``bench.run.runner.default_out_dir``) end to end.

    ``command`` is recorded in env.json (how to reproduce it). ``launch``: this node's place in a multi-node sweep.
    ``executor``: where trials run (default: this machine, one at a time). Bad input (the directory, a resume that
    changes settings) raises ``ConfigError`` before ``on_start`` is called and before anything is written."""
    executor = executor or LocalExecutor()
    # A batch executor's trials run on other machines: the device is resolved there (its setup job).
    device = resolve_device(cfg.device) if executor.name == "local" else None
    out_dir = Path(out) if out is not None else default_out_dir(cfg)
    runner = SweepRunner(cfg, out_dir, device, resume=resume, command=command, launch=launch, extend=extend,
                         executor=executor)
    runner.claim()
    warned = oversubscription(runner.cfg) if executor.name == "local" and device is not None and \
        device.type == "cpu" else None
    if warned and on_start is None:  # a caller with a banner says it there (the CLI); else the log does
        log.warning("%s", warned)
    if on_start:
        on_start(Start(out_dir, runner.cfg, device, executor.name, (warned,) if warned else ()))
    started = time.perf_counter()
    resumed = 0

    def progress(p: Progress) -> None:
        nonlocal resumed
        resumed += p.record is None
        if on_progress:
            on_progress(p)

    records = runner.run(progress)
    done = SweepResult(out_dir, runner.cfg, records, time.perf_counter() - started, resumed, runner.recorder)
    if runner.recorder:
        done.summary, done.report = _summary_and_report(out_dir, records, done.wall_s, runner.cfg)
    return done


LOAD_SAMPLE_S = 0.5  # how long the other processes' CPU use is read before a sweep starts


def oversubscription(cfg: SweepConfig, sample_s: float = LOAD_SAMPLE_S) -> str | None:
    """Why the trials' threads will not find free cores, or None: the threads of the busiest trial (a one-process
    trial's, or a node's ranks x theirs) against the cores this process may use less what other processes keep
    busy now. Threads that outnumber the free cores slow every step many-fold the moment anything else runs, and the
    report then calls the sweep noisy without saying why."""
    import torch

    from bench.measure.timing import CpuContention, allowed_cpus
    from bench.plan.planner import world_size_for

    cores = len(allowed_cpus() or ()) or os.cpu_count() or 1
    one = cfg.threads or torch.get_num_threads()
    multi = any(world_size_for(t, cfg.world_size) > 1 for t in cfg.techniques)
    ranks = cfg.nproc * (cfg.threads or 1) if multi else 0  # torchrun gives each rank 1 thread unless --threads
    threads = max(one, ranks)
    meter = CpuContention()
    meter.start()
    time.sleep(sample_s)
    others = meter.stop().fraction * cores
    free = cores - others
    if threads <= free + 0.5:  # half a core of other work is a shell, a logger: not what makes steps crawl
        return None
    busy = f", while other processes keep about {others:.1f} of them busy" if others >= 0.5 else ""
    fits = max(1, int(free) // (cfg.nproc if multi else 1))
    fix = f"use --threads {fits} or run on an idle machine" if fits < (cfg.threads or one) else \
        f"run on an idle machine (--threads {fits} is the fewest{'; or fewer --nproc ranks' if multi else ''})"
    return (f"the trials will run {threads} thread(s) on {cores} core(s){busy}: with more threads than free cores "
            f"a step slows down many times over whenever anything else runs (the report then calls it noisy); "
            f"{fix}")


def _summary_and_report(out_dir: Path, records: list[TrialRecord], wall_s: float, cfg: SweepConfig
                        ) -> tuple[Summary, dict[str, Path]]:
    from bench.report import write_report
    from bench.report.summary import write_summary

    price = cfg.price
    summary = write_summary(out_dir, records, wall_s, cfg.name, price.per_hour if price else None)
    return summary, write_report([out_dir])


def sweep_ab(cfg: SweepConfig, other: str, out: Path | str | None = None, *, threshold: float | None = None,
             resume: bool = False, extend: bool = False, command: str = "", launch: Launch | None = None,
             on_start: StartCallback | None = None,
             on_progress: Callable[[ab.AbProgress], None] | None = None,
             isolation_b: str | None = None) -> ab.AbResult | None:
    """``sweep --ab OTHER``: the plan of ``cfg`` run with this checkout's code (OUT/a) and ``other``'s (OUT/b, a
    directory or a git revision), trials interleaved, then B compared with A (OUT/compare.md). ``out`` defaults to
    ``default_out_dir`` with ``-ab``. A temporary worktree of a revision is always removed. None on the other
    nodes of a multi-node run (node 0 records and compares). ``isolation_b``: side B's trials start this way
    instead (``--ab . --ab-isolation fresh``: the same code, fork against fresh; ``bench.run.ab.side_configs``)."""
    from bench.analyze.compare import DEFAULT_THRESHOLD
    from bench.run import ab

    device = resolve_device(cfg.device)
    if out is None:
        default = default_out_dir(cfg)
        out = default.with_name(default.name + "-ab")
    out_dir = Path(out)
    checkout = ab.resolve_checkout(other)
    try:
        runner = ab.AbRunner(cfg, out_dir, device, checkout, resume=resume, command=command, extend=extend,
                             launch=launch, threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
                             isolation_b=isolation_b)
        runner.claim()
        if on_start:
            on_start(Start(out_dir, runner.cfg, device, "local"))
        return runner.run(on_progress)
    finally:
        ab.release(checkout)


# ---- a tune -----------------------------------------------------------------------------------------------------


def tune(setup: tune_setup.Setup, out: Path | str | None = None, *, resume: bool = False, command: str = "",
         on_start: StartCallback | None = None, on_progress: ProgressCallback | None = None) -> TuneResult:
    """The search that ``setup`` (``bench.run.tune_setup.setup``) describes, run into ``out`` (default
    ``default_out_dir``) to its end, then ``finish_tune``. Interrupted (KeyboardInterrupt), tune.json and tune.md
    are written from the records so far and the interrupt goes on to the caller (``--resume`` continues it)."""
    from bench.run import tune as tune_mod
    from bench.run import tune_setup

    out_dir = Path(out) if out is not None else default_out_dir(setup.cfg)
    runner = SweepRunner(setup.cfg, out_dir, setup.device, resume=resume, command=command)
    runner.claim()  # bad input (the directory, a resume that changes settings): before anything runs
    settings = setup.settings
    try:
        tune_setup.write_options(out_dir, setup.opts)
        if on_start:
            on_start(Start(out_dir, runner.cfg, setup.device, "local"))
        env = runner.prepare()
        started = time.perf_counter()
        step = tune_mod.search(runner, settings, setup.refuse, env, on_progress)
    except KeyboardInterrupt:
        records = runner.records()
        _tune_files(out_dir, tune_mod.result_dict(records, tune_mod.next_step(settings, records, setup.refuse),
                                                  settings))
        raise
    finally:
        runner.close()
    return finish_tune(out_dir, runner.records(), step, settings, time.perf_counter() - started)


def finish_tune(out_dir: Path, records: list[TrialRecord], step: tune_mod.Step, settings: tune_mod.Settings,
                wall_s: float) -> TuneResult:
    """A finished search's files: tune.json (the result), tune.md and its figure, summary.md and the report."""
    from bench.report import tune as tune_report
    from bench.report import write_report
    from bench.report.summary import write_summary
    from bench.run import tune as tune_mod

    snippets = tune_report.snippets_for(step.recommended)
    result = tune_mod.result_dict(records, step, settings, wall_s)
    written = list(_tune_files(out_dir, result, snippets).values())
    summary = write_summary(out_dir, records, wall_s, "tune")
    written += write_report([out_dir]).values()
    return TuneResult(out_dir, result, snippets, step, settings, records, wall_s, written, summary)


def replayed_tune(out_dir: Path, elapsed_s: float | None = None) -> dict[str, Any]:
    """A finished search's result (what tune.json holds) decided again from its records, as the search decided it
    (the search is a function of them): how a committed search is re-rendered with today's words."""
    from bench.records.results import ResultStore
    from bench.run import tune as tune_mod
    from bench.run import tune_setup

    t = tune_setup.setup({}, {}, preset=None, config_path=None, out_dir=out_dir, resume=True, max_repeats=None)
    records = ResultStore(Path(out_dir) / "results.jsonl").read()
    return tune_mod.result_dict(records, tune_mod.next_step(t.settings, records, t.refuse), t.settings, elapsed_s)


def rewrite_tune(out_dir: Path) -> dict[str, Path]:
    """tune.json and tune.md of a finished search again (``replayed_tune``), keeping its recorded elapsed time."""
    import json

    from bench.report import tune as tune_report

    elapsed = json.loads((Path(out_dir) / "tune.json").read_text()).get("elapsed_s")
    result = replayed_tune(out_dir, elapsed)
    return _tune_files(Path(out_dir), result, tune_report.snippets_for(result["recommended"]))


def _tune_files(out_dir: Path, result: dict[str, Any], snippets: str = "") -> dict[str, Path]:
    """tune.json (the search's result), then tune.md and its figure rendered from it; the paths by kind."""
    from bench.report import tune as tune_report
    from bench.run import tune as tune_mod

    return {"json": tune_mod.write_json(out_dir, result), **tune_report.write(out_dir, result, snippets)}


# ---- reproduce ----------------------------------------------------------------------------------------------------


def reproduce_out_dir(committed: Path) -> Path:
    """``runs/reproduce-<name>-<UTC time>/``: a new directory beside the user's runs, never the committed one."""
    return RUNS_DIR / f"reproduce-{Path(committed).resolve().name}-{utc_stamp()}"


def reproduce(committed: Path | str, rerun: SweepConfig | tune_setup.Setup, out: Path | str | None = None, *,
              threshold: float | None = None, command: str = "", on_start: StartCallback | None = None,
              on_progress: ProgressCallback | None = None) -> ReproduceResult:
    """Run ``rerun`` (the committed sweep's recorded configuration: a sweep's config, or a tune's setup) into ``out``
    (default ``reproduce_out_dir``) through ``sweep`` or ``tune``, then compare the new run (NEW) with ``committed``
    (BASE) at ``threshold`` (default 5%). ``command`` is recorded in the new run's env.json (the command that makes
    it again). A committed directory that holds no records to compare with raises ``CompareError`` before anything
    runs; a new directory that is not new or empty, ``ConfigError``."""
    from bench.analyze import compare

    committed = Path(committed)
    compare.load_sweep(committed)  # bad input, one line, before anything runs
    out_dir = Path(out) if out is not None else reproduce_out_dir(committed)
    if out_dir.resolve() == committed.resolve():
        raise compare.CompareError(f"--out {out_dir} is the committed sweep itself; reproduce writes a new directory")
    if isinstance(rerun, SweepConfig):
        run: SweepResult | TuneResult = sweep(rerun, out_dir, command=command, on_start=on_start,
                                              on_progress=on_progress)
    else:
        run = tune(rerun, out_dir, command=command, on_start=on_start, on_progress=on_progress)
    comparison = compare.compare_dirs(committed, out_dir,
                                      compare.DEFAULT_THRESHOLD if threshold is None else threshold)
    return ReproduceResult(committed, out_dir, run, comparison)


__all__ = ["ProgressCallback", "ReproduceResult", "Start", "StartCallback", "SweepResult", "TuneResult", "finish_tune",
           "reproduce", "reproduce_out_dir", "sweep", "sweep_ab", "tune"]
