"""Where a sweep's trials run: this machine, one after another (``local``), or batch jobs through submitit.

An executor has three steps, called by ``SweepRunner.run`` (``bench.run.runner``), which it sees only through the
``Sweep`` protocol below (the runner imports the executors, never the other way round):

- ``claim(runner)``: refuse, before anything runs, what it cannot do (a resume that would run twice a trial whose job
  is still queued elsewhere; multi-node trials through a scheduler).
- ``setup(runner, done)``: on the machine the trials will run on, fingerprint it and calibrate its peaks (env.json),
  plan the trials (availability depends on that machine's device and packages) and compute the parity references;
  returns ``(env, trials, done)``.
- ``run(runner, trials, env)``: yields ``(trial, record)`` as each trial finishes, in any order.

``SubmititExecutor`` submits one job per trial (``slurm``, or ``submitit-local`` which runs the same path on this
machine, for trying it and for tests). Each job runs the trial exactly as the local executor does
(``bench.run.launcher``: its own processes, timeout, record of how it ended) and writes the record to
``OUT/trials/<id>.json``; the submitting process is the only writer of ``results.jsonl``, gathering those files as
jobs finish, so concurrent jobs never append to one file. ``OUT/jobs.json`` keeps each trial's job id: a submitter
stopped and started again with ``--resume`` waits for the jobs still queued or running instead of submitting them
again, and gathers what finished meanwhile. What Slurm says of a job's state: ``bench.run.slurmjobs``. Nothing here
schedules: Slurm (or submitit's local executor) does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import torch

from bench.core.files import write_atomic
from bench.measure import env as envmod
from bench.plan.config import ConfigError, SweepConfig
from bench.plan.planner import Trial, plan, resolve_device
from bench.records.results import ResultStore, TrialRecord
from bench.run import slurmjobs
from bench.run.launcher import TrialLauncher

log = logging.getLogger(__name__)

EXECUTORS = ("local", "slurm", "submitit-local")
LEDGER = "jobs.json"
TRIALS_DIR = "trials"
JOBS_DIR = "jobs"  # submitit's folder: pickled calls, job logs
SETUP_MARGIN_MIN = 30  # a job's time limit beyond the trial's timeout_s: start-up, imports, the record's write
RECORD_GRACE_S = 30.0  # how long a record may lag behind its job's end on a shared filesystem


class ExecutorError(ConfigError):
    """A batch executor's job failed or left an unusable record: one line, what to look at, exit code 2."""


class Sweep(Protocol):
    """What an executor may ask of the sweep it runs trials for (``SweepRunner`` is one)."""

    cfg: SweepConfig
    out_dir: Path
    device: torch.device | None  # None until a batch job has resolved it on the nodes
    resume: bool
    command: str  # how to reproduce, recorded in env.json
    store: ResultStore

    @property
    def launcher(self) -> TrialLauncher: ...

    @property
    def config_hash(self) -> str: ...

    @property
    def recorder(self) -> bool: ...

    def prepare(self) -> dict: ...

    def agree_on_done(self, trials: list[Trial], done: set[str]) -> set[str]: ...


class Executor(Protocol):
    """Where a sweep's trials run (see the module's docstring for the three steps)."""

    name: str

    def claim(self, runner: Sweep) -> None: ...

    def setup(self, runner: Sweep, done: set[str]) -> tuple[dict, list[Trial], set[str]]: ...

    def run(self, runner: Sweep, trials: list[Trial], env: dict) -> Iterator[tuple[Trial, TrialRecord]]: ...


