"""Step timing with a device sync only at the window's edges, step statistics, and CPU contention.

A timed window is what nanoGPT's ``bench.py`` does: warm up elsewhere, sync, run N steps without syncing, sync. Per-step
times inside the window come from host timestamps on CPU (the CPU executes synchronously) and from CUDA events on
GPU (host timestamps would only measure kernel *launch* time there, since launches are asynchronous).

With several ranks each edge is a device sync and then a barrier (``host_barrier``) on every rank, so every rank's
window starts when all have finished their earlier work and ends when all have finished their steps: rank 0's window,
the one recorded, covers a slower rank's last steps too.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import torch

log = logging.getLogger(__name__)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, IQR (q75 - q25, numpy's linear interpolation), min, max, mean and n of ``values``.

    Median and IQR come first because step times have a long right tail (GC pauses, other processes): the mean
    alone would overstate a typical step. An empty sequence gives ``n=0`` and None elsewhere, never an exception,
    so a failed window still produces a record.
    """
    n = len(values)
    if n == 0:
        return {"median": None, "iqr": None, "min": None, "max": None, "mean": None, "n": 0}
    arr = np.asarray(values, dtype=np.float64)
    q25, q50, q75 = np.percentile(arr, [25, 50, 75])
    return {
        "median": float(q50),
        "iqr": float(q75 - q25),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "n": n,
    }


@dataclass
class WindowResult:
    """One timed window.

    ``step_times_s`` are wall times per step *including* any data wait inside the step (what a user experiences);
    ``data_wait_per_step_s`` holds the part spent waiting for data, so ``compute_step_times_s()`` can exclude it.
    ``total_s`` is the host wall time from ``start()`` to ``stop()``, both after a device sync.
    """

    step_times_s: list[float]
    total_s: float
    n_steps: int
    data_wait_s: float = 0.0
    data_wait_per_step_s: list[float] = field(default_factory=list)
    events_failed: str | None = None  # CUDA: why the step times are the host's instead of the events'

    def compute_step_times_s(self) -> list[float]:
        """Step times with the data wait of each step subtracted (clamped at 0).

        Exact on CPU. On CUDA it is an approximation: the device may keep running queued kernels while the host
        waits for data, so subtracting the host's wait can undercount a step.
        """
        return [max(t - w, 0.0) for t, w in zip(self.step_times_s, self.data_wait_per_step_s, strict=True)]


def host_barrier() -> None:
    """Every rank of the default process group waits here for every other.

    An all-reduce of a CPU tensor rather than ``dist.barrier()``: under the trial's ``cpu:gloo,cuda:nccl`` group a
    CPU tensor goes to gloo, a host-side rendezvous whatever the device, and no rank's host can leave it before every
    rank has entered it; ``dist.barrier()`` leaves the choice of backend (and, on NCCL, of a device to reduce on) to
    the group. Each rank syncs its own device first (``StepTimer``), so when this returns every rank's device work
    queued before it has finished.
    """
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1))


