"""`--executor slurm` against a real Slurm: slurmctld, slurmd and accounting (slurmdbd, MariaDB) on this machine.

The cluster is the one scripts/slurm_local.sh starts (one node: this machine's CPUs and memory); the tests start it
when it is not running and stop it again afterwards. Without root (or without apt-get when Slurm is not installed)
they skip, saying so; as root with apt (CI) a cluster that does not start is an error, not a skip.

Each test runs `python -m bench sweep --executor slurm` end to end on the smoke preset's tiny MLP, and checks what
the sweep recorded against what Slurm says (squeue, sacct, scontrol):

- a sweep completes and records what the local executor records for the same plan; each job had its node to itself;
- `scancel` of a running job: the trial recorded `killed` with the job's state, the next trial still runs;
- a job past its Slurm time limit: `killed` with TIMEOUT; a shorter trial timeout still ends the trial first;
- the submitter killed (SIGKILL) while jobs run, then `--resume`: no job submitted twice, each trial recorded once;
- the node DRAINED then DOWN while a job runs (Slurm requeues it), the submitter killed meanwhile, the node back:
  `--resume` waits for the requeued job and records its second run, once;
- accounting stopped: states come from the controller, and a job no one knows ends the wait with a clear record;
- `--slurm-cpus-per-trial`: the job's cores as Slurm gave them, and a trial beside another job on the node's other
  core does not count that job as contention.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.records.results import ResultStore
from bench.run import executors, slurmjobs
from tests.conftest import REPO

pytestmark = pytest.mark.slurm
submitit = pytest.importorskip("submitit", reason="submitit (the 'slurm' extra) is not installed")

SCRIPT = REPO / "scripts" / "slurm_local.sh"
# A tiny MLP trial whose timed window lasts WINDOW seconds: long enough to be acted on while it runs.
LONG = """
name = "long"
workloads = ["mlp"]
techniques = [{techniques}]
repeats = 1
threads = 1
[budget]
min_seconds = {window}
max_seconds = {window}
train_steps = 4
eval_points = 1
parity_steps = 2
max_train_seconds = {max_train}
timeout_s = {timeout}
memory = false
"""


def _script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    """The local cluster, started if it is not running (and then stopped at the end)."""
    if _script("status", timeout=60).returncode == 0:
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster needs root (scripts/slurm_local.sh installs and starts system daemons)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and there is no apt-get to install it (scripts/slurm_local.sh)")
    started = _script("start")
    assert started.returncode == 0, f"scripts/slurm_local.sh start failed: {started.stderr[-2000:]}"
    yield
    _script("stop", timeout=120)


@pytest.fixture
def sweep_dir(cluster, tmp_path):
    """The sweep's directory; any job of it still queued or running at the end is cancelled (none left behind)."""
    out = tmp_path / "sweep"
    yield out
    ids = [job_id for job_id, name, _ in _jobs(out)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def _long(tmp_path: Path, window: float, techniques: str = '"baseline", "grad_accum:steps=2"',
          timeout: float = 300.0) -> Path:
    path = tmp_path / "long.toml"
    path.write_text(LONG.format(window=window, techniques=techniques, timeout=timeout, max_train=min(200.0, timeout / 2)))
    return path


def _cmd(out: Path, *extra: str, config: Path | None = None, techniques: str = "baseline,grad_accum:steps=2",
         executor: str = "slurm") -> list[str]:
    cmd = [sys.executable, "-m", "bench", "sweep", "--out", str(out), "--executor", executor]
    if executor == "slurm":
        cmd += ["--slurm-poll-seconds", "1"]
    if config is not None:
        return [*cmd, "--config", str(config), *extra]
    return [*cmd, "--preset", "smoke", "--workloads", "mlp", "--repeats", "1", "--techniques", techniques,
            "--mode", "speed", "--no-memory", "--window-seconds", "1", *extra]


def _run(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    # Output to a file, not a pipe: nothing blocks when no one reads it.
    return subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _jobs(out: Path) -> list[tuple[str, str, str]]:
    """(job id, name, state) of every job of the sweep in OUT that Slurm knows, setup jobs included."""
    prefix = executors.job_name(out, "")
    text = subprocess.run(["squeue", "-h", "--all", "-t", "all", "-o", "%i|%j|%T"], capture_output=True,
                          text=True).stdout
    rows = [line.split("|") for line in text.splitlines()]
    return sorted((j, n, s) for j, n, s in rows if n.startswith(prefix))


def _trial_jobs(out: Path) -> dict[str, list[str]]:
    """Trial id -> the ids of the jobs submitted for it."""
    prefix = executors.job_name(out, "")
    found: dict[str, list[str]] = {}
    for job_id, name, _ in _jobs(out):
        if name != prefix + "setup":
            found.setdefault(name[len(prefix):], []).append(job_id)
    return found


def _running_trial(out: Path, proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    """The id of a trial job of the sweep once its trial process is in its timed window's run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        running = [j for j, n, s in _jobs(out) if s == "RUNNING" and not n.endswith(":setup")]
        if running and _trial_processes():
            time.sleep(3)  # past its start-up: inside the trial
            return running[0]
        time.sleep(0.5)
    raise AssertionError(f"no trial job started running: {log.read_text()[-3000:]}")


def _trial_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[1:3] == ["-m", "bench.trial"]]


def _steps(job_id: str) -> list[psutil.Process]:
    """The job's slurmstepd processes on this node (titled ``slurmstepd: [JOB.batch]``, ``[JOB.0]``)."""
    return [p for p in psutil.process_iter(["cmdline"]) if f"[{job_id}." in " ".join(p.info["cmdline"] or [])]


def _records(out: Path) -> dict:
    records = ResultStore(out / "results.jsonl").read()
    assert len(records) == len({r.trial_id for r in records}), [r.trial_id for r in records]  # each once
    return {r.trial_id: r for r in records}


def _scontrol(job_id: str) -> dict[str, str]:
    text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


# ---- the tests ----------------------------------------------------------------------------------------------------


def test_a_slurm_sweep_records_what_the_local_executor_records(sweep_dir, tmp_path):
    _run(_cmd(sweep_dir))
    local = tmp_path / "local"
    _run(_cmd(local, executor="local"))
    on_slurm, here = _records(sweep_dir), _records(local)
    assert sorted(on_slurm) == sorted(here) and len(here) == 2  # same trial ids
    for trial_id, record in here.items():
        other = on_slurm[trial_id]
        assert (other.status, record.status) == ("ok", "ok"), (other.reason, record.reason)
        assert other.to_dict().keys() == record.to_dict().keys()  # the same record fields, filled alike
        same = ("technique_label", "seed", "repeat", "world_size", "device", "mode", "position", "kind", "config_hash")
        assert [getattr(other, k) for k in same] == [getattr(record, k) for k in same]
        assert other.speed and other.speed.samples_per_s > 0
    ledger = json.loads((sweep_dir / "jobs.json").read_text())["jobs"]
    jobs = _trial_jobs(sweep_dir)
    assert {t: [e["job_id"]] for t, e in ledger.items()} == jobs  # one job per trial, the one the ledger names
    assert {s for _, n, s in _jobs(sweep_dir)} == {"COMPLETED"}
    ids = [e["job_id"] for e in ledger.values()]
    # Accounting answers for them too (asked alone, as when the controller has forgotten them), and scontrol.
    no = lambda cmd: None  # noqa: E731 - a source that does not answer
    sacct = slurmjobs.states(ids, lambda cmd: no(cmd) if cmd[0] == "squeue" else slurmjobs._run(cmd))
    assert sacct == {j: ("COMPLETED", "sacct") for j in ids}
    scontrol = slurmjobs.states(ids, lambda cmd: slurmjobs._run(cmd) if cmd[0] == "scontrol" else no(cmd))
    assert scontrol == {j: ("COMPLETED", "scontrol") for j in ids}
    # Without --slurm-cpus-per-trial each job had its node to itself: all its CPUs, no sharing.
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    for job_id in ids:
        job = _scontrol(job_id)
        assert (job["OverSubscribe"], job["NumCPUs"]) == ("NO", str(cpus)), job
    env = json.loads((sweep_dir / "env.json").read_text())
    assert env["hostname"] == "slurm:default partition" and env["setup_hostname"] == os.uname().nodename
    assert (sweep_dir / "report.md").exists()


def test_a_cancelled_job_is_recorded_killed_and_the_sweep_goes_on(sweep_dir, tmp_path):
    log = tmp_path / "sweep.log"
    proc = _start(_cmd(sweep_dir, config=_long(tmp_path, window=15)), log)
    cancelled = _running_trial(sweep_dir, proc, log)
    subprocess.run(["scancel", cancelled], check=True)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    records = _records(sweep_dir)
    by_job = {e["job_id"]: t for t, e in json.loads((sweep_dir / "jobs.json").read_text())["jobs"].items()}
    killed = records[by_job.pop(cancelled)]
    assert killed.status == "killed" and f"slurm job {cancelled} ended (CANCELLED" in killed.reason, killed.reason
    assert not executors.record_path(sweep_dir, killed.trial_id).exists()  # the job wrote no record of its own
    (other,) = by_job.values()
    assert records[other].status == "ok", records[other].reason  # the next trial ran


def test_a_job_past_its_time_limit_is_recorded_with_slurms_timeout(sweep_dir, tmp_path):
    # --slurm-option time=1: a one-minute limit; the trial's window alone lasts 100 s. submitit asks Slurm for its
    # USR2 warning 90 s before the limit (here: at once); the job must not die of it.
    config = _long(tmp_path, window=100, techniques='"baseline"')
    _run(_cmd(sweep_dir, "--slurm-option", "time=1", config=config))
    (record,) = _records(sweep_dir).values()
    assert record.status == "killed" and "ended (TIMEOUT" in record.reason, record.reason
    assert [s for _, n, s in _jobs(sweep_dir) if not n.endswith(":setup")] == ["TIMEOUT"]


def test_the_trials_own_timeout_ends_it_first_when_shorter(sweep_dir, tmp_path):
    config = _long(tmp_path, window=100, techniques='"baseline"', timeout=8.0)  # job limit: 0 + 30 minutes
    _run(_cmd(sweep_dir, config=config))
    (record,) = _records(sweep_dir).values()
    assert record.status == "timeout" and "timeout_s=8" in record.reason, record.reason
    assert [s for _, n, s in _jobs(sweep_dir) if not n.endswith(":setup")] == ["COMPLETED"]  # the job itself ended well


def test_a_submitter_killed_while_jobs_run_is_resumed_without_submitting_twice(sweep_dir, tmp_path):
    cmd = _cmd(sweep_dir, config=_long(tmp_path, window=5, techniques='"baseline", "grad_accum:steps=2", '
                                                                      '"grad_accum:steps=4"'))
    log = tmp_path / "first.log"
    first = _start(cmd, log)
    _running_trial(sweep_dir, first, log)
    first.send_signal(signal.SIGKILL)  # no chance to clean up
    first.wait(timeout=30)
    ledger = json.loads((sweep_dir / "jobs.json").read_text())
    before = dict(ledger["jobs"])
    assert len(before) == 3  # no cap on Slurm: every trial's job was submitted at once
    assert any(s in ("RUNNING", "PENDING") for _, n, s in _jobs(sweep_dir) if not n.endswith(":setup"))
    # As if the submitter had died between sbatch and writing jobs.json for the last trial: Slurm has its job (by
    # name), the ledger does not.
    lost = max(before, key=lambda t: int(before[t]["job_id"]))
    del ledger["jobs"][lost]
    (sweep_dir / "jobs.json").write_text(json.dumps(ledger))
    _run([*cmd, "--resume"])
    after = json.loads((sweep_dir / "jobs.json").read_text())["jobs"]
    assert {t: e["job_id"] for t, e in after.items()} == {t: e["job_id"] for t, e in before.items()}  # none again
    assert {t: len(j) for t, j in _trial_jobs(sweep_dir).items()} == {t: 1 for t in before}  # per Slurm too
    records = _records(sweep_dir)
    assert sorted(records) == sorted(before) and {r.status for r in records.values()} == {"ok"}


def test_a_node_drained_then_down_while_a_job_runs_then_back(sweep_dir, tmp_path):
    node = os.uname().nodename.split(".")[0]
    cmd = _cmd(sweep_dir, config=_long(tmp_path, window=15))
    log = tmp_path / "first.log"
    first = _start(cmd, log)
    try:
        running = _running_trial(sweep_dir, first, log)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=trainbench test"], check=True)
        time.sleep(2)
        assert _scontrol(running)["JobState"] == "RUNNING"  # a drained node keeps its running jobs
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=trainbench test"], check=True)
        # Slurm ends the job (NODE_FAIL) and requeues it: PENDING again, to run from the start
        _wait_for(lambda: _scontrol(running).get("JobState") == "PENDING", 60, "the job was not requeued")
        first.send_signal(signal.SIGKILL)  # and the submitter is lost meanwhile
        first.wait(timeout=30)
        # The node comes back only once the first run's processes are gone (slurmstepd included): a node that takes
        # the requeued job while its first run's step still runs there is drained ("Duplicate jobid") and the job
        # held, as on any cluster.
        _wait_for(lambda: not _trial_processes() and not _steps(running), 120, "the first run did not end")
        requeued = next(t for t, e in json.loads((sweep_dir / "jobs.json").read_text())["jobs"].items()
                        if e["job_id"] == running)
        assert requeued not in _records(sweep_dir)  # not taken for ended: Slurm runs it again
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    subprocess.run(["scontrol", "release", running], capture_output=True)  # held if Slurm found it twice: no-op else
    subprocess.run(["scontrol", "update", f"jobid={running}", "starttime=now"], capture_output=True)  # no 2-min wait
    before = json.loads((sweep_dir / "jobs.json").read_text())["jobs"]
    _run([*cmd, "--resume"])
    assert json.loads((sweep_dir / "jobs.json").read_text())["jobs"] == before
    records = _records(sweep_dir)
    assert sorted(records) == sorted(before) and {r.status for r in records.values()} == {"ok"}, [
        r.reason for r in records.values()]  # the requeued job's second run, recorded once
    assert int(_scontrol(running)["Restarts"]) == 1


@pytest.fixture
def no_accounting(cluster):
    stopped = _script("stop", "slurmdbd", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode != 0  # accounting is away
    yield
    started = _script("start")
    assert started.returncode == 0, started.stderr


def test_without_accounting_states_come_from_the_controller_and_an_unknown_job_ends_the_wait(
        sweep_dir, tmp_path, no_accounting, monkeypatch):
    _run(_cmd(sweep_dir, techniques="baseline"))
    (record,) = _records(sweep_dir).values()
    assert record.status == "ok", record.reason
    (job_id,) = [e["job_id"] for e in json.loads((sweep_dir / "jobs.json").read_text())["jobs"].values()]
    assert slurmjobs.states([job_id]) == {job_id: ("COMPLETED", "squeue")}
    # A job that no source knows (its id from elsewhere; or ended long ago, with accounting away): a bounded wait.
    from bench.plan.config import build_config
    from bench.plan.planner import plan
    from bench.run.runner import SweepRunner

    monkeypatch.setattr(slurmjobs, "UNKNOWN_WAIT_S", 3.0)
    monkeypatch.setattr(executors, "RECORD_GRACE_S", 0.5)
    out = tmp_path / "unknown"
    out.mkdir()
    runner = SweepRunner(build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1}), out, None)
    trial = plan(runner.cfg, None)[0]
    ledger = executors.Ledger(out)
    ledger.executor = {"kind": "slurm"}
    ledger.add(trial.trial_id, "987654321")
    ((_, ended),) = list(executors.SubmititExecutor(poll_s=0.5).run(runner, [trial], {}))
    assert ended.status == "failed"
    assert "slurm job 987654321 ended (UNKNOWN: neither sacct, squeue nor scontrol knew the job" in ended.reason


def test_a_trial_with_its_own_cores_beside_another_job(sweep_dir, tmp_path):
    burner = subprocess.run(["sbatch", "--parsable", "--cpus-per-task=1", "--job-name=trainbench-test-burner",
                             f"--output={tmp_path / 'burner.out'}", "--wrap", f"{sys.executable} -c 'while True: pass'"],
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        _wait_for(lambda: _scontrol(burner).get("JobState") == "RUNNING", 60, "the other job did not start")
        log = tmp_path / "sweep.log"
        proc = _start(_cmd(sweep_dir, "--slurm-cpus-per-trial", "1", config=_long(tmp_path, 10, '"baseline"')), log)
        job = _scontrol(_running_trial(sweep_dir, proc, log))
        assert (job["NumCPUs"], job["OverSubscribe"]) == ("1", "OK"), job  # one core, the node shared
        (trial,) = _trial_processes()
        burning = next(p for p in psutil.process_iter(["cmdline"])
                       if "while True: pass" in " ".join(p.info["cmdline"] or []) and "--wrap" not in p.info["cmdline"])
        assert len(trial.cpu_affinity()) == 1 and not set(trial.cpu_affinity()) & set(burning.cpu_affinity())
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        subprocess.run(["scancel", burner], capture_output=True)
    (record,) = _records(sweep_dir).values()
    assert record.status == "ok", record.reason
    contention = record.speed.contention
    assert contention.ncpu == 1  # the window's CPUs: the job's one core, not the node's
    # The other job kept its core busy all along; on the trial's core it was not: it is not this window's contention.
    assert contention.other_cpu_s < 0.5 * contention.window_s, contention