class LocalExecutor:
    """Today's behaviour: every trial on this machine, one at a time, so no two timed trials share it."""

    name = "local"

    def claim(self, runner: Sweep) -> None:
        active = Ledger(runner.out_dir).active_jobs()
        if active:
            kind = Ledger(runner.out_dir).executor.get("kind", "a batch executor")
            raise ConfigError(f"{len(active)} trial job(s) of the sweep in {runner.out_dir} are still queued or "
                              f"running ({kind}: job {active[0]}{', ...' if len(active) > 1 else ''}); running them "
                              f"here too would record them twice: resume with --executor {kind} to wait for them, or "
                              "cancel them first")

    def setup(self, runner: Sweep, done: set[str]) -> tuple[dict, list[Trial], set[str]]:
        done = done | gather(runner)
        env = runner.prepare()
        trials = plan(runner.cfg, runner.device)
        done = runner.agree_on_done(trials, done)
        pending = [t for t in trials if t.trial_id not in done]
        runner.launcher.start_server(pending)
        runner.launcher.prepare_references(pending)
        return env, trials, done

    def run(self, runner: Sweep, trials: list[Trial], env: dict) -> Iterator[tuple[Trial, TrialRecord]]:
        launcher = runner.launcher
        for trial in trials:
            yield trial, launcher.run(trial, env)


