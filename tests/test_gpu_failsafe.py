"""Every GPU-only measurement fails safe: the device-busy pass (its profiler and its trace), NVML energy and the
CUDA-event step timer. A failure is that measurement unavailable, with its reason in the record
(``TrialRecord.unavailable``); the trial goes on and is ok. Each failure is injected on the CPU, into the code path
a GPU trial takes (the profiler's start, stop and export, NVML's calls and the events replaced by fakes that raise).
"""

from __future__ import annotations

import functools
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from bench import trial as trial_mod
from bench.measure import phases as phases_mod
from bench.measure.energy import EnergyMeter
from bench.measure.timing import StepTimer
from bench.trial import run
from tests.test_trial import spec  # noqa: F401  (the fixture)

KERNEL = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 5}


def fake_profiler(fail: str | None = None, trace: str | None = None) -> type:
    """A stand-in for torch.profiler.profile that raises in ``fail`` (start, step, stop or export) and otherwise
    writes ``trace`` (default: one kernel)."""

    class Profiler:
        def __init__(self, activities, schedule, on_trace_ready):
            self.ready = on_trace_ready

        def start(self):
            if fail == "start":
                raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

        def step(self):
            if fail == "step":
                raise RuntimeError("profiler schedule broke")

        def stop(self):
            if fail == "stop":
                raise RuntimeError("CUPTI_ERROR_INVALID_CONTEXT while stopping")
            self.ready(self)

        def export_chrome_trace(self, path):
            if fail == "export":
                raise OSError(28, "No space left on device")
            Path(path).write_text(trace if trace is not None else json.dumps({"traceEvents": [KERNEL]}))

    return Profiler


@pytest.fixture
def no_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


@pytest.mark.parametrize("fail, words", [
    ("start", "cannot trace CUDA activity here (RuntimeError: CUPTI_ERROR_NOT_INITIALIZED)"),
    ("step", "failed starting to record (RuntimeError: profiler schedule broke)"),
    ("stop", "failed stopping (RuntimeError: CUPTI_ERROR_INVALID_CONTEXT while stopping)"),
    ("export", "failed exporting its trace (OSError: [Errno 28] No space left on device)"),
])
def test_a_failing_profiler_gives_no_busy_figure_and_says_why(fail, words, monkeypatch, no_sync):
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler(fail))
    busy, why = phases_mod.device_busy_pass(lambda: None, torch.device("cpu"), steps=2)
    assert busy is None and words in why


def test_an_unreadable_trace_gives_no_busy_figure_and_says_why(monkeypatch, no_sync):
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler(trace='{"traceEvents": [{"ph": "X", "cat"'))
    busy, why = phases_mod.device_busy_pass(lambda: None, torch.device("cpu"), steps=2)
    assert busy is None and why.startswith("its trace could not be read (JSONDecodeError")
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler())  # the same pass with a readable trace
    busy, why = phases_mod.device_busy_pass(lambda: None, torch.device("cpu"), steps=2)
    assert why is None and busy.ops_per_step == 0.5


def test_a_training_step_that_fails_in_the_busy_pass_is_the_trials_error(monkeypatch, no_sync):
    """The profiler is stopped (and its own failure swallowed) but the step's error is raised: it is no profiler
    failure, and the trial must say it."""
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler("stop"))

    def step():
        raise FloatingPointError("loss is nan")

    with pytest.raises(FloatingPointError, match="loss is nan"):
        phases_mod.device_busy_pass(step, torch.device("cpu"))


@pytest.mark.parametrize("fail", ["stop", "export"])
def test_a_trial_whose_busy_pass_fails_is_ok_with_the_figure_unavailable(fail, spec, monkeypatch, no_sync):  # noqa: F811
    monkeypatch.setattr(trial_mod, "_busy_pass_wanted", lambda device: True)  # the pass a CUDA trial runs
    monkeypatch.setattr(torch.profiler, "profile", fake_profiler(fail))
    rec = run(spec(mode="speed", contention_retries=0))  # one window, whatever else runs here
    assert rec.status == "ok", rec.reason
    assert rec.phases is not None and rec.phases.device_busy is None and rec.speed.samples_per_s > 0
    assert set(rec.unavailable) == {"device_busy"} and "the profiler failed" in rec.unavailable["device_busy"]
    assert json.loads(rec.to_json())["unavailable"] == rec.unavailable  # it reaches results.jsonl


# ---- NVML energy ------------------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


