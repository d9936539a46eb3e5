"""What Slurm says about a sweep's jobs, asked once per poll for all of them, with fallbacks when a source is away.

``squeue`` answers first: the controller's state is the live one, for jobs queued, running, requeued, and ended less
than ``MinJobAge`` ago (300 s by default). Jobs it no longer knows are asked of ``sacct``: accounting keeps a job after
it ended, for as long as its database does. ``scontrol`` is the last resort. A job none of them knows is
``UNKNOWN`` (accounting stopped and the controller's memory of it gone, or a job id from another cluster); ``JobWatch``
counts how long each job has been unknown, so that a submitter's wait for it is bounded (``UNKNOWN_WAIT_S``) instead of
endless.

submitit's own state (``SlurmJob.done()``) is not used to wait: it asks ``sacct`` only, at growing intervals (up to 10
minutes apart), reports a requeued job by its previous run's end, and with accounting away keeps a job ``UNKNOWN``,
which it counts as not done, forever.
"""

from __future__ import annotations

import getpass
import logging
import subprocess
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

# States of a job that has not ended yet (it may still run, or run again: a requeued job goes back to PENDING).
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "PREEMPTED"})
# Ways a job ends when something outside it stopped it (the trial did not fail by itself).
STOPPED = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED",
           "INTERRUPTED")  # the last: submitit-local's state of a job it stopped
UNKNOWN = "UNKNOWN"
UNKNOWN_WAIT_S = 600.0  # how long a job none of sacct, squeue and scontrol knows is waited for before it counts as ended
COMMAND_TIMEOUT_S = 60.0

Runner = Callable[[list[str]], str | None]


def _run(cmd: list[str]) -> str | None:
    """A Slurm command's stdout; None when it fails (not installed, the daemon it asks is down, an unknown job)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("%s: %s", cmd[0], exc)
        return None
    if proc.returncode != 0:
        log.debug("%s exited with %d: %s", " ".join(cmd), proc.returncode, proc.stderr.strip()[:300])
        return None
    return proc.stdout


def _state_word(text: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``RUNNING`` -> ``RUNNING``."""
    return (text.split() or [UNKNOWN])[0].rstrip("+").upper()


def states(job_ids: Iterable[str], run: Runner = _run) -> dict[str, tuple[str, str]]:
    """Each job's state and who said so (``sacct``, ``squeue``, ``scontrol``; ``UNKNOWN``/``none`` when no one knows)."""
    wanted = [str(j) for j in dict.fromkeys(job_ids)]
    found: dict[str, tuple[str, str]] = {}
    if not wanted:
        return found
    # The controller first: its state is the live one (a job requeued after its node failed is PENDING there while
    # accounting still shows the NODE_FAIL of its first run), and it keeps ended jobs for MinJobAge.
    out = run(["squeue", "-h", "--all", "-t", "all", "-o", "%i|%T", "-j", ",".join(wanted)])
    for line in (out or "").splitlines():
        job_id, _, state = line.partition("|")
        if job_id in wanted and state:
            found[job_id] = (_state_word(state), "squeue")
    missing = [j for j in wanted if j not in found]
    if missing:  # ended longer ago than the controller remembers: accounting keeps them
        out = run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(missing)])
        for line in (out or "").splitlines():
            job_id, _, state = line.partition("|")
            if job_id in missing and state:
                found[job_id] = (_state_word(state), "sacct")
    for job_id in [j for j in wanted if j not in found]:
        out = run(["scontrol", "show", "job", "-o", job_id]) or ""
        state = next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), None)
        found[job_id] = (_state_word(state), "scontrol") if state else (UNKNOWN, "none")
    return found


def ended_status(state: str) -> str:
    """The trial status of a job that ended without writing its record: ``oom`` when Slurm killed it for memory,
    ``killed`` when something outside stopped it (scancel, its time limit, its node), else ``failed``."""
    state = state.upper()
    if state.startswith("OUT_OF_ME"):  # OUT_OF_MEMORY (sacct may shorten it)
        return "oom"
    return "killed" if any(state.startswith(s) for s in STOPPED) else "failed"


class JobWatch:
    """The state of the jobs a submitter waits for, asked for all of them at once; a job unknown to every source for
    ``unknown_wait_s`` counts as ended (its state stays ``UNKNOWN``), so no wait is endless."""

    def __init__(self, unknown_wait_s: float | None = None, run: Runner = _run,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.unknown_wait_s = UNKNOWN_WAIT_S if unknown_wait_s is None else unknown_wait_s
        self.run, self.clock = run, clock
        self.last: dict[str, tuple[str, str]] = {}
        self._unknown_since: dict[str, float] = {}

    def poll(self, job_ids: Iterable[str]) -> dict[str, bool]:
        """Whether each job may still run (queued, running, requeued, or unknown for less than the bound)."""
        now = self.clock()
        alive = {}
        for job_id, (state, source) in states(job_ids, self.run).items():
            self.last[job_id] = (state, source)
            if state == UNKNOWN:
                since = self._unknown_since.setdefault(job_id, now)
                alive[job_id] = now - since < self.unknown_wait_s
                if not alive[job_id]:
                    log.warning("Slurm job %s: no sacct, squeue or scontrol knows it after %.0f s; taking it as "
                                "ended", job_id, now - since)
            else:
                self._unknown_since.pop(job_id, None)
                alive[job_id] = state in ACTIVE
        return alive

    def describe(self, job_id: str) -> str:
        """The last state seen, with its source: ``TIMEOUT (sacct)``."""
        state, source = self.last.get(job_id) or states([job_id], self.run)[job_id]
        if state == UNKNOWN:
            waited = self.clock() - self._unknown_since.get(job_id, self.clock())
            return f"{UNKNOWN}: neither sacct, squeue nor scontrol knew the job (waited {waited:.0f} s)"
        return f"{state} ({source})"


def jobs_named(prefix: str, run: Runner = _run) -> dict[str, str]:
    """Job name -> job id of this user's jobs whose names start with ``prefix``, as the controller (``squeue``: queued,
    running, recently ended) and accounting (``sacct``: the last 30 days) know them; the newest job of each name."""
    found: dict[str, str] = {}
    user = getpass.getuser()
    lines = (run(["sacct", "-n", "-X", "-P", "-u", user, "-S", "now-30days", "-o", "JobID,JobName"]) or "").splitlines()
    lines += (run(["squeue", "-h", "-u", user, "-t", "all", "-o", "%i|%j"]) or "").splitlines()
    for line in lines:
        job_id, _, name = line.partition("|")
        if name.startswith(prefix) and job_id.isdigit() and int(job_id) > int(found.get(name, 0)):
            found[name] = job_id
    return found