# ---- the submitit executor ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmititExecutor:
    """One submitit job per trial. ``cluster``: ``slurm``, or ``local`` (submitit's local executor, this machine).

    Each job gets ``gpus_per_trial`` GPUs and, with ``cpus_per_trial``, that many cores; without it the job has its
    node to itself (``--exclusive``), so timing trials never share cores or devices. ``max_running`` caps the jobs
    queued or running at once (0: no cap; submitit-local defaults to 1, since its jobs share this machine).
    """

    cluster: str = "slurm"
    partition: str | None = None
    gpus_per_trial: int = 0
    cpus_per_trial: int | None = None
    max_running: int = 0
    poll_s: float = 15.0
    extra: tuple[tuple[str, Any], ...] = ()  # further submitit parameters, e.g. (("slurm_account", "ml"),)

    def __post_init__(self) -> None:
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(f"submitit cluster must be slurm or local, got {self.cluster!r}")
        if self.gpus_per_trial < 0 or (self.cpus_per_trial is not None and self.cpus_per_trial < 1):
            raise ConfigError("--slurm-gpus-per-trial must be >= 0 and --slurm-cpus-per-trial >= 1")
        if self.max_running < 0:
            raise ConfigError(f"--max-running must be >= 0 (0: no cap), got {self.max_running}")
        if not self.poll_s > 0:
            raise ConfigError(f"--slurm-poll-seconds must be > 0, got {self.poll_s:g}")

    @property
    def name(self) -> str:
        return "slurm" if self.cluster == "slurm" else "submitit-local"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, **{k: v for k, v in dataclasses.asdict(self).items() if k != "extra"},
                "extra": dict(self.extra)}

    def claim(self, runner: Sweep) -> None:
        _import_submitit()
        if self.cluster == "slurm" and shutil.which("srun") is None:
            raise ConfigError("--executor slurm: no Slurm here (no srun on PATH); start the sweep on a machine that "
                              "submits to the cluster (a login node), or use --executor submitit-local to try it")
        if runner.cfg.nnodes > 1:
            raise ConfigError(f"--executor {self.name} runs each trial on one node (torchrun with --nproc processes "
                              "there); multi-node trials (--nnodes > 1) run with --executor local on every node")
        if self.gpus_per_trial and runner.cfg.world_size > self.gpus_per_trial:
            raise ConfigError(f"--nproc {runner.cfg.nproc}: a data-parallel trial's ranks need that many GPUs in its "
                              f"job, and --slurm-gpus-per-trial is {self.gpus_per_trial}")
        Ledger(runner.out_dir).executor = self.describe()  # before any job: a resume finds the executor

    def setup(self, runner: Sweep, done: set[str]) -> tuple[dict, list[Trial], set[str]]:
        """env.json, the plan and the references, computed by a job on the cluster (the trials' kind of node)."""
        done = done | gather(runner)
        launcher = runner.launcher  # its device is resolved on the node
        job = self.submit(self._executor(runner, runner.cfg.budget.timeout_s),
                          setup_job, launcher, runner.command, runner.resume, sorted(done), self.describe())
        log.info("submitted the setup job %s (calibration, plan, references)", job.job_id)
        watch = slurmjobs.JobWatch()
        while not job.paths.result_pickle.exists() and self._alive({job.job_id: job}, watch)[job.job_id]:
            time.sleep(min(self.poll_s, 2.0))
        if not self._appears(job.paths.result_pickle):  # stopped from outside (scancel, its node, its time limit)
            raise ExecutorError(f"the sweep's setup job {job.job_id} ended ({self._state(job, watch)}) without a "
                                f"result (its log: {runner.out_dir / JOBS_DIR}/{job.job_id}_0_log.err)")
        try:
            device, env, trials = job.result()
        except Exception as exc:  # submitit's FailedJobError carries the job's traceback
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise ExecutorError(f"the sweep's setup job {job.job_id} failed on the {self.name} executor: {last} "
                                f"(its log: {runner.out_dir / JOBS_DIR}/{job.job_id}_0_log.err)") from None
        runner.device = torch.device(device)  # the nodes' device: this machine (a login node) may have no GPU
        return env, trials, done

    def run(self, runner: Sweep, trials: list[Trial], env: dict) -> Iterator[tuple[Trial, TrialRecord]]:
        launcher = runner.launcher
        ledger = Ledger(runner.out_dir)  # its executor was written by claim()
        executor = self._executor(runner, runner.cfg.budget.timeout_s)
        active: dict[str, tuple[Trial, Any]] = {}
        queue: list[Trial] = []
        watch = slurmjobs.JobWatch()
        for trial_id, job_id in self._unrecorded_jobs(runner.out_dir, ledger).items():
            # submitted by a submitter stopped between sbatch and writing jobs.json: that job is the trial's
            log.info("trial %s: Slurm job %s, submitted before jobs.json knew it, is its job", trial_id, job_id)
            ledger.add(trial_id, job_id)
        earlier = {t.trial_id: self._attach(runner.out_dir, ledger.job_of(t.trial_id)) for t in trials
                   if not t.skip_reason and ledger.job_of(t.trial_id) is not None}
        alive = self._alive({job.job_id: job for job in earlier.values()}, watch)  # one query for all of them
        for trial in trials:
            job = earlier.get(trial.trial_id)
            if trial.skip_reason:  # no job: the plan said why it cannot run
                yield trial, launcher.run(trial, env)
            elif job is None:
                queue.append(trial)
            elif alive[job.job_id]:  # still queued or running: wait for it, do not submit it again
                active[trial.trial_id] = (trial, job)
            else:  # ended while no submitter watched it (its record, if it wrote one, arrives here too)
                yield trial, self._finished(runner, trial, job, watch)
        while queue or active:
            while queue and (not self.max_running or len(active) < self.max_running):
                trial = queue.pop(0)
                executor.update_parameters(name=job_name(runner.out_dir, trial.trial_id))
                job = self.submit(executor, trial_job, launcher, trial, env, str(record_path(runner.out_dir, trial)))
                ledger.add(trial.trial_id, job.job_id)
                active[trial.trial_id] = (trial, job)
            time.sleep(self.poll_s)
            waiting = {job.job_id: job for trial, job in active.values()
                       if not record_path(runner.out_dir, trial).exists()}
            alive = self._alive(waiting, watch)
            for trial_id, (trial, job) in list(active.items()):
                if not alive.get(job.job_id, False):  # its record is there, or its job ended
                    del active[trial_id]
                    yield trial, self._finished(runner, trial, job, watch)

    # ---- submitit ----

    def submit(self, executor: Any, fn: Any, *args: Any) -> Any:
        """``executor.submit(fn, *args)``; a submitit-local job starts with SIGINT at its default, so that
        submitit's ``cancel()`` (SIGINT to the job's controller, which passes it on to the task) ends it."""
        with sigint_default_in_children() if self.cluster == "local" else contextlib.nullcontext():
            return executor.submit(fn, *args)

    def _executor(self, runner: Sweep, timeout_s: float) -> Any:
        submitit = _import_submitit()
        executor = submitit.AutoExecutor(folder=runner.out_dir / JOBS_DIR, cluster=self.cluster)
        params: dict[str, Any] = {"name": job_name(runner.out_dir, "setup"), "nodes": 1, "tasks_per_node": 1,
                                  "timeout_min": int(timeout_s // 60) + SETUP_MARGIN_MIN}
        if self.gpus_per_trial:
            params["gpus_per_node"] = self.gpus_per_trial
        if self.cluster == "slurm":
            if self.partition:
                params["slurm_partition"] = self.partition
            if self.cpus_per_trial:
                params["cpus_per_task"] = self.cpus_per_trial
            else:
                params["slurm_exclusive"] = True  # the whole node: no other job's work beside a timed trial
        params.update(dict(self.extra))
        try:
            executor.update_parameters(**params)
        except (ValueError, TypeError, NameError) as exc:  # NameError: an unknown --slurm-option
            raise ConfigError(f"--executor {self.name}: submitit refused the job parameters "
                              f"({' '.join(str(exc).split())[:400]})") from None
        return executor

    def _attach(self, out_dir: Path, job_id: str) -> Any:
        """A job submitted earlier, by its id (this submitter's or a previous one's)."""
        submitit = _import_submitit()
        folder = out_dir / JOBS_DIR
        return submitit.SlurmJob(folder, job_id) if self.cluster == "slurm" else submitit.LocalJob(folder, job_id)

    def _unrecorded_jobs(self, out_dir: Path, ledger: Ledger) -> dict[str, str]:
        """Trial id -> job id of this sweep's jobs that Slurm knows and the ledger does not: a submitter stopped
        between ``sbatch`` and writing ``jobs.json`` (a resume must not submit those trials again)."""
        if self.cluster != "slurm" or not ledger.jobs and not (out_dir / JOBS_DIR).is_dir():
            return {}
        prefix = job_name(out_dir, "")
        known = {e["job_id"] for e in ledger.jobs.values()}
        return {name[len(prefix):]: job_id for name, job_id in slurmjobs.jobs_named(prefix).items()
                if job_id not in known and name != prefix + "setup"}

    def _alive(self, jobs: dict[str, Any], watch: slurmjobs.JobWatch) -> dict[str, bool]:
        """Whether each job (by id) may still run: on Slurm one query for all of them (``bench.run.slurmjobs``)."""
        if self.cluster == "slurm":
            return watch.poll(jobs) if jobs else {}
        return {job_id: (not job.done() if getattr(job, "_process", None) is not None
                         else local_job_alive(job_id))  # submitted by an earlier submitter: by its process id
                for job_id, job in jobs.items()}

    def _state(self, job: Any, watch: slurmjobs.JobWatch) -> str:
        if self.cluster == "slurm":
            return watch.describe(job.job_id)
        try:
            return job.state
        except Exception:  # noqa: BLE001 - submitit-local: its process may be gone
            return slurmjobs.UNKNOWN

    def _finished(self, runner: Sweep, trial: Trial, job: Any, watch: slurmjobs.JobWatch) -> TrialRecord:
        """The record a finished job wrote; if none is there yet, wait a little (a shared filesystem may show the
        file after the scheduler shows the job ended), then record how the job ended."""
        path = record_path(runner.out_dir, trial)
        return _read(path, runner) if self._appears(path) else self._ended(runner, trial, job, watch)

    def _appears(self, path: Path) -> bool:
        """Whether ``path`` exists, or appears within ``RECORD_GRACE_S``: a file a job wrote may show on a shared
        filesystem after the scheduler shows the job ended."""
        deadline = time.monotonic() + RECORD_GRACE_S
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(min(self.poll_s, 1.0))
        return path.exists()

    def _ended(self, runner: Sweep, trial: Trial, job: Any, watch: slurmjobs.JobWatch) -> TrialRecord:
        """A job that ended without writing its trial's record: ``killed`` when it was stopped from outside
        (cancelled, its node lost, its time limit), ``oom`` when Slurm killed it for memory, ``failed`` when its own
        process failed (its stderr says why)."""
        state = self._state(job, watch)
        tail = " | ".join((job.stderr() or "").strip().splitlines()[-3:])
        record = runner.launcher.bare_record(
            trial, slurmjobs.ended_status(state),
            f"{self.name} job {job.job_id} ended ({state}) before the trial wrote its record"
            + (f": {tail}" if tail else ""))
        record.config_hash = runner.config_hash
        return record


def from_args(kind: str | None, out_dir: Path | None, resume: bool, partition: str | None = None,
              gpus_per_trial: int | None = None, cpus_per_trial: int | None = None,
              max_running: int | None = None, options: list[str] | None = None,
              poll_s: float | None = None) -> LocalExecutor | SubmititExecutor:
    """The executor the command line asks for; a resumed sweep keeps the one it was started with (``jobs.json``),
    with any option given now replacing the stored one."""
    stored = Ledger(out_dir).executor if resume and out_dir is not None and (out_dir / LEDGER).is_file() else {}
    if resume and out_dir is not None and (out_dir / "env.json").is_file():
        started = stored.get("kind", "local")  # env.json describes the machines of the executor it started with
        if kind not in (None, started):
            raise ConfigError(f"--resume: the sweep in {out_dir} ran with --executor {started} (its env.json "
                              f"describes those machines); resume it with --executor {started}, or start a new --out")
    kind = kind or stored.get("kind") or "local"
    if kind not in EXECUTORS:
        raise ConfigError(f"unknown executor {kind!r} (valid: {', '.join(EXECUTORS)})")
    given = {"partition": partition, "gpus_per_trial": gpus_per_trial, "cpus_per_trial": cpus_per_trial,
             "max_running": max_running, "option": options or None, "poll_s": poll_s}
    if kind == "local":
        slurm_only = [k for k, v in given.items() if v is not None]
        if slurm_only:
            flag = {"max_running": "--max-running", "poll_s": "--slurm-poll-seconds"}.get(
                slurm_only[0], "--slurm-" + slurm_only[0].replace("_", "-"))
            raise ConfigError(f"{flag} is an option of --executor slurm or submitit-local (the local executor runs "
                              "one trial at a time on this machine)")
        return LocalExecutor()
    same = stored.get("kind") == kind
    fields = {f.name for f in dataclasses.fields(SubmititExecutor)} - {"cluster", "extra"}
    settings = {k: v for k, v in stored.items() if k in fields} if same else {}
    settings.update({k: v for k, v in given.items() if v is not None and k != "option"})
    if kind == "submitit-local":
        settings.setdefault("max_running", 1)  # its jobs share this machine: one timed trial at a time
        settings.setdefault("poll_s", 0.5)
    extra = {**((stored.get("extra") or {}) if same else {}), **parse_options(options or [])}
    return SubmititExecutor(cluster="slurm" if kind == "slurm" else "local", extra=tuple(sorted(extra.items())),
                            **settings)


def parse_options(options: list[str]) -> dict[str, Any]:
    """``--slurm-option account=ml`` -> ``{"slurm_account": "ml"}``: any of submitit's Slurm parameters (its
    ``slurm_`` names without the prefix: account, qos, constraint, mem, ...); integers as integers."""
    parsed: dict[str, Any] = {}
    for text in options:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--slurm-option must be KEY=VALUE (a Slurm parameter, e.g. account=ml or qos=high), "
                              f"got {text!r}")
        key = key.strip().replace("-", "_")
        parsed[key if key.startswith("slurm_") else f"slurm_{key}"] = int(value) if value.isdigit() else value
    return parsed


@contextlib.contextmanager
def sigint_default_in_children() -> Iterator[None]:
    """Children started inside get SIGINT at its default disposition even when this process ignores it.

    A process started in the background by a non-interactive shell (``cmd &`` in a CI script, ``nohup``) inherits
    SIGINT ignored, and Python keeps an inherited SIG_IGN; so would the submitit-local jobs it starts, and
    submitit's ``LocalJob.cancel()`` (SIGINT, nothing else) would leave them running to their end. A Python-level
    handler is reset to the default at ``exec``, so installing a no-op one around the submission gives the child
    the default without making this process interruptible meanwhile.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield  # a Python handler (the usual case) is already reset to the default in the children
        return
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def local_job_alive(job_id: str) -> bool:
    """Whether a submitit-local job (its id is its controller's pid) still runs; a reused pid is not it."""
    try:
        proc = psutil.Process(int(job_id))
        return proc.status() != psutil.STATUS_ZOMBIE and "submitit" in " ".join(proc.cmdline())
    except (psutil.Error, ValueError):
        return False


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise ConfigError("--executor slurm and submitit-local need submitit: pip install 'trainbench[slurm]' "
                          "(or pip install submitit)") from None
    return submitit


# ---- what runs in the jobs ------------------------------------------------------------------------------------


def setup_job(launcher: TrialLauncher, command: str, resume: bool, done: list[str],
              executor: dict[str, Any]) -> tuple[str, dict, list[Trial]]:
    """The sweep's setup on a node: resolve the device, env.json, the plan, the references the pending trials need."""
    from bench.plan import user_models as user

    ignore_submitit_timeout_signal()
    user.load_plugins([p.to_dict() for p in launcher.cfg.plugins])
    launcher = dataclasses.replace(launcher, device=resolve_device(launcher.cfg.device))
    env = launcher.environment(command, resume)
    if executor.get("kind") == "slurm" and "setup_hostname" not in env:
        # Trials run on any node of the partition: reports name the partition, not the setup job's node.
        env["setup_hostname"] = env.get("hostname")
        env["hostname"] = f"slurm:{executor.get('partition') or 'default partition'}"
        env["executor"] = executor
        write_atomic(launcher.out_dir / "env.json", json.dumps(env, indent=2, sort_keys=True, default=str))
    trials = plan(launcher.cfg, launcher.device)
    launcher.prepare_references([t for t in trials if t.trial_id not in set(done)])
    return str(launcher.device), env, trials


def trial_job(launcher: TrialLauncher, trial: Trial, env: dict, path: str) -> str:
    """One trial on a node, as the local executor runs it; its record goes to ``path`` for the submitter."""
    from bench.plan import user_models as user

    ignore_submitit_timeout_signal()
    stopped: list[int] = []
    # The scheduler ends a job (scancel, its time limit, its node) with SIGTERM to every process of it, the trial's
    # included, then SIGKILL: the launcher would see its trial die by SIGTERM and record it ``failed``. Such a job
    # writes no record unless the trial had finished; the submitter records how the job ended (its Slurm state).
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopped.append(signum))
    user.load_plugins([p.to_dict() for p in launcher.cfg.plugins])
    record = launcher.run(trial, env)
    if stopped and record.status != "ok":
        log.warning("the job was stopped from outside (SIGTERM) while its trial ran: no record written")
        return "stopped"
    note = node_note(env, envmod.fingerprint(None))
    if note:
        record.notes.append(note)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(path), record.to_json())
    return record.status