class StepTimer:
    """Per-step times inside one window; the device is synchronised only at ``start()`` and ``stop()``.

    Usage::

        timer = StepTimer(device)
        timer.start()
        for batch in ...:
            timer.data_wait(seconds_spent_fetching)   # optional
            step(batch)
            timer.step_done()
        result = timer.stop()

    ``clock`` is injectable so the arithmetic can be tested with a fake clock. ``barrier`` (several ranks:
    ``host_barrier``) runs at both edges after the device sync and before the clock is read; None in one process,
    where the window is exactly as before.

    On CUDA the steps are timed by events (``events``: on by default there), and the host's clock is read at each
    step too, for nothing more than a clock call: if an event cannot be created, recorded or read, the per-step times
    are the host's (its launch-to-launch intervals, whose median is the device's step only once the launch queue is
    full) and ``WindowResult.events_failed`` says why. The window's total is the host's between synchronised edges
    either way, so samples/s does not depend on the events.
    """

    def __init__(self, device: torch.device | str, clock: Callable[[], float] = time.perf_counter,
                 barrier: Callable[[], None] | None = None, events: bool | None = None) -> None:
        self.device = torch.device(device)
        self.clock = clock
        self.barrier = barrier
        self._cuda = self.device.type == "cuda"
        self._use_events = self._cuda if events is None else events
        self._events_failed: str | None = None
        self._t0: float | None = None
        self._stamps: list[float] = []
        self._events: list[torch.cuda.Event] = []
        self._waits: list[float] = []
        self._pending_wait = 0.0

    def _sync(self) -> None:
        """A window's edge: this rank's device idle, then (several ranks) every rank's."""
        if self._cuda:
            torch.cuda.synchronize(self.device)
        if self.barrier is not None:
            self.barrier()

    def start(self) -> None:
        """Sync the device (so earlier queued work is not billed to this window), meet the other ranks, and start
        the window."""
        self._stamps, self._events, self._waits, self._pending_wait = [], [], [], 0.0
        self._events_failed = None
        self._sync()
        self._t0 = self.clock()
        self._record_event()

    def _record_event(self) -> None:
        """One CUDA event on the current stream, unless events are off or have failed (then they stay off)."""
        if not self._use_events or self._events_failed is not None:
            return
        try:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self._events.append(ev)
        except Exception as exc:  # the step times fall back to the host's; the window goes on
            self._event_failure("recording a CUDA event", exc)

    def _event_failure(self, what: str, exc: BaseException) -> None:
        self._events_failed = f"{what} failed ({type(exc).__name__}: {exc})".splitlines()[0][:300]
        log.warning("step times from the host's clock: %s", self._events_failed)

    def data_wait(self, seconds: float) -> None:
        """Add time spent waiting for the next batch to the step in progress."""
        self._pending_wait += float(seconds)

    def step_done(self) -> None:
        """Mark the end of one step. No sync: on CUDA an event is recorded on the current stream."""
        if self._t0 is None:
            raise RuntimeError("StepTimer.step_done() called before start()")
        self._record_event()
        self._stamps.append(self.clock())  # a clock call: the fallback should the events fail
        self._waits.append(self._pending_wait)
        self._pending_wait = 0.0

    def stop(self) -> WindowResult:
        """Sync the device, wait for the other ranks' steps, end the window and return its per-step times."""
        if self._t0 is None:
            raise RuntimeError("StepTimer.stop() called before start()")
        self._sync()
        end = self.clock()
        total = end - self._t0
        steps = None
        if self._use_events and self._events_failed is None:
            try:  # events can be read only after the sync above; elapsed_time is in milliseconds
                steps = [a.elapsed_time(b) / 1000.0 for a, b in zip(self._events, self._events[1:], strict=False)]
            except Exception as exc:
                self._event_failure("reading the CUDA events", exc)
        if steps is None:
            edges = [self._t0, *self._stamps]
            steps = [b - a for a, b in zip(edges, edges[1:], strict=False)]
        # A data wait reported after the last step_done() belongs to no step but still happened inside the window.
        waits = list(self._waits)
        result = WindowResult(
            step_times_s=steps,
            total_s=total,
            n_steps=len(steps),
            data_wait_s=sum(waits) + self._pending_wait,
            data_wait_per_step_s=waits,
            events_failed=self._events_failed,
        )
        self._t0 = None
        return result


@dataclass
class ContentionResult:
    """CPU time that processes other than this one (and, by default, its children) used during a window.

    ``fraction`` = ``other_cpu_s / (window_s * ncpu)``: 0 on an otherwise idle machine, 1 if every core was busy
    with foreign work for the whole window.
    """

    other_cpu_s: float
    window_s: float
    ncpu: int
    fraction: float
    steal_s: float = 0.0  # of other_cpu_s: time the hypervisor gave this VM's vCPUs to other guests (/proc/stat)


def _busy_system_cpu_s(cpus: list[int] | None = None) -> tuple[float, float]:
    """System-wide busy CPU seconds since boot, and the steal time among them (one snapshot of /proc/stat), of the
    whole machine or (``cpus``) of those logical CPUs only."""
    if cpus is None:
        return _busy(psutil.cpu_times())
    per_cpu = psutil.cpu_times(percpu=True)
    parts = [_busy(per_cpu[i]) for i in cpus if i < len(per_cpu)]
    return sum(b for b, _ in parts), sum(st for _, st in parts)


def _busy(t: Any) -> tuple[float, float]:
    # /proc/stat already counts guest time inside user (and guest_nice inside nice), so adding guest would count
    # it twice. Steal is time the hypervisor gave our vCPUs to someone else: contention from outside the VM.
    busy = t.user + t.nice + t.system
    for name in ("irq", "softirq", "steal"):
        busy += getattr(t, name, 0.0)
    return busy, float(getattr(t, "steal", 0.0))