def fake_pynvml(fail_on_read: int | None) -> types.ModuleType:
    """pynvml whose energy counter raises NVMLError on read number ``fail_on_read`` (1: the meter's own check when
    it is made, 2: the window's start, 3: its end)."""
    nvml = types.ModuleType("pynvml")
    reads = []

    def energy(handle):
        reads.append(handle)
        if len(reads) == fail_on_read:
            raise NVMLError("GPU is lost")
        return 1_000_000 + 250_000 * len(reads)  # millijoules

    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: f"gpu{index}"
    nvml.nvmlDeviceGetName = lambda handle: b"NVIDIA H200"
    nvml.nvmlDeviceGetTotalEnergyConsumption = energy
    return nvml


@pytest.mark.parametrize("fail_on_read, edge", [(2, "start"), (3, "end")])
def test_nvml_failing_at_either_edge_of_the_window_gives_no_joules_and_says_why(fail_on_read, edge, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_on_read))
    meter = EnergyMeter(torch.device("cuda:0"))
    assert meter.available
    meter.start()
    result = meter.stop()
    assert result.joules is None and result.source == "nvml:NVIDIA H200"
    assert result.reason == f"reading the nvml:NVIDIA H200 energy counter at the window's {edge} failed: " \
                            "NVMLError: GPU is lost" == meter.failed
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(None))  # the same meter without a failure
    meter = EnergyMeter(torch.device("cuda:0"))
    meter.start()
    assert meter.stop().joules == pytest.approx(250.0) and meter.failed is None


def test_a_trial_whose_nvml_counter_fails_is_ok_with_energy_unavailable(spec, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(3))
    monkeypatch.setattr(trial_mod, "EnergyMeter", lambda device: EnergyMeter(torch.device("cuda:0")))  # a GPU's
    rec = run(spec(mode="speed", contention_retries=0))  # one window, whatever else runs here
    assert rec.status == "ok", rec.reason
    assert rec.energy.joules is None and "NVMLError: GPU is lost" in rec.energy.reason
    assert set(rec.unavailable) == {"energy"} and rec.unavailable["energy"] == rec.energy.reason


def test_the_window_kept_says_whether_energy_is_unavailable(spec, monkeypatch):  # noqa: F811
    """A contended window is measured again and the last one kept: a counter that failed only in the first does not
    mark the trial's energy unavailable."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(3))  # the first window's end
    monkeypatch.setattr(trial_mod, "EnergyMeter", lambda device: EnergyMeter(torch.device("cuda:0")))
    contended = iter([True, False])
    monkeypatch.setattr(trial_mod, "_agree", lambda flag: next(contended))
    monkeypatch.setattr(trial_mod, "CONTENTION_PAUSE_S", 0.0)
    rec = run(spec(mode="speed", contention_retries=1))
    assert rec.status == "ok" and len(rec.speed.contention_retries) == 1
    assert rec.energy.joules == pytest.approx(250.0) and rec.unavailable == {}


# ---- the CUDA-event step timer ----------------------------------------------------------------------------------


def fake_events(monkeypatch, fail: str) -> None:
    """torch.cuda's events and streams replaced by fakes that raise in ``fail`` (record or elapsed_time)."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            if fail == "record":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def elapsed_time(self, other):
            if fail == "elapsed_time":
                raise RuntimeError("CUDA error: device not ready")
            return 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


@pytest.mark.parametrize("fail, words", [("record", "recording a CUDA event failed (RuntimeError: CUDA error: an "
                                                    "illegal memory access was encountered)"),
                                         ("elapsed_time", "reading the CUDA events failed (RuntimeError: CUDA "
                                                          "error: device not ready)")])
def test_failing_cuda_events_leave_the_hosts_step_times_and_say_why(fail, words, monkeypatch):
    fake_events(monkeypatch, fail)
    ticks = iter(range(100))
    timer = StepTimer(torch.device("cuda"), clock=lambda: float(next(ticks)))
    timer.start()
    for _ in range(3):
        timer.step_done()
    result = timer.stop()
    assert result.events_failed == words
    assert result.step_times_s == [1.0, 1.0, 1.0] and result.total_s == 4.0  # the host's clock
    fake_events(monkeypatch, "nothing")
    timer.start()
    timer.step_done()
    assert timer.stop().events_failed is None  # events that work: their times, in seconds


def test_a_trial_whose_cuda_events_fail_is_ok_with_host_step_times(spec, monkeypatch):  # noqa: F811
    fake_events(monkeypatch, "elapsed_time")
    monkeypatch.setattr(trial_mod, "StepTimer", functools.partial(StepTimer, events=True))  # a GPU trial's timer
    rec = run(spec(mode="speed", contention_retries=0))  # one window, whatever else runs here
    assert rec.status == "ok", rec.reason
    assert rec.speed.step_time_s.median > 0 and rec.speed.steps == rec.speed.step_time_s.n
    assert set(rec.unavailable) == {"step_times"} and "device not ready" in rec.unavailable["step_times"]
    assert "per-step times are the host's clock" in rec.unavailable["step_times"]
