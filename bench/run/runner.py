"""Runs a planned sweep: trials through an executor, results appended as they finish, resume, timeouts.

Before the first trial, the parity references the plan needs are computed in one child process (``bench.reference``,
cached in ``OUT/references/``) and matmul peaks are calibrated for each thread count the trials run with, on the
machine the trials run on. How a trial is launched, killed and recorded is ``bench.run.launcher``; where it runs is the
executor's (``bench.run.executors``: this machine, one trial after another, by default; Slurm jobs through submitit).

Work done once per sweep rather than once per trial lives beside the records: the parity references and the decoded
datasets (``OUT/references/``, ``OUT/references/datasets/``) and each technique set's TorchInductor cache
(``OUT/cache/inductor/``, ``bench.run.launcher``); none of it is inside a timed
window or a quality run's clock, so none changes a measurement.

Multi-node sweeps run the same command on every node; before the first trial the nodes agree on the trials already
done (``bench.run.nodes``), so a resumed sweep launches the same trials, in the same order, on every node.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.core.files import REPO_DIR, RUNS_DIR, write_atomic
from bench.plan.config import ConfigError, SweepConfig, check_shard
from bench.plan.planner import Trial, check_nproc
from bench.records.results import ResultStore, TrialRecord
from bench.run import adaptive, isolation, nodes, sweepdir
from bench.run.continuation import continuation_trials
from bench.run.executors import Executor, LocalExecutor  # they see the runner as their Sweep protocol
from bench.run.isolation import ForkServer
from bench.run.launcher import Launch, TrialLauncher

log = logging.getLogger(__name__)



@dataclass
class Progress:
    """What the runner reports after each trial (the CLI draws it)."""

    done: int
    total: int
    trial: Trial
    record: TrialRecord | None  # None: already in results.jsonl (resume)


def default_out_dir(cfg: SweepConfig) -> Path:
    """``runs/<name>-<UTC time>/``: a user's sweeps and tunes stay apart from the committed examples in reports/."""
    return RUNS_DIR / f"{cfg.name}-{utc_stamp()}"


