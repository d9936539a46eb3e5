"""Faults: the runner killed or stopped, a trial killed from outside, a record that cannot be read, a teardown
that hangs. Nothing finished is lost, nothing is left running, and each ending is named for what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from bench.plan.config import build_config
from bench.plan.planner import plan
from bench.records.results import ResultStore
from bench.run.runner import SweepRunner
from bench.run.sweepdir import TEMP_PREFIX
from tests.conftest import REPO
from tests.records import record

CPU = torch.device("cpu")
# A trial whose timed window lasts a minute: long enough to be caught running.
LONG = """
name = "long"
workloads = ["mlp"]
techniques = [{techniques}]
repeats = 1
seed = {seed}
threads = 1
[budget]
min_seconds = 60.0
max_seconds = 60.0
train_steps = 4
eval_points = 1
parity_steps = 2
max_train_seconds = 100.0
timeout_s = 200.0
memory = false
"""


def _start(tmp_path: Path, techniques: str = '"baseline"', seed: int = 0) -> tuple[subprocess.Popen, Path, Path]:
    cfg, out, tmp = tmp_path / "long.toml", tmp_path / "sweep", tmp_path / "tmp"
    cfg.write_text(LONG.format(techniques=techniques, seed=seed))
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "bench", "sweep", "--config", str(cfg), "--out", str(out)],
                            cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, out, tmp


def is_trial(p: psutil.Process) -> bool:
    """A trial's process: fresh, past bench.guard's exec; or forked by the fork server, which names its children."""
    return p.cmdline()[1:3] == ["-m", "bench.trial"] or p.name() == "bench.trial"


def _trial_process(runner: subprocess.Popen, timeout: float = 120.0) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(runner.pid).children(recursive=True):
            try:
                if is_trial(child):
                    return child
            except psutil.NoSuchProcess:
                continue
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        time.sleep(0.2)
    raise AssertionError("no trial process started")


@pytest.mark.slow
def test_killing_the_runner_ends_its_trial_and_resume_removes_the_temp_dir(tmp_path, monkeypatch):
    runner, out, tmp = _start(tmp_path)
    trial = _trial_process(runner)
    assert list(tmp.glob(f"{TEMP_PREFIX}{runner.pid}-*"))
    runner.kill()  # kill -9: no handler runs in the runner
    runner.communicate()
    gone, alive = psutil.wait_procs([trial], timeout=10)
    assert not alive, "the trial process outlived its runner"
    assert list(tmp.glob(f"{TEMP_PREFIX}*"))  # left behind by the killed runner ...
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    cfg = build_config("quick", None, out / "sweep.toml")
    resumed = SweepRunner(cfg, out, CPU, resume=True)
    resumed.claim()  # ... and removed when the sweep resumes
    resumed.close()
    assert not list(tmp.glob(f"{TEMP_PREFIX}*"))


def _seed_with_skip_first() -> int:
    """A seed whose plan runs the impossible set (skipped at once) before the baseline."""
    for seed in range(50):
        cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline,grad_accum:steps=7", "seed": seed,
                                     "repeats": 1})
        if plan(cfg, CPU)[0].skip_reason:
            return seed
    raise AssertionError("no seed puts the skipped set first")


@pytest.mark.slow
def test_sigterm_stops_the_sweep_like_ctrl_c_and_keeps_finished_trials(tmp_path):
    runner, out, tmp = _start(tmp_path, '"baseline", "grad_accum:steps=7"', seed=_seed_with_skip_first())
    trial = _trial_process(runner)
    assert len(ResultStore(out / "results.jsonl").read()) == 1  # the skipped set, recorded before the baseline
    runner.send_signal(signal.SIGTERM)
    _, stderr = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "terminated (SIGTERM)" in stderr and "--resume --out" in stderr
    assert not psutil.pid_exists(trial.pid) or trial.status() == psutil.STATUS_ZOMBIE
    (kept,) = ResultStore(out / "results.jsonl").read()
    assert kept.status == "skipped"
    assert not list(tmp.glob(f"{TEMP_PREFIX}*"))  # the running trial's directory was cleaned up on the way out
    assert not (out / ".trainbench.lock").exists()


@pytest.mark.slow
def test_a_trial_killed_from_outside_is_recorded_as_killed_not_oom(tmp_path):
    cfg = build_config("quick", None, _long_toml(tmp_path))
    runner = SweepRunner(cfg, tmp_path / "sweep", CPU)
    killer = subprocess.Popen([sys.executable, "-c", _KILLER, str(os.getpid())])
    try:
        (rec,) = runner.run()
    finally:
        killer.kill()
        killer.wait()
    assert rec.status == "killed", rec.reason
    assert "SIGKILL from outside the harness" in rec.reason


_KILLER = """
import sys, time, psutil
parent = psutil.Process(int(sys.argv[1]))
while True:
    for p in parent.children(recursive=True):
        try:
            if p.cmdline()[1:3] == ["-m", "bench.trial"] or p.name() == "bench.trial":  # fresh, or forked
                p.kill()
                sys.exit(0)
        except psutil.NoSuchProcess:
            pass
    time.sleep(0.2)
