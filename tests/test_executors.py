"""Executors: trials as submitit jobs (submitit's local executor stands in for Slurm), resume without resubmitting.

- a sweep through ``submitit-local`` runs end to end, stopped while a job runs and resumed: one job per trial, each
  record in OUT/trials/ gathered into results.jsonl once, the job ids kept in OUT/jobs.json; the resumed submitter
  submits neither the finished job nor the running one again: it waits for the running one and submits only the
  trial no job had taken;
- a local resume refuses while jobs of the sweep still run (it would record them twice);
- the Slurm job that would be submitted: its own node (--exclusive) unless cores are given, the partition, the GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from bench.plan.config import ConfigError, build_config
from bench.records.results import ResultStore
from bench.run import executors
from bench.run.runner import SweepRunner
from tests.conftest import REPO, TINY_BUDGET

submitit = pytest.importorskip("submitit", reason="submitit (the 'slurm' extra) is not installed")

CPU = torch.device("cpu")


def config(techniques="baseline,grad_accum:steps=2", **over):
    budget = {**TINY_BUDGET, "memory": False}
    return build_config("smoke", {"workloads": "mlp", "techniques": techniques, "repeats": 1, "budget": budget,
                                  "mode": "speed", **over})


@pytest.mark.slow
def test_a_restarted_submitter_waits_for_running_jobs_and_resubmits_none(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "bench", "sweep", "--preset", "smoke", "--workloads", "mlp", "--repeats", "1",
           "--techniques", "baseline,grad_accum:steps=2,grad_accum:steps=4", "--mode", "speed", "--no-memory",
           "--window-seconds", "2", "--executor", "submitit-local", "--out", str(out)]
    log = tmp_path / "first.log"  # not a pipe: the jobs inherit it, and a pipe would stay open until they end
    first = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    jobs: dict = {}
    while len(jobs) < 2:  # stop the submitter as soon as it has submitted the second trial's job
        assert time.monotonic() < deadline and first.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
        if (out / "jobs.json").exists():
            jobs = json.loads((out / "jobs.json").read_text())["jobs"]
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=60)
    stderr = log.read_text()
    assert first.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "--resume waits for them" in " ".join(stderr.split())  # rich wraps at 80 columns
    running = [t for t, e in jobs.items() if not executors.record_path(out, t).exists()]
    assert running and all(executors.local_job_alive(jobs[t]["job_id"]) for t in running)  # outlived the submitter

    resumed = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = json.loads((out / "jobs.json").read_text())["jobs"]
    for trial_id, entry in jobs.items():  # neither the finished nor the running job was submitted again
        assert after[trial_id]["job_id"] == entry["job_id"]
    assert len(after) == 3 and len({e["job_id"] for e in after.values()}) == 3
    records = ResultStore(out / "results.jsonl").read()
    assert sorted(r.trial_id for r in records) == sorted(after)  # every trial recorded once
    assert all(r.status == "ok" for r in records), [(r.trial_id, r.reason) for r in records]
    for record in records:  # each job wrote its trial's record where the submitter gathered it from
        assert json.loads(executors.record_path(out, record.trial_id).read_text())["trial_id"] == record.trial_id
    ledger = json.loads((out / "jobs.json").read_text())
    assert ledger["executor"]["kind"] == "submitit-local" and ledger["executor"]["max_running"] == 1
    env = json.loads((out / "env.json").read_text())
    assert env["device"] == "cpu" and env["peak_flops"]  # calibrated by the setup job, on the trials' machine
    assert (out / "report.md").exists()


@pytest.fixture
def sigint_ignored():
    """This process as a CI script's background job runs it (``pytest &`` in a non-interactive shell): SIGINT
    ignored, and inherited so by every child unless the submitter sees to it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_local_resume_refuses_while_jobs_of_the_sweep_run(tmp_path, sigint_ignored):
    out = tmp_path / "sweep"
    out.mkdir()
    sleeper = submitit.AutoExecutor(folder=out / "jobs", cluster="local")
    sleeper.update_parameters(timeout_min=1)
    job = executors.SubmititExecutor(cluster="local").submit(sleeper, time.sleep, 30)
    try:
        ledger = executors.Ledger(out)
        ledger.executor = {"kind": "submitit-local"}
        ledger.add("mlp:tiny/baseline/seed0/r0", job.job_id)
        assert executors.Ledger(out).active_jobs() == [job.job_id]
        runner = SweepRunner(config(), out, CPU)
        with pytest.raises(ConfigError, match=r"1 trial job\(s\) .* still queued or running .*--executor "
                                              r"submitit-local"):
            runner.executor.claim(runner)
    finally:
        job.cancel()  # SIGINT to the job's controller: it ends the job although this process ignores SIGINT
    deadline = time.monotonic() + 30
    while executors.local_job_alive(job.job_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert executors.Ledger(out).active_jobs() == []
    assert not job.paths.result_pickle.exists()  # cancelled, not run to its end


def test_the_slurm_job_has_its_node_to_itself_unless_cores_are_given(tmp_path, monkeypatch):
    # No Slurm here: submitit only checks that srun exists before it writes the job script this test reads.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runner = SweepRunner(config(), tmp_path, None)
    whole = executors.SubmititExecutor(partition="gpu", gpus_per_trial=8)._executor(runner, 3600)
    script = whole._executor._make_submission_file_text("python -m submitit.core._submit x", "uid")
    assert "#SBATCH --exclusive" in script and "#SBATCH --partition=gpu" in script
    assert "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --time=90" in script  # the trial's timeout_s (60 min) and a 30-minute margin for start-up
    cores = executors.SubmititExecutor(cpus_per_trial=16)._executor(runner, 3600)
    script = cores._executor._make_submission_file_text("python -m submitit.core._submit x", "uid")
    assert "--exclusive" not in script and "#SBATCH --cpus-per-task=16" in script


def test_a_trial_on_another_node_than_env_json_says_so():
    env = {"hostname": "slurm:gpu", "setup_hostname": "node1", "cpu_model": "EPYC 9654", "cpu_logical": 192,
           "memory_total_bytes": 2**40, "gpu": {"count": 8, "name": "H100"}}
    assert executors.node_note(env, {**env, "hostname": "node1"}) is None  # the setup job's node
    assert executors.node_note({k: v for k, v in env.items() if k != "setup_hostname"}, env) is None  # one machine
    same = executors.node_note(env, {**env, "hostname": "node7"})
    assert same == "ran on node node7; env.json describes the setup job's node node1 (same hardware)"
    other = executors.node_note(env, {**env, "hostname": "node9", "gpu": {"count": 8, "name": "A100"}})
    assert other.endswith("this node differs: GPUs 8 x A100 (env.json: 8 x H100)")


def test_executor_options_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="--slurm-partition is an option of --executor slurm"):
        executors.from_args(None, tmp_path, resume=False, partition="gpu")
    with pytest.raises(ConfigError, match="--max-running must be >= 0"):
        executors.from_args("slurm", tmp_path, resume=False, max_running=-1)
    assert executors.from_args(None, tmp_path, resume=False).name == "local"
    local = executors.from_args("submitit-local", tmp_path, resume=False)
    assert local.max_running == 1  # timed jobs on this machine never run side by side
    executors.Ledger(tmp_path).executor = local.describe()
    assert executors.from_args(None, tmp_path, resume=True) == local  # a resumed sweep keeps its executor
    runner = SweepRunner(config(nnodes=2, nproc=1), tmp_path, None)
    with pytest.raises(ConfigError, match="multi-node trials"):
        executors.SubmititExecutor(cluster="local").claim(runner)
    if shutil.which("srun") is None:
        with pytest.raises(ConfigError, match="no Slurm here"):
            executors.SubmititExecutor().claim(SweepRunner(config(), tmp_path, None))


