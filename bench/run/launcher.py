"""One trial, run in processes of its own: the command, the timeout, and the record of how it ended.

The sweep's runner uses it on this machine (``--executor local``); a batch-scheduler job runs the same code on its
node (``bench.run.executors``), so a trial is launched, killed and recorded the same way wherever it runs. Everything
here is picklable: a job receives the launcher itself.

The launching process never spins: it blocks in ``Popen.wait``, or on the fork server's socket (a peer harness
measured here busy-waited in its parent and slowed training 3x on a 2-core machine).

A one-process trial is forked from the sweep's fork server when it may (``bench.run.isolation``: it imported torch and
the harness once), else started fresh (``python -m bench.guard ... python -m bench.trial``); either way it is the same
trial in a process of its own, timed, killed and recorded alike, and its record says which (``isolation``).

TorchInductor's caches (``TORCHINDUCTOR_CACHE_DIR``: the FX graph, AOTAutograd and kernel caches) are shared by the
trials of one workload and technique set (``OUT/cache/inductor/``): the first trial of a set compiles from an empty
cache, so its one-off cost is the cold one, and the set's later trials (repeats, speed-only pairs) load what it
compiled instead of compiling again. The record says which (``caches.inductor``: cold or warm); the analysis takes a
set's one-off cost from its cold trials. A cold trial that did not finish leaves no cache behind, so the next trial
of its set is cold again; a set whose cache another process holds (concurrent batch jobs) compiles into a private,
cold one, as every trial did before the caches were shared.

The trial's stages (``bench.measure.stages``): the launcher passes the time it starts the process
(``TRAINBENCH_LAUNCHED_AT``), the trial records its own stages, and the launcher adds what it alone sees (the launch,
the process's exit after the record, reading the record) and the remainder, ``unaccounted``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from bench import reference as reference_mod
from bench.core.files import REPO_DIR, write_atomic
from bench.measure import stages as stages_mod
from bench.plan.config import ConfigError, SweepConfig
from bench.plan.planner import Trial, check_nproc, reference_key, world_size_for
from bench.records.results import TrialRecord, memory_exhausted
from bench.run import isolation, sweepdir
from bench.run.isolation import ForkServer
from bench.trial import LAUNCHED_AT, TrialSpec
from techniques.base import set_kind

log = logging.getLogger(__name__)

ENV_TIMEOUT_S = 120.0  # per calibration (thread count or device) in the environment's child process (about 3 s each)
COMPILED_MARK = ".complete"  # in a set's compile cache: a trial finished with it, so the next one finds it warm


@dataclass(frozen=True)
class Launch:
    """How multi-process trials start (torchrun). Multi-node: the same sweep runs on every node, each with its
    own ``node_rank`` and the same ``rdzv_endpoint``; only node 0 (global rank 0) records results."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None

    def torchrun_args(self, nproc: int, rdzv_id: str = "none") -> list[str]:
        """torchrun's arguments. Multi-node uses the static rendezvous: it is the one that honours ``--node-rank``
        (c10d's dynamic rendezvous ranks nodes in the order they arrive, which would put global rank 0, the rank
        that writes the record, on any node). ``rdzv_id`` prefixes its store's keys: one per trial, so a node that
        moved on early never meets a previous trial's keys."""
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--max-restarts", "0"]
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            return [*args, "--standalone"]
        if not self.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        return [*args, "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--rdzv-backend", "static",
                "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", rdzv_id]