"""


def _long_toml(tmp_path: Path) -> Path:
    path = tmp_path / "long.toml"
    path.write_text(LONG.format(techniques='"baseline"', seed=0))
    return path


# ---- how a trial ended, from what its process left behind ---------------------------------------------------------


def _runner(tmp_path: Path) -> SweepRunner:
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1})
    return SweepRunner(cfg, tmp_path / "sweep", CPU)


@pytest.mark.parametrize(
    ("rc", "stderr", "oom_killed", "status", "words"),
    [
        (-9, "", False, "killed", "no OOM kill in this cgroup's memory.events"),
        (-9, "", None, "killed", "could not be checked"),
        (-9, "", True, "oom", "the kernel's OOM killer"),
        (1, "RuntimeError: [enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
            "tried to allocate 8589934592 bytes", False, "oom", "can't allocate memory"),
        (-6, "terminate called after throwing an instance of 'std::bad_alloc'", False, "oom", "SIGABRT"),
        (1, "ValueError: something else", False, "failed", "exited with code 1"),
    ],
)
def test_a_trial_that_wrote_no_record_is_named_by_how_it_ended(tmp_path, rc, stderr, oom_killed, status, words):
    runner = _runner(tmp_path)
    (trial,) = plan(runner.cfg, CPU)
    (tmp_path / "stderr").write_text(stderr + "\n")
    rec = runner.launcher._outcome(trial, rc, tmp_path, oom_killed)
    assert rec.status == status and words in rec.reason


def test_an_unreadable_record_becomes_a_failed_record_not_a_crash(tmp_path):
    runner = _runner(tmp_path)
    (trial,) = plan(runner.cfg, CPU)
    (tmp_path / "record.json").write_text(record(final=0.5).to_json()[:200])  # cut short
    rec = runner.launcher._outcome(trial, 0, tmp_path, False)
    assert rec.status == "failed" and "the trial's record could not be read" in rec.reason
    (tmp_path / "record.json").write_text(json.dumps({**record(final=0.5).to_dict(), "from_the_future": 1}))
    rec = runner.launcher._outcome(trial, 0, tmp_path, False)
    assert rec.status == "failed" and "unknown fields: 'from_the_future'" in rec.reason


def test_a_complete_record_survives_a_hang_in_teardown(tmp_path):
    runner = _runner(tmp_path)
    (trial,) = plan(runner.cfg, CPU)
    (tmp_path / "record.json").write_text(record(final=0.5).to_json())
    rec = runner.launcher._after_timeout(trial, tmp_path / "record.json", 30.0)
    assert rec.status == "ok" and "hung after writing this record" in rec.notes[-1]
    (tmp_path / "record.json").unlink()
    assert runner.launcher._after_timeout(trial, tmp_path / "record.json", 30.0).status == "timeout"


def test_the_rank_that_failed_first_is_reported_not_the_lowest(tmp_path):
    runner = _runner(tmp_path)
    (trial,) = plan(runner.cfg, CPU)
    (tmp_path / "stderr").write_text("")
    now = time.time()
    (tmp_path / "record.json.rank0.err").write_text(json.dumps(
        {"rank": 0, "status": "failed", "reason": "RuntimeError: Connection closed by peer", "time": now + 0.5}))
    (tmp_path / "record.json.rank1.err").write_text(json.dumps(
        {"rank": 1, "status": "oom", "reason": "out of memory", "time": now}))
    rec = runner.launcher._outcome(trial, 1, tmp_path, False)
    assert rec.status == "oom" and rec.reason == "rank 1: out of memory"