def test_slurm_options_and_gpus_are_checked(tmp_path):
    assert executors.parse_options(["account=ml", "qos=high", "slurm_mem=64G", "cpus-per-gpu=8"]) == {
        "slurm_account": "ml", "slurm_qos": "high", "slurm_mem": "64G", "slurm_cpus_per_gpu": 8}
    with pytest.raises(ConfigError, match="--slurm-option must be KEY=VALUE"):
        executors.parse_options(["account"])
    bad = executors.from_args("submitit-local", tmp_path, resume=False, options=["flavour=x"])
    with pytest.raises(ConfigError, match="submitit refused the job parameters .*flavour"):
        bad._executor(SweepRunner(config(), tmp_path, None), 60)
    runner = SweepRunner(config(nproc=8), tmp_path, None)
    with pytest.raises(ConfigError, match="--nproc 8: .* --slurm-gpus-per-trial is 4"):
        executors.SubmititExecutor(cluster="local", gpus_per_trial=4).claim(runner)


def test_ab_and_batch_executors_do_not_mix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "sweep", "--ab", ".", "--executor", "submitit-local",
                           "--out", str(tmp_path / "x")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--ab runs both sides on this machine" in proc.stderr


def _finished_job(tmp_path, record_hash: str | None, monkeypatch):
    """A trial whose job (a pid that no longer runs) ended while no submitter watched; its record if given."""
    from bench.plan.planner import plan

    monkeypatch.setattr(executors, "RECORD_GRACE_S", 0.1)
    out = tmp_path / "sweep"
    runner = SweepRunner(config(), out, CPU)
    out.mkdir(parents=True)
    trial = plan(runner.cfg, CPU)[0]
    record = runner.launcher.bare_record(trial, "ok", None)
    record.config_hash = record_hash or ""
    if record_hash is not None:
        executors.record_path(out, trial).parent.mkdir()
        executors.record_path(out, trial).write_text(record.to_json())
    ledger = executors.Ledger(out)
    ledger.executor = {"kind": "submitit-local"}
    ledger.add(trial.trial_id, "999999999")  # no such process
    executor = executors.SubmititExecutor(cluster="local", poll_s=0.01)
    return lambda: list(executor.run(runner, [trial], {})), trial, record, runner


def test_a_job_that_ended_unwatched_gives_its_record_or_says_how_it_ended(tmp_path, monkeypatch):
    run, trial, record, runner = _finished_job(tmp_path / "1", "", monkeypatch)
    record.config_hash = runner.config_hash
    executors.record_path(runner.out_dir, trial).write_text(record.to_json())
    assert run() == [(trial, record)]  # its record, although the job is gone: not "killed"
    run, trial, _, _ = _finished_job(tmp_path / "2", None, monkeypatch)
    ((_, ended),) = run()
    assert ended.status == "failed" and "job 999999999 ended" in ended.reason  # no record: how it ended
    run, *_ = _finished_job(tmp_path / "3", "0123456789abcdef", monkeypatch)
    with pytest.raises(executors.ExecutorError, match="made under other settings"):
        run()


def test_a_resume_keeps_the_executor_the_sweep_started_with(tmp_path):
    (tmp_path / "env.json").write_text("{}")  # a sweep that ran locally
    with pytest.raises(ConfigError, match="ran with --executor local .* resume it with --executor local"):
        executors.from_args("submitit-local", tmp_path, resume=True)
    executors.Ledger(tmp_path).executor = {"kind": "slurm", "partition": "gpu"}
    with pytest.raises(ConfigError, match="ran with --executor slurm"):
        executors.from_args("local", tmp_path, resume=True)
    assert executors.from_args(None, tmp_path, resume=True).partition == "gpu"