def ignore_submitit_timeout_signal() -> None:
    """A job ignores the signal submitit asks Slurm to send ahead of the time limit (``--signal=USR2@90``).

    submitit's handler for it requeues a checkpointable call and raises in any other: the trial (killed by the same
    signal, sent to every process of the job) would be recorded ``failed`` up to 90 s before its limit, and with a
    limit under 90 s (``--slurm-option time=1``) as soon as it starts. A trial cannot resume from a checkpoint; its
    own ``timeout_s`` ends it first, and if Slurm's limit comes first, Slurm ends the job (TIMEOUT), which the
    submitter records. Ignored here, the signal is ignored by the trial's processes too (they inherit it).
    """
    from submitit.core.job_environment import JobEnvironment

    signal.signal(JobEnvironment._usr_sig(), signal.SIG_IGN)


HARDWARE_KEYS = ("cpu_model", "cpu_logical", "memory_total_bytes")


def node_note(env: dict[str, Any], here: dict[str, Any]) -> str | None:
    """A note for a trial that ran on another node than the one env.json describes (Slurm), naming the hardware
    that differs; None on the setup job's node (and for executors whose trials all run on one machine)."""
    setup = env.get("setup_hostname")
    if setup is None or here.get("hostname") == setup:
        return None
    differ = [f"{k} {here.get(k)!r} (env.json: {env.get(k)!r})" for k in HARDWARE_KEYS if here.get(k) != env.get(k)]
    gpus = [(g or {}).get(k) for g in (here.get("gpu"), env.get("gpu")) for k in ("count", "name")]
    if gpus[:2] != gpus[2:]:
        differ.append(f"GPUs {gpus[0]} x {gpus[1]} (env.json: {gpus[2]} x {gpus[3]})")
    text = f"ran on node {here.get('hostname')}; env.json describes the setup job's node {setup}"
    return text + (f"; this node differs: {', '.join(differ)}" if differ else " (same hardware)")