@dataclass
class TrialLauncher:
    """Runs trials of one sweep: ``run(trial, env)`` returns the trial's record, stamped with the settings hash."""

    cfg: SweepConfig
    out_dir: Path
    device: torch.device | None  # None on a submitter whose trials run elsewhere (bench.run.executors)
    code_dir: Path  # the checkout whose code trial processes run (their cwd): see SweepRunner
    launch: Launch = field(default_factory=Launch)
    # The sweep's fork server (bench.run.isolation): one-process trials fork from it; None: every trial starts fresh
    # (always under a batch executor, whose jobs receive the launcher pickled: a server is this machine's)
    server: ForkServer | None = field(default=None, repr=False, compare=False)
    # The compile server, for the trials of sets that call torch.compile (bench.run.isolation.compiles); None: they
    # fork from ``server`` too
    compile_server: ForkServer | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.device is not None:  # also where a batch job resolves the device on its node
            check_nproc(self.device, self.cfg.nproc)

    @property
    def config_hash(self) -> str:
        return sweepdir.settings_hash(self.cfg)

    @property
    def reference_dir(self) -> Path:
        return self.out_dir / "references"

    def thread_counts(self) -> list[int]:
        """The intra-op thread counts trials run with: the configured count (torch's default when 0) for one-process
        trials; torchrun gives each rank 1 on CPU unless --threads says otherwise."""
        counts = [self.cfg.threads or torch.get_num_threads()]
        if self.cfg.world_size > 1 and self.device.type == "cpu":
            counts.append(self.cfg.threads or 1)
        return list(dict.fromkeys(counts))

    def calibrated_devices(self) -> list[str]:
        """The CUDA devices the trials use, each calibrated on its own: the one-process trials' device first, then
        ``cuda:LOCAL_RANK`` of every rank when a set runs on several processes (none on the CPU)."""
        if self.device.type != "cuda":
            return []
        devices = [f"cuda:{self.device.index or 0}"]
        if any(world_size_for(t, self.cfg.world_size) > 1 for t in self.cfg.techniques):
            devices += [f"cuda:{i}" for i in range(self.cfg.nproc)]
        return list(dict.fromkeys(devices))

    def environment(self, command: str, resume: bool) -> dict:
        """env.json: this machine's fingerprint and matmul peaks calibrated for each thread count the trials run
        with (on CUDA, for each device they use); written once, reused when resuming.

        Measured in a child process (``python -m bench.measure.env``): this process launches the trials and must
        not hold a CUDA context, nor calibration tensors, on the devices they train on."""
        env_path = self.out_dir / "env.json"
        if resume and env_path.exists():
            try:
                return json.loads(env_path.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ConfigError(f"--resume: {env_path} is not valid JSON; the sweep's environment record is "
                                  "damaged (restore it, or start a new --out)") from None
        log.info("measuring peak matmul FLOP/s on %s (in a child process)", self.device)
        env = self._measured_environment()
        env["device"] = str(self.device)
        env["command"] = command
        write_atomic(env_path, json.dumps(env, indent=2, sort_keys=True, default=str))
        return env

    def _measured_environment(self) -> dict:
        """``bench.measure.env.measure_environment`` run in a child process (this checkout's code; the git commit
        recorded is the trials' checkout's)."""
        devices = self.calibrated_devices()
        with tempfile.TemporaryDirectory(prefix=sweepdir.temp_prefix()) as tmp:
            out = Path(tmp) / "env.json"
            cmd = [sys.executable, "-m", "bench.measure.env", str(out), "--device", str(self.device),
                   "--threads", ",".join(map(str, self.thread_counts())), "--repo", str(self.code_dir)]
            if devices:
                cmd += ["--devices", ",".join(devices)]
            timeout = ENV_TIMEOUT_S * max(len(devices), len(self.thread_counts()), 1)
            try:
                proc = subprocess.run(cmd, cwd=REPO_DIR, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"measuring the environment took longer than {timeout:g} s: "
                                   f"{shlex.join(cmd)}") from None
            for line in proc.stderr.splitlines():  # its warnings (devices whose peaks disagree) reach the user
                if line.startswith("WARNING"):
                    log.warning("%s", line.partition(": ")[2] or line)
            if proc.returncode != 0 or not out.exists():
                tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
                raise RuntimeError(f"measuring the environment failed (exit {proc.returncode}): {tail}"[:1000])
            return json.loads(out.read_text())

    def prepare_references(self, trials: list[Trial]) -> None:
        """Compute, in one child process, the parity references these trials need and the cache lacks; then wait
        for the fork servers started beside it to be ready, so that none is still importing (the compile server also
        compiles TorchInductor's probes) while the first trials' windows are timed."""
        try:
            self._references(trials)
        finally:
            for server in self.servers:
                server.wait_ready()

    def _references(self, trials: list[Trial]) -> None:
        keys = [k for k in (reference_key(t, self.cfg.budget) for t in trials if not t.skip_reason) if k]
        try:
            reference_mod.ensure(keys, self.reference_dir, self.device.type, self.code_dir,
                                 timeout_s=max(self.cfg.budget.timeout_s, 120.0) * max(len(keys), 1),
                                 plugins=[p.to_dict() for p in self.cfg.plugins])
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            # Not fatal here: each trial asks for its reference again and, if that fails too, is recorded as
            # failed with the reason, like any other trial error.
            log.warning("parity references could not be computed up front: %s", exc)

    def run(self, trial: Trial, env: dict) -> TrialRecord:
        """One trial's record (skipped, or measured in its own process), stamped with the sweep's settings hash and,
        when it ran, its wall time and stages (``bench.measure.stages``)."""
        started = time.perf_counter()
        if trial.skip_reason:
            record = self._skipped(trial)
        else:
            record, times = self._launch(trial, env)
        record.config_hash = self.config_hash
        record.added_by = trial.added_by
        if not trial.skip_reason:
            wall = time.perf_counter() - started
            record.wall_s = round(wall, 3)
            record.stages = times.stages(record.stages, started, wall)
            record.isolation = times.isolation
        record.continues = trial.continues  # how the analysis tells a continuation from a planned trial
        return record

    @property
    def inductor_cache_dir(self) -> Path:
        """Where the sets' shared TorchInductor caches live (one directory per workload and set)."""
        return self.out_dir / "cache" / "inductor"

    def _peaks(self, trial: Trial, env: dict) -> tuple[dict[str, float], str | None]:
        """Calibrated peaks at the thread count this trial runs with; on CUDA its device's (a GPU's matmul peak does
        not depend on the host's threads; several ranks: ``_device_peaks``)."""
        if self.device is not None and self.device.type == "cuda":
            source = ("calibrated on this machine, each device on its own" if env.get("peak_flops_by_device") else
                      "calibrated on this machine's first device, assumed for every rank's (an env.json from before "
                      "per-device peaks)" if trial.world_size > 1 else "calibrated on this machine's device")
            return _flops(env.get("peak_flops") or {}), source
        threads = self.thread_counts()[-1] if trial.world_size > 1 else self.thread_counts()[0]
        by_threads = env.get("peak_flops_by_threads") or {}
        peaks = by_threads.get(str(threads))
        source = f"calibrated on this machine with {threads} thread(s)"
        if peaks is None:  # env.json of an older sweep (resumed): one calibration at the runner's threads
            peaks, source = env.get("peak_flops") or {}, "calibrated on this machine (runner's threads)"
        return _flops(peaks), source

    def _device_peaks(self, trial: Trial, env: dict) -> dict[str, dict[str, float]]:
        """Each of this node's devices' calibrated peaks, for a trial on several CUDA ranks (``cuda:LOCAL_RANK``);
        empty otherwise, and for an env.json from before per-device peaks."""
        by_device = env.get("peak_flops_by_device") or {}
        if trial.world_size == 1 or not by_device:
            return {}
        return {d: _flops(by_device.get(d) or {}) for d in (f"cuda:{i}" for i in range(self.cfg.nproc))}

    def _spec(self, trial: Trial, env: dict) -> TrialSpec:
        peaks, source = self._peaks(trial, env)
        return TrialSpec(
            sweep_id=self.out_dir.name,
            trial_id=trial.trial_id,
            workload=trial.workload.name,
            size=trial.workload.size,
            techniques=[s.label for s in trial.techniques.specs],
            seed=trial.seed,
            repeat=trial.repeat,
            device=str(self.device),
            budget=dataclasses.asdict(self.cfg.budget),
            peaks=peaks,
            peak_source=source,
            device_peaks=self._device_peaks(trial, env),
            world_size=trial.world_size,
            threads=self.cfg.threads,
            mode=trial.mode or self.cfg.mode,
            position=trial.position,
            reference_dir=str(self.reference_dir),
            plugins=[p.to_dict() for p in self.cfg.plugins],
            train_until_s=trial.train_until_s,
        )

    def _skipped(self, trial: Trial) -> TrialRecord:
        return self.bare_record(trial, "skipped", trial.skip_reason)

    def bare_record(self, trial: Trial, status: str, reason: str | None) -> TrialRecord:
        return TrialRecord(
            sweep_id=self.out_dir.name,
            trial_id=trial.trial_id,
            workload={"name": trial.workload.name, "size": trial.workload.size},
            techniques=[{"name": s.name, "options": dict(s.options)} for s in trial.techniques.specs],
            technique_label=trial.techniques.label,
            seed=trial.seed,
            repeat=trial.repeat,
            world_size=trial.world_size,
            device=str(self.device),
            status=status,
            reason=reason,
            kind=set_kind(s.resolve() for s in trial.techniques.specs).value,
            mode=trial.mode or self.cfg.mode,
            position=trial.position,
            timestamp_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )

    def _launch(self, trial: Trial, env: dict) -> tuple[TrialRecord, LaunchTimes]:
        """The trial in its own process, with its set's compile cache; the record and the launcher's clock."""
        times = LaunchTimes()
        with tempfile.TemporaryDirectory(prefix=sweepdir.temp_prefix()) as tmp:
            tmp_path = Path(tmp)
            cache = CompileCache.open(self.inductor_cache_dir, trial, tmp_path / "inductor")
            record = None
            try:
                record = self._process(trial, env, tmp_path, cache.path, times)
            finally:
                state = cache.close(ok=record is not None and record.status == "ok")
            if state is not None:
                record.caches = {**(record.caches or {}), "inductor": state}
        return record, times

    def _process(self, trial: Trial, env: dict, tmp_path: Path, inductor: Path, times: LaunchTimes) -> TrialRecord:
        """The trial's process, from its spec to its record (or a record of how it ended), timed in ``times``."""
        timeout = self.cfg.budget.timeout_s
        spec_path, record_path, log_path = tmp_path / "spec.json", tmp_path / "record.json", tmp_path / "stderr"
        spec_path.write_text(self._spec(trial, env).to_json())
        child_env = dict(isolation.base_env(), TORCHINDUCTOR_CACHE_DIR=str(inductor))
        cmd = [sys.executable, "-m", "bench.trial", str(spec_path), str(record_path)]
        if trial.world_size > 1:
            # The same id on every node (a stable digest: Python's hash() differs between processes).
            rdzv_id = "trainbench-" + hashlib.sha1(f"{self.cfg.name}/{trial.trial_id}".encode()).hexdigest()[:16]
            cmd = [*self.launch.torchrun_args(trial.world_size // self.launch.nnodes, rdzv_id),
                   "-m", "bench.trial", str(spec_path), str(record_path)]
        cmd = [sys.executable, "-m", "bench.guard", str(os.getpid()), *cmd]  # dies with this process
        oom_before = oom_kills()
        with open(log_path, "wb") as err:
            times.popen = time.perf_counter()
            child_env[LAUNCHED_AT] = repr(time.time())
            proc = self._start(trial, cmd, child_env, err, log_path, times)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                times.exited(record_path)
                return self._after_timeout(trial, record_path, timeout)
            except BaseException:
                _kill_group(proc)
                raise
        times.exited(record_path)
        oom_after = oom_kills()
        oom_killed = None if oom_before is None or oom_after is None else oom_after > oom_before
        return self._outcome(trial, rc, tmp_path, oom_killed, getattr(proc, "lost", None))

    def _start(self, trial: Trial, cmd: list[str], env: dict[str, str], err: Any, log_path: Path,
               times: LaunchTimes) -> subprocess.Popen | isolation.Forked:
        """The trial's process: forked from the sweep's server when it may (``bench.run.isolation``), else fresh."""
        server = self.server_for(trial)
        if server is not None:
            forked = server.spawn("bench.trial", cmd[-2:], env, log_path)
            if forked is None and server is not self.server:  # the compile server refused: the plain one may fork
                forked = self.server.spawn("bench.trial", cmd[-2:], env, log_path)
            if forked is not None:
                times.isolation = "fork"
                return forked
        times.isolation = "fresh"
        # A new session makes the child a process group we can kill whole (compile workers included).
        return subprocess.Popen(cmd, cwd=self.code_dir, env=env, stdout=err, stderr=err, start_new_session=True)

    def start_server(self, trials: list[Trial]) -> None:
        """Start each fork server that some of ``trials`` will fork from: their imports go on in the background
        (call it after the calibration, which is timed, and before the references' process, which it overlaps)."""
        for server in self.servers:
            if any(self.server_for(t) is server for t in trials):
                server.start()

    @property
    def servers(self) -> list[ForkServer]:
        """The sweep's fork servers: the plain one and the compile server, where they exist."""
        return [s for s in (self.server, self.compile_server) if s is not None]

    def server_for(self, trial: Trial) -> ForkServer | None:
        """The server the trial forks from: the compile server for a set that compiles, where there is one; None:
        the trial starts fresh."""
        if self.server is None or trial.skip_reason or isolation.fresh_reason(self.cfg, self.code_dir, trial):
            return None
        if self.compile_server is not None and isolation.compiles(trial.techniques):
            return self.compile_server
        return self.server

    def _outcome(self, trial: Trial, rc: int, tmp_path: Path, oom_killed: bool | None,
                 lost: str | None = None) -> TrialRecord:
        """The trial's record, or a record of how its process ended when it wrote none (``lost``: the fork server
        ended first, taking the trial with it)."""
        record_path = tmp_path / "record.json"
        if record_path.exists() and record_path.stat().st_size:
            return self._read_record(trial, record_path)
        if lost:
            return self.bare_record(trial, "killed", lost[:1000])
        first = _first_rank_error(tmp_path)
        if first:  # the rank that failed first says why; torchrun ended the others
            return self.bare_record(trial, first["status"], f"rank {first['rank']}: {first['reason']}")
        tail = (tmp_path / "stderr").read_text(errors="replace").strip().splitlines()[-5:]
        status = "failed"
        if rc < 0 and -rc == signal.SIGKILL:
            if oom_killed:
                status, why = "oom", "trial process killed by the kernel's OOM killer (cgroup memory.events)"
            else:
                checked = ("no OOM kill in this cgroup's memory.events" if oom_killed is False
                           else "whether it was an OOM kill could not be checked: no cgroup v2 memory.events")
                status, why = "killed", f"trial process killed by SIGKILL from outside the harness ({checked})"
        elif rc < 0:
            why = f"trial process killed by {signal.Signals(-rc).name}"
        else:
            why = f"trial process exited with code {rc}"
        if status == "failed" and memory_exhausted(" ".join(tail)):
            status = "oom"
        return self.bare_record(trial, status, f"{why}: {' | '.join(tail)}"[:1000])

    def _read_record(self, trial: Trial, record_path: Path) -> TrialRecord:
        try:
            return TrialRecord.from_dict(json.loads(record_path.read_text()))
        except (ValueError, TypeError, UnicodeDecodeError) as exc:  # truncated, or another version's fields
            return self.bare_record(trial, "failed", f"the trial's record could not be read: {exc}"[:1000])

    def _after_timeout(self, trial: Trial, record_path: Path, timeout: float) -> TrialRecord:
        """A trial past its timeout; if it had written a complete record, the hang was in its teardown: keep it."""
        if record_path.exists() and record_path.stat().st_size:
            try:
                record = TrialRecord.from_dict(json.loads(record_path.read_text()))
            except (ValueError, TypeError, UnicodeDecodeError):
                pass
            else:
                record.notes.append(f"the trial process hung after writing this record (in its teardown) and was "
                                    f"killed at timeout_s={timeout:g}; the measurements were complete")
                return record
        return self.bare_record(trial, "timeout", f"trial ran longer than timeout_s={timeout:g}")


def _flops(peaks: dict) -> dict[str, float]:
    """A calibration's FLOP/s by dtype (the dtypes that ran)."""
    return {k: v["flops"] for k, v in peaks.items() if v.get("flops")}
@dataclass
class LaunchTimes:
    """The launcher's clock around one trial process: perf_counter, except the epoch times the child's shares."""

    popen: float | None = None  # just before the process started
    exit: float | None = None  # when its exit (or kill) was seen
    exit_epoch: float | None = None  # the same moment, time.time()
    written_epoch: float | None = None  # the record file's modification time
    isolation: str | None = None  # how the process started: fork or fresh (bench.run.isolation)

    def exited(self, record_path: Path) -> None:
        self.exit, self.exit_epoch = time.perf_counter(), time.time()
        try:
            self.written_epoch = record_path.stat().st_mtime
        except OSError:  # no record: the process died first
            self.written_epoch = None

    def stages(self, child: dict[str, float] | None, started: float, wall: float) -> dict[str, float]:
        """The record's stages: the child's own, with the launch before it, the teardown after its record (that
        file's time to the exit), reading the record, and ``unaccounted``. A process that left no stage times of
        its own (it crashed, or runs older trial code) is one stage, ``process``."""
        popen = self.popen if self.popen is not None else started
        end = self.exit if self.exit is not None else popen
        out = {"launch": popen - started}
        if child and self.written_epoch is not None and self.exit_epoch is not None:
            out |= child
            out["teardown"] = max(self.exit_epoch - self.written_epoch, 0.0)
        else:
            out["process"] = end - popen
        out["collect"] = started + wall - end
        return stages_mod.close(out, wall)


@dataclass
class CompileCache:
    """One trial's TorchInductor cache directory: its workload and set's shared one (held under an exclusive lock
    while the trial runs), or a private one when another process holds it or the lock cannot be taken."""

    path: Path
    warm: bool  # a trial of the set finished with it: what it compiled is there
    lock: Any = None  # the open lock file (None: a private cache)

    @classmethod
    def open(cls, root: Path, trial: Trial, private: Path) -> CompileCache:
        label = f"{trial.workload.label}-{trial.techniques.label}-np{trial.world_size}"
        name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)[:80] + "-" + hashlib.sha1(label.encode()).hexdigest()[:8]
        path, lock = root / name, None
        try:
            root.mkdir(parents=True, exist_ok=True)
            lock = open(root / f"{name}.lock", "w")  # held until close()
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # held by a concurrent job of the same set, or no locks on this filesystem
            if lock is not None:
                lock.close()
            log.info("TorchInductor cache %s not shared with this trial (%s): a private, cold one", path, exc)
            return cls(private, False)
        warm = (path / COMPILED_MARK).is_file()
        if not warm and path.exists():  # a cold trial that did not finish filled it in part: start cold again
            shutil.rmtree(path, ignore_errors=True)
        return cls(path, warm, lock)

    def close(self, ok: bool) -> str | None:
        """``cold`` or ``warm`` when the trial compiled (it wrote or found files in the cache), else None. A cold
        shared cache is marked warm after a trial that finished (``ok``) and removed after one that did not."""
        try:
            used = self.path.is_dir() and any(p.is_file() and p.name != COMPILED_MARK for p in self.path.rglob("*"))
            if self.lock is not None and not self.warm:
                if used and ok:
                    (self.path / COMPILED_MARK).touch()
                else:
                    shutil.rmtree(self.path, ignore_errors=True)
        finally:
            if self.lock is not None:
                self.lock.close()  # releases the flock
        return ("warm" if self.warm else "cold") if used else None


def _first_rank_error(tmp_path: Path) -> dict | None:
    """The error of the rank that failed first in time (ranks stamp it); the lowest rank when unstamped.

    The lowest rank is often not the cause: rank 0's "connection closed" follows rank 1's real error.
    """
    errors = []
    for path in tmp_path.glob("record.json.rank*.err"):
        try:
            data = json.loads(path.read_text())
            errors.append((float(data.get("time", math.inf)), int(data["rank"]), data))
        except (ValueError, TypeError, KeyError):
            continue
    return min(errors, key=lambda e: e[:2])[2] if errors else None


def oom_kills() -> int | None:
    """OOM kills so far in this process's cgroup (v2 ``memory.events``, which counts its descendants); None when
    unavailable. Trial processes live in the runner's cgroup, so a rise across a trial is evidence of an OOM kill."""
    try:
        with open("/proc/self/cgroup") as fh:
            rel = next(line.split("::", 1)[1].strip() for line in fh if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{rel}/memory.events") as fh:
            for line in fh:
                key, value = line.split()
                if key == "oom_kill":
                    return int(value)
    except (OSError, StopIteration, ValueError):
        return None
    return None


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the trial process and every process below it, then reap them.

    The process group alone is not enough: torchrun starts each rank in a session of its own, so ranks outlive a
    killed launcher unless they are found by ancestry first (collected before anything dies, since a dead
    parent's children are reparented and no longer found below it).
    """
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(tree, timeout=10)
