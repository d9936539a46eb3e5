"""bench.run.slurmjobs: a job's state from squeue, else sacct, else scontrol; a job no one knows is waited for a bounded time.

The commands' answers here are in the form Slurm 22.05 prints them (``squeue -o %i|%T``, ``sacct -P``,
``scontrol -o``; tests/test_slurm.py runs the real ones); what is checked is which command is asked when, and what the
submitter concludes.
"""

from __future__ import annotations

from bench.run import slurmjobs


class FakeSlurm:
    """Answers sacct, squeue and scontrol from dicts of job states; ``None`` for a command that fails."""

    def __init__(self, sacct=None, squeue=None, scontrol=None):
        self.answers = {"sacct": sacct, "squeue": squeue, "scontrol": scontrol}
        self.calls: list[str] = []

    def __call__(self, cmd):
        self.calls.append(cmd[0])
        known = self.answers[cmd[0]]
        if known is None:
            return None  # e.g. "sacct: error: slurmdbd: Connection refused", exit code 1
        if cmd[0] == "scontrol":
            job = cmd[-1]
            return f"JobId={job} JobName=x JobState={known[job]} Reason=None\n" if job in known else None
        return "".join(f"{j}|{s}\n" for j, s in known.items())


def test_the_controller_answers_first_and_accounting_for_the_jobs_it_forgot():
    # 8 was requeued after its node failed: accounting shows its first run's end, the controller its live state.
    slurm = FakeSlurm(squeue={"8": "PENDING"}, sacct={"7": "CANCELLED by 0", "8": "NODE_FAIL"})
    assert slurmjobs.states(["7", "8"], slurm) == {"7": ("CANCELLED", "sacct"), "8": ("PENDING", "squeue")}
    assert slurm.calls == ["squeue", "sacct"]
    slurm = FakeSlurm(squeue={"7": "RUNNING"}, sacct={"7": "RUNNING"})
    assert slurmjobs.states(["7"], slurm) == {"7": ("RUNNING", "squeue")} and slurm.calls == ["squeue"]


def test_without_accounting_the_controller_still_answers_and_scontrol_is_last():
    slurm = FakeSlurm(sacct=None, squeue={"7": "COMPLETED"}, scontrol={"8": "TIMEOUT"})
    assert slurmjobs.states(["7", "8", "9"], slurm) == {
        "7": ("COMPLETED", "squeue"), "8": ("TIMEOUT", "scontrol"), "9": ("UNKNOWN", "none")}
    assert slurm.calls == ["squeue", "sacct", "scontrol", "scontrol"]


def test_a_job_no_one_knows_is_waited_for_a_bounded_time():
    now = [0.0]
    watch = slurmjobs.JobWatch(unknown_wait_s=60, run=FakeSlurm(), clock=lambda: now[0])
    assert watch.poll(["5"]) == {"5": True}  # not known yet: it may be on its way (accounting lags sbatch)
    now[0] = 59.0
    assert watch.poll(["5"]) == {"5": True}
    now[0] = 61.0
    assert watch.poll(["5"]) == {"5": False}  # ended, as far as anyone can tell
    assert watch.describe("5").startswith("UNKNOWN: neither sacct, squeue nor scontrol knew the job (waited 61 s)")
    # a job seen again in between starts its wait afresh
    slurm = FakeSlurm(squeue={"5": "RUNNING"})
    watch = slurmjobs.JobWatch(unknown_wait_s=60, run=slurm, clock=lambda: now[0])
    assert watch.poll(["5"]) == {"5": True} and watch.describe("5") == "RUNNING (squeue)"
    slurm.answers["squeue"] = {"5": "COMPLETED"}
    assert watch.poll(["5"]) == {"5": False}


def test_active_and_ended_states():
    watch = slurmjobs.JobWatch(run=FakeSlurm(squeue={"1": "PENDING", "2": "REQUEUED", "3": "COMPLETED",
                                                    "4": "NODE_FAIL", "5": "COMPLETING"}))
    assert watch.poll(["1", "2", "3", "4", "5"]) == {"1": True, "2": True, "3": False, "4": False, "5": True}
    assert [slurmjobs.ended_status(s) for s in ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                                                "OUT_OF_ME+", "FAILED", "COMPLETED", "UNKNOWN: ...")] == [
        "killed", "killed", "killed", "killed", "oom", "oom", "failed", "failed", "failed"]


def test_jobs_of_a_sweep_are_found_by_name_in_both_sources():
    answers = {"sacct": "7|trainbench:ab12:setup\n8|trainbench:ab12:mlp:tiny/baseline/seed0/r0\n9|other\n",
               "squeue": "8|trainbench:ab12:mlp:tiny/baseline/seed0/r0\n11|trainbench:ab12:mlp:tiny/x/seed0/r0\n"
                         "12|trainbench:cd34:mlp:tiny/x/seed0/r0\n"}
    assert slurmjobs.jobs_named("trainbench:ab12:", lambda cmd: answers[cmd[0]]) == {
        "trainbench:ab12:setup": "7", "trainbench:ab12:mlp:tiny/baseline/seed0/r0": "8",
        "trainbench:ab12:mlp:tiny/x/seed0/r0": "11"}
    assert slurmjobs.jobs_named("trainbench:ab12:", lambda cmd: None) == {}  # no Slurm answering: none found
