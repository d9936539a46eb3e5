"""Where a step's time goes: the labelled phases of a training step, timed in a pass of their own.

The loop labels its regions (``bench.loop.TrainLoop.step``): ``h2d`` (inputs to the device), ``forward`` (forward
and loss), ``backward`` (backward; a data-parallel all-reduce overlapped with it counts here), ``optimizer``
(zero_grad, the step, after-step hooks); the caller labels ``data`` (waiting for the next batch). ``other`` is the
rest of the step: Python between the regions, technique contexts entered around them. A technique that owns the
step's forward and backward (``pp``'s pipeline schedule) is timed whole as ``forward``: its backward reads 0.

A phase pass is separate from the timed window on purpose: on a GPU each region's edges are synchronised so its
time is its own (a sync per region serialises host and device, which the timed window must not do), and on every
device the clock calls are kept out of the hot path. On CPU the regions are exact (execution is synchronous); on
GPU the step is a little slower than in the window, and the report says which pass the shares come from.

With ``label=True`` each region is also a ``torch.profiler.record_function`` range, so a profiler trace shows the
phases (``bench profile``); ``sync=False`` leaves the regions unsynchronised there, so the trace shows the step as
the timed window runs it (the host ahead of the device) while still labelling where each kernel was launched.

Whether a GPU was busy is not in the host-side phase times: ``device_busy_pass`` measures it, a few more steps with
only the device's activity traced (``bench.measure.trace`` reads the trace).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.measure import trace as trace_mod

log = logging.getLogger(__name__)

# The phases of a step, in step order; "other" is the remainder. The analysis, the report and the diagnosis read
# these names, so this module imports torch only when a clock runs (reading records stays torch-free).
PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other")
LOOP_PHASES = ("h2d", "forward", "backward", "optimizer")  # the regions the loop labels itself

if TYPE_CHECKING:
    import torch

_NULL = contextlib.nullcontext()


def no_region(name: str) -> contextlib.AbstractContextManager[None]:
    """The loop's region when no phase clock is attached: one shared no-op context, nothing timed."""
    return _NULL


class PhaseClock:
    """Accumulates the time of labelled regions per step: ``with clock.step(): ... with clock.region(name): ...``.

    ``clock`` is injectable so the arithmetic can be tested with a fake clock. ``sync=False`` (with ``label``, for
    a trace) leaves the regions' edges unsynchronised: their host times are then launch times, not the phases'.
    """

    def __init__(self, device: torch.device | str, label: bool = False,
                 clock: Callable[[], float] = time.perf_counter, sync: bool = True) -> None:
        import torch

        self.device = torch.device(device)
        self.label = label
        self.clock = clock
        self._cuda = self.device.type == "cuda" and sync
        self.steps: list[dict[str, float]] = []  # per step: phase -> seconds, "other" included, and "step"
        self._current: dict[str, float] | None = None

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Time one region of the step in progress (several regions of one name add up: micro-batches)."""
        if self._current is None:
            raise RuntimeError(f"PhaseClock.region({name!r}) outside a step")
        if self.label:
            import torch
        labelled = torch.profiler.record_function(name) if self.label else _NULL
        self._sync()
        t0 = self.clock()
        with labelled:
            yield
        self._sync()
        self._current[name] = self._current.get(name, 0.0) + self.clock() - t0

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One training step, data fetch included: its wall time, and ``other`` = wall - the labelled regions."""
        self._current = {}
        self._sync()
        t0 = self.clock()
        try:
            yield
            self._sync()
            total = self.clock() - t0
            named = sum(self._current.values())
            self._current["other"] = max(total - named, 0.0)
            self._current["step"] = total
            self.steps.append(self._current)
        finally:
            self._current = None


@dataclass(frozen=True)
class PhaseStats:
    """The phase pass summarised: per phase, the mean and median seconds per step, the IQR, and the share."""

    steps: int
    step_s: float  # mean wall time of a step in the pass (data fetch included): the shares' denominator
    mean_s: dict[str, float]
    median_s: dict[str, float]
    iqr_s: dict[str, float]
    share: dict[str, float]  # mean_s / step_s: the shares add up to 1 (other is the remainder)