# ---- the sweep directory's job files ----------------------------------------------------------------------------


def job_name(out_dir: Path, what: str) -> str:
    """A job's name in ``squeue``/``sacct``: ``trainbench:<sweep>:<trial id>`` (or ``setup``); ``<sweep>`` is a digest of
    the sweep's directory, so jobs of two sweeps of one plan are told apart."""
    sweep = hashlib.sha1(str(Path(out_dir).resolve()).encode()).hexdigest()[:8]
    return f"trainbench:{sweep}:{what}"


def record_path(out_dir: Path, trial: Trial | str) -> Path:
    trial_id = trial if isinstance(trial, str) else trial.trial_id
    return out_dir / TRIALS_DIR / (hashlib.sha1(trial_id.encode()).hexdigest()[:20] + ".json")


def _read(path: Path, runner: Sweep) -> TrialRecord:
    """A job's record, checked: readable, and made under this sweep's settings (a report never mixes two)."""
    try:
        record = TrialRecord.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ExecutorError(f"{path}: a trial job's record could not be read ({exc}); move it away and --resume "
                            "to run that trial again") from None
    if record.config_hash != runner.config_hash:
        raise ExecutorError(f"{path}: a trial job's record was made under other settings (settings hash "
                            f"{record.config_hash}, this sweep's {runner.config_hash}); move it away and --resume")
    return record