def utc_stamp() -> str:
    """The time in a default directory's name: ``20260101-120000`` (UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")


class SweepRunner:
    def __init__(
        self, cfg: SweepConfig, out_dir: Path, device: torch.device | None, resume: bool = False, command: str = "",
        code_dir: Path | None = None, launch: Launch | None = None, extend: bool = False,
        executor: Executor | None = None,
    ) -> None:
        self.cfg = cfg
        self.extend = extend  # --resume --extend: grow the stored plan on purpose
        self.launch = launch or Launch()
        # The checkout whose code the trial processes run (their cwd, so `python -m bench.trial` imports its
        # bench/ and techniques/): this repo by default, another checkout for `sweep --ab`.
        self.code_dir = Path(code_dir) if code_dir is not None else REPO_DIR
        self.command = command  # how to reproduce, recorded in env.json
        self.out_dir = Path(out_dir)
        self.device = device  # None until a batch job has resolved it on the nodes (bench.run.executors)
        if device is not None:  # before the directory is claimed: a refused sweep leaves nothing behind
            check_nproc(device, cfg.nproc)
        self.resume = resume
        self.executor = executor or LocalExecutor()
        self.store = ResultStore(self.out_dir / "results.jsonl")
        self.lock = sweepdir.SweepLock(self.out_dir)
        self.claimed = False
        self._server: ForkServer | None = None  # the sweep's fork server, made on first use: see fork_server
        self._compile_server: ForkServer | None = None  # see compile_server

    @property
    def launcher(self) -> TrialLauncher:
        """How this sweep's trials are launched (the settings as claimed: a resume may have extended the plan)."""
        return TrialLauncher(self.cfg, self.out_dir, self.device, self.code_dir, self.launch, self.fork_server,
                             self.compile_server)

    @property
    def fork_server(self) -> ForkServer | None:
        """The sweep's fork server (``bench.run.isolation``), one for all its trials, started when first asked for a
        trial and stopped by ``close()``; None where no trial forks (``--isolation fresh``, another checkout, a
        batch executor, whose jobs start each trial fresh on their node)."""
        if self._server is None and isinstance(self.executor, LocalExecutor) and (
                isolation.fresh_reason(self.cfg, self.code_dir) is None):
            self._server = ForkServer(self.code_dir)
        return self._server

    @property
    def compile_server(self) -> ForkServer | None:
        """The sweep's second fork server, for the trials of its sets that compile (``bench.run.isolation``): made
        where the plan has such sets and trials fork, started when first asked for a trial, stopped by ``close()``."""
        if self._compile_server is None and self.fork_server is not None and any(
                map(isolation.compiles, self.cfg.techniques)):
            self._compile_server = ForkServer(self.code_dir, compile_imports=True)
        return self._compile_server

    @property
    def config_hash(self) -> str:
        """The hash of the settings every record of this sweep carries."""
        return self.launcher.config_hash

    @property
    def recorder(self) -> bool:
        """Whether this process records results: node 0 of a multi-node sweep (the others may share the directory)."""
        return self.launch.node_rank == 0

    def claim(self) -> None:
        """Claim the output directory: checks, the lock, the resumed config, sweep.toml.

        Bad input (a file as --out, someone else's files, a resume that would mix settings) raises ConfigError
        before anything is written. The lock is held until ``close()``.
        """
        if self.recorder:
            self.lock.check_free()
            if self.resume:
                sweepdir.check_resumable(self.out_dir)
            else:
                sweepdir.check_new(self.out_dir)
        sweepdir.make_dir(self.out_dir)
        if self.recorder:
            self.lock.acquire()
        try:
            if self.resume:
                self.cfg = sweepdir.resumed_config(self.out_dir, self.cfg, self.extend)
                self.store.repair_tail()
                sweepdir.check_records([r.config_hash for r in self.store.iter_records()], self.config_hash,
                                       self.out_dir)
            if self.cfg.shard:  # on the whole plan (a resume with --extend has just grown it)
                check_shard(self.cfg.shard, len(self.cfg.workloads))
            self.executor.claim(self)
            sweepdir.remove_stale_temp_dirs()
            write_atomic(self.out_dir / "sweep.toml", self.cfg.to_toml())
        except BaseException:
            self.close()
            raise
        self.claimed = True

    def prepare(self) -> dict:
        """``claim()`` (unless done), then env.json on this machine: written with calibrated peaks, or reused when
        resuming."""
        if not self.claimed:
            self.claim()
        if not self.recorder:
            # Another node of a multi-node sweep: its ranks write no record, so it needs no peaks, and it must not
            # replace node 0's env.json when the nodes share the directory.
            return {"device": str(self.device), "node_rank": self.launch.node_rank}
        try:
            return self.launcher.environment(self.command, self.resume)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the fork server; release the directory's lock (the kernel also drops it if this process dies)."""
        for server in (self._server, self._compile_server):
            if server is not None:
                server.stop()
        self.lock.release()
        self.claimed = False

    def agree_on_done(self, trials: list[Trial], done: set[str]) -> set[str]:
        """The trials every node skips: node 0's record of them (one node: ``done`` itself)."""
        if self.launch.nnodes == 1:
            return done & {t.trial_id for t in trials}
        if not self.launch.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        return nodes.agree_on_done(self.launch.rdzv_endpoint, self.launch.node_rank, self.launch.nnodes,
                                   [t.trial_id for t in trials], done)

    def _continuations(self) -> list[Trial]:
        """The time-budgeted continuations the recorded trials call for and the store lacks (none for sweeps of
        several nodes: their other nodes do not read node 0's records)."""
        if self.launch.nnodes > 1 or not self.recorder:
            return []
        records = self.store.read()
        return continuation_trials(self.cfg, records, {r.trial_id for r in records})

    def records(self) -> list[TrialRecord]:
        """The records in results.jsonl so far."""
        return self.store.read()

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> list[TrialRecord]:
        if not self.claimed:
            self.claim()
        try:
            env, trials, done = self.executor.setup(self, self.store.done_trial_ids())
            finished = 0
            for trial in trials:  # resumed: the trials already recorded first
                if trial.trial_id in done:
                    finished += 1
                    if on_progress:
                        on_progress(Progress(finished, len(trials), trial, None))
            pending = [t for t in trials if t.trial_id not in done]
            finished = self.run_trials(pending, env, on_progress, finished, len(trials))
            # Continuations for quality at equal time (bench.run.continuation), from the records just written.
            extra = self._continuations()
            total = len(trials) + len(extra)
            finished = self.run_trials(extra, env, on_progress, finished, total)
            if self.cfg.sequential:
                self._sequential_phase(env, finished, total, on_progress)
            return self.store.read()
        finally:
            self.close()

    def run_trials(self, trials: Sequence[Trial], env: dict, on_progress: Callable[[Progress], None] | None = None,
                   finished: int = 0, total: int | None = None, references: bool = False) -> int:
        """Run ``trials`` through the executor, append each record to results.jsonl (node 0 records; the other
        nodes of a multi-node sweep take part), and report each to ``on_progress`` as trial ``finished + i`` of
        ``total`` (default: these trials). ``references``: compute the parity references they need first, in one
        child process (the planned trials' are computed by the executor's setup). Returns the new count finished.

        ``env`` is ``prepare()``'s. A caller that plans its own trials from the records (``bench.run.tune``) calls it
        once per batch between ``claim()`` and ``close()``."""
        trials = list(trials)
        if references:
            self.launcher.start_server(trials)  # its imports beside the references' process
            self.launcher.prepare_references(trials)
        total = finished + len(trials) if total is None else total
        for trial, record in self.executor.run(self, trials, env):
            if self.recorder:
                self.store.append(record)
            finished += 1
            if on_progress:
                on_progress(Progress(finished, total, trial, record))
        return finished

    def _sequential_phase(self, env: dict, finished: int, total: int,
                          on_progress: Callable[[Progress], None] | None) -> None:
        """``--repeats auto``: rounds of speed-only pairs while verdicts are open (``bench.run.adaptive``)."""
        if self.launch.nnodes > 1:
            log.warning("--repeats auto adds no speed-only pairs to a multi-node sweep (its nodes would have to "
                        "agree on every round): the planned %d repeats are the design", self.cfg.repeats)
            return
        if not self.recorder:  # a node that records nothing has no verdicts to read (one node: node 0 records)
            return
        records = self.store.read()
        budget = adaptive.budget_s(self.cfg, records)
        while True:
            trials = adaptive.next_round(self.cfg, records, budget - adaptive.spent_s(records))
            if not trials:
                break
            total += len(trials)
            finished = self.run_trials(trials, env, on_progress, finished, total)
            records = self.store.read()