def summarize_phases(steps: list[dict[str, float]]) -> PhaseStats:
    """Per-phase statistics over the steps of a pass (a phase a step never entered counts 0 for that step)."""
    if not steps:
        raise ValueError("no steps were timed")
    step = np.array([s["step"] for s in steps])
    mean, median, iqr, share = {}, {}, {}, {}
    for phase in PHASES:
        values = np.array([s.get(phase, 0.0) for s in steps])
        q25, q50, q75 = np.percentile(values, [25, 50, 75])
        mean[phase], median[phase], iqr[phase] = float(values.mean()), float(q50), float(q75 - q25)
        share[phase] = float(values.sum() / step.sum()) if step.sum() > 0 else 0.0
    return PhaseStats(len(steps), float(step.mean()), mean, median, iqr, share)


BUSY_STEPS = 5  # steps of the device-busy pass: a few hundred milliseconds on a GPU-sized step


def device_busy_pass(step: Callable[[], object], device: torch.device, steps: int = BUSY_STEPS
                     ) -> tuple[trace_mod.DeviceBusy | None, str | None]:
    """How busy a CUDA device is while ``step`` (one training step, data fetch included) runs ``steps`` times:
    ``(busy, None)``, or ``(None, why)`` when it cannot be said.

    Only the device's activity is traced (``torch.profiler`` with ``ProfilerActivity.CUDA``: CUPTI records each
    kernel, copy and memset; no CPU operator is recorded, so the host is not slowed the way a full trace slows it),
    no region is synchronised, and the device is synchronised only at the pass's edges, as in the timed window. One
    more step runs first as the profiler's warm-up (CUPTI set up, nothing kept). The busy fraction is the union of
    the device's ops over the pass's host wall time.

    The figure is one measurement of the trial, never its failure: a profiler that cannot trace the device, fails to
    start, step, stop or export, a trace that cannot be read, or one without a device op (nothing to say rather
    than "idle"), gives ``(None, why)`` and the trial goes on. An error of ``step`` itself (the training step) is
    the trial's and is raised, after the profiler is stopped."""
    import torch
    from torch.profiler import ProfilerActivity

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "busy.json"
        export_failed: list[str] = []

        def export(prof: torch.profiler.profile) -> None:  # called from prof.step() or prof.stop()
            failed = _attempt(lambda: prof.export_chrome_trace(str(path)), "exporting its trace")
            if failed:
                export_failed.append(failed)

        try:
            prof = torch.profiler.profile(
                activities=[ProfilerActivity.CUDA], schedule=torch.profiler.schedule(wait=0, warmup=1, active=1),
                on_trace_ready=export)
            prof.start()
        except Exception as exc:  # a torch without CUDA activity (no CUPTI), or a profiler that cannot start
            return _not_measured(f"the profiler cannot trace CUDA activity here ({_why(exc)})")
        failed = None
        try:
            step()  # the profiler's warm-up
            torch.cuda.synchronize(device)  # nothing launched before the pass runs inside it
            failed = _attempt(prof.step, "starting to record")
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            torch.cuda.synchronize(device)  # everything the pass launched ran inside it
            wall = time.perf_counter() - t0
        finally:
            stopped = _attempt(prof.stop, "stopping")  # the trace is written here
        failed = failed or stopped or (export_failed[0] if export_failed else None)
        if failed:
            return _not_measured(f"the profiler failed {failed}")
        if not path.exists():
            return _not_measured("the profiler wrote no trace")
        try:
            busy = trace_mod.from_activity(trace_mod.load(path), wall, steps)
        except Exception as exc:  # a truncated or unexpected trace: the figure is lost, not the trial
            return _not_measured(f"its trace could not be read ({_why(exc)})")
    if busy is None:
        return _not_measured(f"the profiler traced no kernel on {device}")
    return busy, None


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _attempt(call: Callable[[], object], what: str) -> str | None:
    """Run a profiler call; what failed, or None."""
    try:
        call()
    except Exception as exc:  # the profiler's own failure: the pass's figure is lost, the trial goes on
        return f"{what} ({_why(exc)})"
    return None


def _not_measured(why: str) -> tuple[None, str]:
    log.warning("device busy not measured: %s", why)
    return None, why