def gather(runner: Sweep) -> set[str]:
    """Append to results.jsonl the records jobs wrote while no submitter watched; their trial ids."""
    directory = runner.out_dir / TRIALS_DIR
    if not directory.is_dir() or not runner.recorder:
        return set()
    recorded = runner.store.done_trial_ids()
    gathered = set()
    for path in sorted(directory.glob("*.json")):
        record = _read(path, runner)
        if record.trial_id not in recorded:
            runner.store.append(record)
            gathered.add(record.trial_id)
    if gathered:
        log.info("gathered %d record(s) of jobs that finished while no submitter ran", len(gathered))
    return gathered


class Ledger:
    """``OUT/jobs.json``: the executor's settings and each trial's job id, rewritten atomically on each change."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LEDGER
        try:
            data = json.loads(self.path.read_text()) if self.path.exists() else {}
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{self.path} is not valid JSON: the sweep's record of its jobs is damaged (restore "
                              "it, or start a new --out)") from None
        self._executor: dict[str, Any] = data.get("executor", {})
        self.jobs: dict[str, dict[str, str]] = data.get("jobs", {})

    @property
    def executor(self) -> dict[str, Any]:
        return self._executor

    @executor.setter
    def executor(self, value: dict[str, Any]) -> None:
        self._executor = value
        self._write()

    def job_of(self, trial_id: str) -> str | None:
        entry = self.jobs.get(trial_id)
        return entry["job_id"] if entry else None

    def add(self, trial_id: str, job_id: str) -> None:
        self.jobs[trial_id] = {"job_id": str(job_id),
                               "submitted_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        self._write()

    def active_jobs(self) -> list[str]:
        """Job ids of trials with no record yet whose jobs still run (submitit-local: checked by pid here)."""
        kind = self._executor.get("kind")
        pending = [e["job_id"] for t, e in self.jobs.items() if not record_path(self.out_dir, t).exists()]
        if not pending or kind not in ("slurm", "submitit-local"):
            return []
        executor = SubmititExecutor(cluster="slurm" if kind == "slurm" else "local")
        alive = executor._alive({j: executor._attach(self.out_dir, j) for j in pending}, slurmjobs.JobWatch())
        return [j for j in pending if alive[j]]

    def _write(self) -> None:
        write_atomic(self.path, json.dumps({"executor": self._executor, "jobs": self.jobs}, indent=1) + "\n")


__all__ = ["EXECUTORS", "Executor", "ExecutorError", "Ledger", "LocalExecutor", "SubmititExecutor", "from_args", "gather",
           "job_name", "node_note", "parse_options", "record_path", "setup_job",
           "trial_job"]
