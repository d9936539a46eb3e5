"""bench.slurmjobs: a job's state from sacct, else squeue, else scontrol; a job no one knows is waited for a bounded time.

The commands' answers here are the text Slurm 22.05 prints (tests/test_slurm.py runs the real ones); what is checked is
which command is asked when, and what the submitter concludes.
"""

from __future__ import annotations

from bench import slurmjobs


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


def test_sacct_answers_first_and_its_words_are_reduced_to_the_state():
    slurm = FakeSlurm(sacct={"7": "CANCELLED by 0", "8": "RUNNING"})
    assert slurmjobs.states(["7", "8"], slurm) == {"7": ("CANCELLED", "sacct"), "8": ("RUNNING", "sacct")}
    assert slurm.calls == ["sacct"]


def test_without_accounting_squeue_then_scontrol_are_asked():
    slurm = FakeSlurm(sacct=None, squeue={"7": "COMPLETED"}, scontrol={"8": "TIMEOUT"})
    assert slurmjobs.states(["7", "8", "9"], slurm) == {
        "7": ("COMPLETED", "squeue"), "8": ("TIMEOUT", "scontrol"), "9": ("UNKNOWN", "none")}
    assert slurm.calls == ["sacct", "squeue", "scontrol", "scontrol"]
    # accounting that does not know a job yet (just submitted) is completed by the controller's answer
    slurm = FakeSlurm(sacct={"7": "COMPLETED"}, squeue={"8": "PENDING"})
    assert slurmjobs.states(["7", "8"], slurm)["8"] == ("PENDING", "squeue")


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
    watch = slurmjobs.JobWatch(run=FakeSlurm(sacct={"1": "PENDING", "2": "REQUEUED", "3": "COMPLETED",
                                                    "4": "NODE_FAIL", "5": "COMPLETING"}))
    assert watch.poll(["1", "2", "3", "4", "5"]) == {"1": True, "2": True, "3": False, "4": False, "5": True}
    assert [slurmjobs.ended_status(s) for s in ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                                                "OUT_OF_ME+", "FAILED", "COMPLETED", "UNKNOWN: ...")] == [
        "killed", "killed", "killed", "killed", "oom", "oom", "failed", "failed", "failed"]