def allowed_cpus() -> list[int] | None:
    """The logical CPUs this process may run on when that is fewer than the machine's (a Slurm job's cores, taskset,
    a cgroup cpuset); None when it may run on all of them."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None
    return cpus if 0 < len(cpus) < (psutil.cpu_count(logical=True) or 0) else None


def _sibling_cpu_s(exclude: int) -> dict[int, float]:
    """CPU seconds of every descendant of this process's parent but ``exclude``, by pid."""
    out: dict[int, float] = {}
    try:
        peers = psutil.Process(os.getppid()).children(recursive=True)
    except psutil.Error:
        return out
    for proc in peers:
        if proc.pid == exclude:
            continue
        try:
            ct = proc.cpu_times()
        except psutil.Error:
            continue
        out[proc.pid] = ct.user + ct.system
    return out


class CpuContention:
    """Measures the CPU time other processes took during a window (system-wide busy time minus our own).

    With ``include_children=True`` (the default) the CPU time of this process's live descendants (e.g. DataLoader
    workers) and reaped children counts as our own: they are part of the trial, not contamination. A child that was
    alive at ``start()`` and reaped before ``stop()`` brings its whole lifetime's CPU time into the reaped-children
    counters; that can only make the result look cleaner than it was, and the result is clamped at 0.

    Only the CPUs this process may run on count (``allowed_cpus``): a Slurm job given some of a node's cores
    (``--cpus-per-task``, bound by task/affinity or a cgroup) shares the node with other jobs on the other cores; their
    work is not on the trial's cores and is not contention of its window (memory bandwidth and caches are still
    shared, and not measured here). Without such a restriction every CPU of the machine counts.

    With ``include_siblings=True`` every other descendant of this process's parent counts as our own too: under
    torchrun the parent is the launcher, so the other local ranks (and their workers) are part of the trial, not
    contamination. (Each rank is a session leader of its own there, so sessions cannot tell.) Off by default: the
    parent of a one-process trial is the sweep runner, whose other children are not ours.
    """

    def __init__(self, include_children: bool = True, include_siblings: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.include_children = include_children
        self.include_siblings = include_siblings
        self.clock = clock
        self._proc = psutil.Process(os.getpid())
        self._cpus = allowed_cpus()
        self._t0: float | None = None
        self._busy0 = 0.0
        self._steal0 = 0.0
        self._own0 = 0.0
        self._children0: dict[int, float] = {}

    def _own_cpu_s(self) -> tuple[float, dict[int, float]]:
        t = self._proc.cpu_times()
        own = t.user + t.system
        kids: dict[int, float] = {}
        if self.include_children:
            own += t.children_user + t.children_system
            for child in self._proc.children(recursive=True):
                try:
                    ct = child.cpu_times()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                kids[child.pid] = ct.user + ct.system
        if self.include_siblings:
            kids.update(_sibling_cpu_s(exclude=self._proc.pid))
        return own, kids

    def start(self) -> None:
        """Start the window: snapshot system-wide busy time and our own CPU time."""
        self._own0, self._children0 = self._own_cpu_s()
        self._busy0, self._steal0 = _busy_system_cpu_s(self._cpus)
        self._t0 = self.clock()

    def stop(self) -> ContentionResult:
        """End the window and return how much CPU time others took."""
        if self._t0 is None:
            raise RuntimeError("CpuContention.stop() called before start()")
        window = self.clock() - self._t0
        busy, steal = _busy_system_cpu_s(self._cpus)
        busy, steal = busy - self._busy0, max(steal - self._steal0, 0.0)
        own1, kids1 = self._own_cpu_s()
        own = own1 - self._own0
        # Live descendants: only their CPU time inside the window (new ones since start count from 0).
        own += sum(max(v - self._children0.get(pid, 0.0), 0.0) for pid, v in kids1.items())
        other = max(busy - own, 0.0)
        ncpu = len(self._cpus) if self._cpus else psutil.cpu_count(logical=True) or 1
        fraction = other / (window * ncpu) if window > 0 else 0.0
        self._t0 = None
        if fraction > 0.1:
            log.info("other processes used %.0f%% of %d CPUs during the window (steal %.2f s)", 100 * fraction, ncpu,
                     steal)
        return ContentionResult(other_cpu_s=other, window_s=window, ncpu=ncpu, fraction=fraction,
                                steal_s=min(steal, other))
