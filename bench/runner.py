"""Runs a planned sweep: one child process per trial, results appended as they finish, resume, timeouts.

Before the first trial, one child process computes the parity references the plan needs (``bench.reference``,
cached in ``OUT/references/``) and the runner calibrates matmul peaks for each thread count the trials run with.
The parent never spins: it blocks in ``Popen.wait`` (a peer harness measured here busy-waited in its parent and
slowed training 3x on a 2-core machine). Each child gets a fresh TorchInductor cache so compile time is cold.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from bench import env as envmod
from bench import reference as reference_mod
from bench.config import ConfigError, SweepConfig
from bench.plan import Trial, plan, reference_key
from bench.results import ResultStore, TrialRecord
from bench.trial import TrialSpec
from techniques.base import set_kind

log = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parent.parent


@dataclass
class Progress:
    """What the runner reports after each trial (the CLI draws it)."""

    done: int
    total: int
    trial: Trial
    record: TrialRecord | None  # None: already in results.jsonl (resume)


def default_out_dir(cfg: SweepConfig) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return REPO_DIR / "reports" / f"{cfg.name}-{stamp}"


@dataclass(frozen=True)
class Launch:
    """How multi-process trials start (torchrun). Multi-node: the same sweep runs on every node, each with its
    own ``node_rank`` and the same ``rdzv_endpoint``; only node 0 (global rank 0) records results."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None

    def torchrun_args(self, nproc: int, rdzv_id: str) -> list[str]:
        args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--max-restarts", "0"]
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            return [*args, "--standalone"]
        if not self.rdzv_endpoint:
            raise ConfigError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        return [*args, "--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.rdzv_endpoint, "--rdzv-id", rdzv_id]


class SweepRunner:
    def __init__(
        self, cfg: SweepConfig, out_dir: Path, device: torch.device, resume: bool = False, command: str = "",
        code_dir: Path | None = None, launch: Launch | None = None,
    ) -> None:
        self.cfg = cfg
        self.launch = launch or Launch()
        # The checkout whose code the trial processes run (their cwd, so `python -m bench.trial` imports its
        # bench/ and techniques/): this repo by default, another checkout for `sweep --ab`.
        self.code_dir = Path(code_dir) if code_dir is not None else REPO_DIR
        self.command = command  # how to reproduce, recorded in env.json
        self.out_dir = Path(out_dir)
        self.device = device
        self.resume = resume
        self.store = ResultStore(self.out_dir / "results.jsonl")
        self.reference_dir = self.out_dir / "references"

    def thread_counts(self) -> list[int]:
        """The intra-op thread counts trials run with: the configured count (torch's default when 0) for one-process
        trials; torchrun gives each rank 1 on CPU unless --threads says otherwise."""
        counts = [self.cfg.threads or torch.get_num_threads()]
        if self.cfg.world_size > 1 and self.device.type == "cpu":
            counts.append(self.cfg.threads or 1)
        return list(dict.fromkeys(counts))

    def prepare(self) -> dict:
        """Create the output directory, write sweep.toml and env.json (or reuse them when resuming)."""
        if self.store.path.exists() and self.store.path.stat().st_size and not self.resume:
            raise ConfigError(f"{self.out_dir} already holds results: pass --resume to continue it, or another --out")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.resume:
            self.store.repair_tail()
        (self.out_dir / "sweep.toml").write_text(self.cfg.to_toml())
        env_path = self.out_dir / "env.json"
        if self.resume and env_path.exists():
            return json.loads(env_path.read_text())
        log.info("measuring peak matmul FLOP/s on %s", self.device)
        env = envmod.fingerprint(self.code_dir)
        env["device"] = str(self.device)
        by_threads = {str(n): envmod.calibrate_peaks(self.device, threads=n) for n in self.thread_counts()}
        env["peak_flops"] = next(iter(by_threads.values()))  # at the one-process trials' thread count
        env["peak_flops_by_threads"] = by_threads
        env["command"] = self.command
        env_path.write_text(json.dumps(env, indent=2, sort_keys=True, default=str))
        return env

    def run(self, on_progress: Callable[[Progress], None] | None = None) -> list[TrialRecord]:
        env = self.prepare()
        trials = plan(self.cfg, self.device)
        done = self.store.done_trial_ids()
        self.prepare_references([t for t in trials if t.trial_id not in done])
        for index, trial in enumerate(trials, 1):
            record = None
            if trial.trial_id not in done:
                record = self._skipped(trial) if trial.skip_reason else self._launch(trial, env)
                if self.launch.node_rank == 0:  # other nodes take part in the trials; node 0 records them
                    self.store.append(record)
            if on_progress:
                on_progress(Progress(index, len(trials), trial, record))
        return self.store.read()

    def prepare_references(self, trials: list[Trial]) -> None:
        """Compute, in one child process, the parity references these trials need and the cache lacks."""
        keys = [k for k in (reference_key(t, self.cfg.budget) for t in trials if not t.skip_reason) if k]
        try:
            reference_mod.ensure(keys, self.reference_dir, self.device.type, self.code_dir,
                                 timeout_s=max(self.cfg.budget.timeout_s, 120.0) * max(len(keys), 1))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            # Not fatal here: each trial asks for its reference again and, if that fails too, is recorded as
            # failed with the reason, like any other trial error.
            log.warning("parity references could not be computed up front: %s", exc)

    # ---- one trial ------------------------------------------------------------------------------------------

    def _peaks(self, trial: Trial, env: dict) -> tuple[dict[str, float], str | None]:
        """Calibrated peaks at the thread count this trial runs with."""
        threads = self.thread_counts()[-1] if trial.world_size > 1 else self.thread_counts()[0]
        by_threads = env.get("peak_flops_by_threads") or {}
        peaks = by_threads.get(str(threads))
        source = f"calibrated on this machine with {threads} thread(s)"
        if peaks is None:  # env.json of an older sweep (resumed): one calibration at the runner's threads
            peaks, source = env.get("peak_flops") or {}, "calibrated on this machine (runner's threads)"
        return {k: v["flops"] for k, v in peaks.items() if v.get("flops")}, source

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
            world_size=trial.world_size,
            threads=self.cfg.threads,
            mode=self.cfg.mode,
            position=trial.position,
            reference_dir=str(self.reference_dir),
        )

    def _skipped(self, trial: Trial) -> TrialRecord:
        return self._bare_record(trial, "skipped", trial.skip_reason)

    def _bare_record(self, trial: Trial, status: str, reason: str | None) -> TrialRecord:
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
            mode=self.cfg.mode,
            position=trial.position,
            timestamp_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )

    def _launch(self, trial: Trial, env: dict) -> TrialRecord:
        timeout = self.cfg.budget.timeout_s
        with tempfile.TemporaryDirectory(prefix="trainbench-") as tmp:
            tmp_path = Path(tmp)
            spec_path, record_path, log_path = tmp_path / "spec.json", tmp_path / "record.json", tmp_path / "stderr"
            spec_path.write_text(self._spec(trial, env).to_json())
            child_env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
            cmd = [sys.executable, "-m", "bench.trial", str(spec_path), str(record_path)]
            if trial.world_size > 1:
                # The same id on every node (a stable digest: Python's hash() differs between processes).
                rdzv_id = "trainbench-" + hashlib.sha1(f"{self.cfg.name}/{trial.trial_id}".encode()).hexdigest()[:16]
                cmd = [*self.launch.torchrun_args(trial.world_size // self.launch.nnodes, rdzv_id),
                       "-m", "bench.trial", str(spec_path), str(record_path)]
            with open(log_path, "wb") as err:
                # A new session makes the child a process group we can kill whole (compile workers included).
                proc = subprocess.Popen(cmd, cwd=self.code_dir, env=child_env, stdout=err, stderr=err,
                                        start_new_session=True)
                try:
                    rc = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    return self._bare_record(trial, "timeout", f"trial ran longer than timeout_s={timeout:g}")
                except BaseException:
                    _kill_group(proc)
                    raise
            if record_path.exists() and record_path.stat().st_size:
                return TrialRecord.from_dict(json.loads(record_path.read_text()))
            rank_errors = sorted(tmp_path.glob("record.json.rank*.err"), key=lambda p: int(p.name.rsplit("rank", 1)[1][:-4]))
            if rank_errors:  # the first rank that failed says why; torchrun ended the others
                first = json.loads(rank_errors[0].read_text())
                return self._bare_record(trial, first["status"], f"rank {first['rank']}: {first['reason']}")
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            if rc < 0:
                name = signal.Signals(-rc).name
                status = "oom" if -rc == signal.SIGKILL else "failed"
                why = f"trial process killed by {name}" + (" (often the kernel's OOM killer)" if status == "oom" else "")
            else:
                status, why = "failed", f"trial process exited with code {rc}"
            return self._bare_record(trial, status, f"{why}: {' | '.join(tail)}"[:1000])


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
