"""Where a trial's wall time goes: its stages, each timed by the process that runs it, added up in the record.

A trial's ``wall_s`` is the launcher's clock from the moment it starts the trial to the moment it has the record.
The trial process times its own stages with ``StageClock`` (exclusive times: a stage nested in another counts for
itself alone), the launcher adds what only it sees (starting the process, the process's exit after the record was
written, reading the record), and what no stage claimed is recorded as ``unaccounted``, so the stages always add up
to ``wall_s`` and a missing stage shows as a large remainder rather than vanishing.

Torch-free: the report reads the stage names from here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping

# The stages in the order a trial meets them, with what each holds (docs/records.md and docs/methodology.md).
STAGES: dict[str, str] = {
    "launch": "the launcher, before it starts the process: the trial's spec and temporary directory",
    "start": "process start to the trial module's first line: the interpreter, bench.guard's exec, torchrun",
    "imports": "the trial module's imports (torch and the harness)",
    "setup": "reading the spec, loading users' plugins, logging, the process group under torchrun",
    "data": "loading the workload's dataset: decoded, or read from the sweep's dataset cache (built-in workloads; a "
            "user's model loads its data in build)",
    "build": "the model, the techniques' transforms, the optimizer and the batch iterator",
    "probes": "the techniques' probes before training (build.probe_s: LR range test, batch-size search)",
    "reference": "loading (or computing) the eager fp32 parity reference",
    "quality_train": "the quality run's training clock within its budget (quality.train_time_s): measured steps",
    "evaluation": "the quality run's evaluations and the syncs between its timed segments",
    "continuation": "training on past the budget to a training clock (a continuation's measured steps)",
    "one_off": "the first step's excess over a steady step (build.one_off_s: compilation, lazy initialisation)",
    "warmup": "the untimed steps before the timed window (the parity steps among them in a speed-only trial)",
    "window": "the timed window that was kept (speed.window_s): measured steps",
    "window_retries": "contended windows measured again, the pauses before them, and the window's bookkeeping",
    "flops": "counting FLOPs of input shapes the reference did not count",
    "phases": "the phase pass (phases.steps steps, each region synced and timed)",
    "memory": "the memory passes: clean RSS and the tensor tracker's step",
    "parity": "comparing the first steps with the reference",
    "finalize": "the techniques' results and their finalize hooks",
    "process": "the trial process as a whole, start to exit, when it wrote no stage times of its own (it crashed, or "
               "it runs older trial code: sweep --ab)",
    "teardown": "from the record written (the file's time) to the process's exit: interpreter shutdown, torchrun",
    "collect": "the launcher reading the record and removing the trial's temporary directory",
    "unaccounted": "wall_s minus every other stage: what no stage claimed (a few milliseconds when all is well)",
}

MEASURED = ("window", "quality_train", "continuation")  # the steps a trial exists to time; the rest is fixed cost


class StageClock:
    """Exclusive wall time per named stage, accumulated over the stage's visits.

    ``with clock.stage(name):`` charges the time inside to ``name`` less the time of stages nested in it;
    ``mark(name)`` charges everything since the last boundary to ``name`` (for straight-line code: the imports).
    Time between top-level stages is charged to nothing: the record's ``unaccounted`` shows it.
    """

    def __init__(self, start: float | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last = clock() if start is None else start
        self._open: list[str] = []
        self.seconds: dict[str, float] = {}

    def _charge(self, name: str | None) -> None:
        now = self._clock()
        if name is not None:
            self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._last)
        self._last = now

    def mark(self, name: str) -> None:
        self._charge(name)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._charge(self._open[-1] if self._open else None)
        self._open.append(name)
        try:
            yield
        finally:
            self._charge(name)
            self._open.pop()

    def add(self, name: str, seconds: float) -> None:
        """A stage measured elsewhere (the gap before the process's first line)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def split_measured(raw: Mapping[str, float], *, train_s: float | None = None, continued_s: float | None = None,
                   one_off_s: float | None = None, one_off_in: str | None = None, window_s: float | None = None,
                   probe_s: float | None = None) -> dict[str, float]:
    """The trial's stages from the clock's raw ones, the measured parts cut out with the trial's own numbers.

    Raw ``quality`` (the quality run) becomes ``quality_train`` (``train_s``: its budget's training clock),
    ``continuation`` (``continued_s``: the clock's total past the budget), ``one_off`` when the first step ran there,
    and ``evaluation`` (the rest). Raw ``speed`` (the speed stage less its nested warm-up and FLOP count) becomes
    ``window`` (``window_s``) and ``window_retries`` (the rest). ``one_off_in`` names the stage the first step ran in
    (``quality`` or ``warmup``); ``probes`` (``probe_s``) come out of ``build``. A part larger than its stage (clocks
    read a few microseconds apart) is capped, so no stage is negative."""
    out = {k: v for k, v in raw.items() if k not in ("quality", "speed")}
    one_off = max(one_off_s or 0.0, 0.0)
    if probe_s and "build" in out:
        out["probes"] = min(probe_s, out["build"])
        out["build"] -= out["probes"]
    if "quality" in raw and train_s is None:  # the run did not finish (diverged, failed): its wall is all there is
        out["quality_train"] = raw["quality"]
    elif "quality" in raw:
        left = raw["quality"]
        for name, part in (("one_off", one_off if one_off_in == "quality" else 0.0), ("quality_train", train_s),
                           ("continuation", continued_s)):
            if part is not None and (part > 0 or name == "quality_train"):
                out[name] = min(max(part, 0.0), left)
                left -= out[name]
        out["evaluation"] = left
    if one_off_in == "warmup" and "warmup" in out:
        out["one_off"] = min(one_off, out["warmup"])
        out["warmup"] -= out["one_off"]
    if "speed" in raw:
        kept = raw["speed"] if window_s is None else window_s  # None: the stage failed before its result
        out["window"] = min(max(kept, 0.0), raw["speed"])
        out["window_retries"] = raw["speed"] - out["window"]
    return out


def close(stages: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """``stages`` in the documented order, rounded to milliseconds, with ``unaccounted``: ``wall_s`` less their sum
    (negative when stages overlap or clocks disagree: shown as it is, never hidden)."""
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown trial stages {sorted(unknown)} (known: {', '.join(STAGES)})")
    out = {name: round(stages[name], 4) for name in STAGES if name in stages and name != "unaccounted"}
    out["unaccounted"] = round(wall_s - sum(out.values()), 4)
    return out


def fixed_and_measured(stages: Mapping[str, float]) -> tuple[float, float]:
    """(measured steps' seconds, everything else): a trial's cost split into what it exists to time and the rest."""
    measured = sum(stages.get(name, 0.0) for name in MEASURED)
    return measured, sum(stages.values()) - measured
