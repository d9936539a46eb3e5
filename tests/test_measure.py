"""Measurement code against deterministic proxies: fake clocks, known allocations, FLOP counts, a fake sysfs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.measure import timing
from bench.measure.energy import EnergyMeter, RaplReader
from bench.measure.flops import count_flops
from bench.measure.memory import PeakRss, TensorMemoryTracker, cuda_peak_bytes, cuda_peak_reset
from bench.measure.timing import CpuContention, StepTimer, summarize

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# ---- timing ------------------------------------------------------------------------------------------------------


def test_summarize_exact():
    s = summarize([4.0, 1.0, 3.0, 2.0])
    # numpy linear percentiles of 1..4: q25 = 1.75, q75 = 3.25
    assert s == {"median": 2.5, "iqr": 1.5, "min": 1.0, "max": 4.0, "mean": 2.5, "n": 4}
    assert summarize([0.5]) == {"median": 0.5, "iqr": 0.0, "min": 0.5, "max": 0.5, "mean": 0.5, "n": 1}
    s = summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s["median"] == 3.0 and s["iqr"] == 2.0 and s["mean"] == 4.0 and s["n"] == 5
    assert summarize([])["n"] == 0 and summarize([])["median"] is None


def fake_clock(times):
    it = iter(times)
    return lambda: next(it)


def test_step_timer_fake_clock_arithmetic():
    timer = StepTimer(torch.device("cpu"), clock=fake_clock([10.0, 10.5, 11.25, 12.0, 12.5]))
    timer.start()
    timer.data_wait(0.125)
    timer.step_done()
    timer.step_done()
    timer.data_wait(0.25)
    timer.data_wait(0.125)
    timer.step_done()
    r = timer.stop()
    assert r.step_times_s == [0.5, 0.75, 0.75]
    assert r.n_steps == 3
    assert r.total_s == 2.5
    assert r.data_wait_s == 0.5
    assert r.data_wait_per_step_s == [0.125, 0.0, 0.375]
    assert r.compute_step_times_s() == [0.375, 0.75, 0.375]


def test_step_timer_requires_start():
    timer = StepTimer("cpu")
    with pytest.raises(RuntimeError, match="before start"):
        timer.step_done()
    with pytest.raises(RuntimeError, match="before start"):
        timer.stop()


def test_step_timer_known_sleep():
    timer = StepTimer("cpu")
    timer.start()
    for _ in range(3):
        time.sleep(0.02)
        timer.step_done()
    r = timer.stop()
    assert r.n_steps == 3
    assert all(0.02 <= t <= 0.2 for t in r.step_times_s), r.step_times_s
    assert r.total_s >= sum(r.step_times_s) - 1e-9


def test_step_timer_meets_the_other_ranks_after_the_sync_and_before_the_clock_at_both_edges(monkeypatch):
    calls = []
    clock = iter([1.0, 1.5, 3.0])

    def read_clock():
        calls.append("clock")
        return next(clock)

    timer = StepTimer("cpu", clock=read_clock, barrier=lambda: calls.append("barrier"))
    timer.start()
    timer.step_done()
    result = timer.stop()
    assert calls == ["barrier", "clock", "clock", "barrier", "clock"]
    assert result.total_s == 2.0 and result.step_times_s == [0.5]
    # On CUDA the edge syncs this rank's device before meeting the others (synchronize recorded, not run)
    calls.clear()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    timer._cuda = True
    timer._sync()
    assert calls == ["sync", "barrier"]


def test_one_process_windows_meet_no_one():
    assert StepTimer("cpu").barrier is None  # the single-process window is unchanged: no collective at its edges


def _windows_on_rank(rank: int, init: str, out: str, slow_s: float) -> None:
    """One rank of a 2-rank gloo group: a one-step window with the barrier at its edges, then one without; rank 1's
    step ``slow_s`` long, rank 0's empty."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        for barrier in (True, False):
            dist.barrier()  # both ranks start each window together, whatever the last one left
            timer = StepTimer("cpu", barrier=timing.host_barrier if barrier else None)
            timer.start()
            if rank == 1:
                time.sleep(slow_s)
            timer.step_done()
            r = timer.stop()
            Path(f"{out}.{barrier}.{rank}").write_text(json.dumps({"total_s": r.total_s,
                                                                  "step_s": r.step_times_s[0]}))
            dist.all_reduce(torch.zeros(1))  # neither rank leaves before the other has written
    finally:
        dist.destroy_process_group()


SLOW_S = 2.0  # rank 1's step


@pytest.fixture(scope="module")
def two_rank_windows(tmp_path_factory) -> dict[bool, list[dict]]:
    """Each rank's window with the barrier and without: one spawn of two gloo ranks (processes of their own)."""
    import json

    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("windows")
    out = str(tmp / "window")
    mp.spawn(_windows_on_rank, args=(f"file://{tmp / 'store'}", out, SLOW_S), nprocs=2, join=True)
    return {b: [json.loads(Path(f"{out}.{b}.{r}").read_text()) for r in (0, 1)] for b in (True, False)}


@pytest.mark.distributed
@pytest.mark.parametrize("barrier", [True, False])
def test_rank_0s_window_covers_a_slower_rank_only_with_the_barrier(two_rank_windows, barrier):
    """Rank 1 sleeps 2 s in its one step: with the barrier, rank 0's window (the one recorded) lasts about that long
    though its own step is empty; without it, rank 0's window ends at once. The bound is half the sleep: rank 0 may
    leave the first barrier later than rank 1 (descheduled on a loaded machine), which shortens its window by that
    delay, never by a second."""
    rank0, rank1 = two_rank_windows[barrier]
    assert rank1["step_s"] >= SLOW_S and rank0["step_s"] < SLOW_S / 2  # each rank's steps are its own
    if barrier:
        assert rank0["total_s"] >= SLOW_S / 2  # the window's end waited for rank 1's step
    else:
        assert rank0["total_s"] < SLOW_S / 2


@pytest.mark.gpu
@needs_cuda
def test_step_timer_cuda_events():
    a = torch.randn(2048, 2048, device="cuda")
    timer = StepTimer(torch.device("cuda"))
    timer.start()
    for _ in range(5):
        for _ in range(10):
            a = torch.tanh(a @ a)
        timer.step_done()
    r = timer.stop()
    assert r.n_steps == 5 and all(t > 0 for t in r.step_times_s)
    assert sum(r.step_times_s) <= r.total_s * 1.05


CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
ProcTimes = namedtuple("ProcTimes", "user system children_user children_system")


class FakeProc:
    def __init__(self, times):
        self.times = iter(times)

    def cpu_times(self):
        return next(self.times)

    def children(self, recursive=False):
        return []


def test_cpu_contention_arithmetic(monkeypatch):
    # System: 10 s busy at start; at stop user +3, system +1, steal +0.5, and guest +2 (already inside user: not
    # added again). This process used 1.5 s (+0.5 s of reaped children). Window 2 s on 2 CPUs.
    system = iter([
        CpuTimes(100, 0, 10, 500, 0, 0, 0, 0, 5, 0),
        CpuTimes(103, 0, 11, 500, 0, 0, 0, 0.5, 7, 0),
    ])
    monkeypatch.setattr(timing.psutil, "cpu_times", lambda: next(system))
    monkeypatch.setattr(timing.psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(timing, "allowed_cpus", lambda: None)  # may run on every CPU
    c = CpuContention(clock=fake_clock([0.0, 2.0]))
    c._proc = FakeProc([ProcTimes(1.0, 0.5, 0.0, 0.0), ProcTimes(2.0, 1.0, 0.5, 0.0)])
    c.start()
    r = c.stop()
    assert r.other_cpu_s == pytest.approx(4.5 - 2.0)
    assert r.window_s == 2.0 and r.ncpu == 2
    assert r.fraction == pytest.approx(2.5 / 4.0)
    assert r.steal_s == pytest.approx(0.5)  # the VM's share of it, said apart


def test_cpu_contention_counts_only_the_cpus_the_trial_may_run_on(monkeypatch):
    # A Slurm job with one of the node's two cores (--cpus-per-task=1, bound to CPU 0) beside another job busy on
    # CPU 1: CPU 0 is busy 2 s of the 2-s window, all of it this process's; CPU 1 is busy 2 s with the other job.
    idle = CpuTimes(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    per_cpu = iter([[idle, idle], [CpuTimes(2, 0, 0, 0, 0, 0, 0, 0, 0, 0), CpuTimes(1.5, 0, 0.5, 0, 0, 0, 0, 0, 0, 0)]])
    monkeypatch.setattr(timing.psutil, "cpu_times", lambda percpu=False: next(per_cpu))
    monkeypatch.setattr(timing.psutil, "cpu_count", lambda logical=True: 2)
    monkeypatch.setattr(timing.os, "sched_getaffinity", lambda pid: {0})
    c = CpuContention(include_children=False, clock=fake_clock([0.0, 2.0]))
    c._proc = FakeProc([ProcTimes(0.0, 0.0, 0.0, 0.0), ProcTimes(2.0, 0.0, 0.0, 0.0)])
    c.start()
    r = c.stop()
    assert (r.other_cpu_s, r.ncpu, r.fraction) == (0.0, 1, 0.0)  # the other job's core is not this window's
    monkeypatch.setattr(timing.os, "sched_getaffinity", lambda pid: {0, 1})  # the whole machine: it counts
    per_cpu = iter([[idle, idle], [CpuTimes(2, 0, 0, 0, 0, 0, 0, 0, 0, 0), CpuTimes(1.5, 0, 0.5, 0, 0, 0, 0, 0, 0, 0)]])
    monkeypatch.setattr(timing.psutil, "cpu_times", lambda percpu=False: next(per_cpu) if percpu else (
        CpuTimes(*map(sum, zip(*next(per_cpu), strict=True)))))
    c = CpuContention(include_children=False, clock=fake_clock([0.0, 2.0]))
    c._proc = FakeProc([ProcTimes(0.0, 0.0, 0.0, 0.0), ProcTimes(2.0, 0.0, 0.0, 0.0)])
    c.start()
    r = c.stop()
    assert (r.other_cpu_s, r.ncpu, r.fraction) == (2.0, 2, 0.5)


def test_cpu_contention_sees_busy_process():
    # include_children=False: the busy child stands for a foreign process (by default own children count as ours).
    code = "import time,sys\nprint('go', flush=True)\nt=time.time()\nwhile time.time()-t<2.0: pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        c = CpuContention(include_children=False)
        c.start()
        time.sleep(1.0)
        r = c.stop()
    finally:
        proc.kill()
        proc.wait()
    assert r.ncpu == len(os.sched_getaffinity(0))  # the CPUs this process may run on (all, unless pinned)
    # one busy core of two is 0.5 (of one, 1.0); other agents' processes can only add to it
    assert r.fraction >= 0.25, r


_SIBLING_CHILD = """
import subprocess, sys, time
import psutil
from bench.measure.timing import CpuContention
busy = "import time\\nprint('go', flush=True)\\nt = time.time()\\nwhile time.time() - t < 3.0: pass"
peer = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
assert peer.stdout.readline().strip() == "go"
# include_children=False: the peer stands for a sibling rank (another descendant of our parent, the launcher)
apart, together = CpuContention(include_children=False), CpuContention(include_children=False, include_siblings=True)
own = psutil.Process(peer.pid)
before = sum(own.cpu_times()[:2])
apart.start(); together.start()
time.sleep(1.0)
a, t = apart.stop(), together.stop()
peer_cpu = sum(own.cpu_times()[:2]) - before
peer.kill()
print(a.other_cpu_s - t.other_cpu_s, peer_cpu)
"""


def test_cpu_contention_counts_sibling_ranks_as_own():
    # The busy peer is a descendant of the measuring process's parent: ours only with include_siblings=True. What
    # moves from "other" to "own" is the CPU the peer had in the window: a second on an idle machine, less where
    # other work shares the cores (the peer's own count says how much).
    out = subprocess.run([sys.executable, "-c", _SIBLING_CHILD], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[1])
    moved, peer_cpu = map(float, out.stdout.split())
    assert peer_cpu > 0.1
    assert moved == pytest.approx(peer_cpu, abs=0.1 + 0.1 * peer_cpu)


# ---- memory: RSS and CUDA helpers ----------------------------------------------------------------------------------

MB = 1_000_000


def _touch_200mb() -> np.ndarray:
    return np.ones(200 * MB // 8)  # ones, not empty: untouched pages are not resident


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_peak_rss_clear_refs():
    rss = PeakRss()
    rss.reset()
    assert rss.method == "clear_refs"
    before = rss.rss_bytes()
    buf = _touch_200mb()
    assert rss.peak_bytes() - before >= 190 * MB
    del buf
    rss.reset()  # the peak now starts again from the (lower) current RSS
    assert rss.peak_bytes() - before < 100 * MB


def test_peak_rss_sampling_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(PeakRss, "CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    rss = PeakRss()
    rss.reset()
    try:
        assert rss.method == "sampling"
        before = rss.rss_bytes()
        buf = _touch_200mb()
        time.sleep(0.05)
        del buf
        time.sleep(0.05)
        assert rss.peak_bytes() - before >= 190 * MB
    finally:
        rss.close()


# Run in a child: the thresholds are process-wide and would slow every later test in this process.
_FREED_RSS_CHILD = """
import sys, psutil, torch
from bench.measure.memory import return_freed_memory_to_os
if sys.argv[1] == "clean":
    assert return_freed_memory_to_os() is None
p = psutil.Process()
del_me = [torch.ones(4_000_000) for _ in range(2)]  # 16 MB blocks, freed: glibc's default raises its mmap
del del_me  # threshold past them, so the next blocks come from the heap
before = p.memory_info().rss
blocks, kept = [], []
for _ in range(400):  # 160 MB in 400 KB tensors, each followed by a 4 KB one that stays alive, as long-lived
    blocks.append(torch.ones(100_000))  # tensors sit between short-lived ones in training: the heap cannot
    kept.append(torch.ones(1000))  # shrink past them
during = p.memory_info().rss
del blocks
after = p.memory_info().rss
print((during - before) // 2**20, (during - after) // 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_return_freed_memory_to_os_makes_rss_follow_frees():
    def run(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", _FREED_RSS_CHILD, mode], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).parents[1])
        grew, released = map(int, out.stdout.split())
        return grew, released

    grew, released = run("default")
    assert grew >= 140 and released < 0.25 * grew  # glibc's default keeps the freed blocks: RSS stays up
    grew, released = run("clean")
    assert grew >= 140 and released > 0.9 * grew  # with the thresholds set, freeing shows in RSS at once


def test_cuda_helpers_are_noops_on_cpu():
    cuda_peak_reset("cpu")
    assert cuda_peak_bytes(torch.device("cpu")) is None


@pytest.mark.gpu
@needs_cuda
def test_cuda_peak_bytes():
    cuda_peak_reset("cuda")
    x = torch.empty(10 * MB, dtype=torch.uint8, device="cuda")
    peaks = cuda_peak_bytes("cuda")
    assert peaks["allocated"] >= 10 * MB and peaks["reserved"] >= peaks["allocated"]
    del x


# ---- memory: tensor tracker ---------------------------------------------------------------------------------------

PARAM_BYTES = 4 * (1000 * 1000 + 1000)


def test_tracker_known_allocation_and_views():
    with TensorMemoryTracker() as tracker:
        a = torch.empty(1_000_000)
        b = a.view(1000, 1000)  # views share the storage: counted once
        c = a[10:]
    r = tracker.result()
    assert r.peak_bytes == 4_000_000 and r.activations == 4_000_000
    assert r.params == r.grads == r.optimizer == r.other == 0
    del a, b, c


def test_tracker_sees_frees_and_categories():
    before = torch.ones(1000)  # exists before entering and is not model state: never counted
    with TensorMemoryTracker() as tracker:
        x = torch.empty(1_000_000)
        del x
        y = torch.empty(2_000_000)
        before.view(10, 100).add_(1)
        with torch.no_grad():
            z = torch.empty(250_000)  # not forward-pass work: "other"
    r = tracker.result()
    assert r.peak_bytes == 8_000_000 + 1_000_000
    assert (r.activations, r.other) == (8_000_000, 1_000_000)
    assert r.activation_peak_bytes == 8_000_000
    del y, z


def _linear_adamw():
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 1000)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _step(model, opt, x, micro_batches=1, zero_grad_at_end=False):
    if not zero_grad_at_end:
        opt.zero_grad(set_to_none=True)
    for chunk in x.chunk(micro_batches):
        (model(chunk).square().mean() / micro_batches).backward()
    opt.step()
    if zero_grad_at_end:
        opt.zero_grad(set_to_none=True)


def _state_bytes(opt):
    return sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values())


def test_tracker_linear_adamw_exact():
    model, opt = _linear_adamw()
    x = torch.randn(16, 1000)
    tracker = TensorMemoryTracker(model, opt)
    with tracker:  # the first step creates AdamW's state inside the tracked step
        _step(model, opt, x)
    r = tracker.result()
    assert r.params == PARAM_BYTES
    assert r.grads == PARAM_BYTES
    # exp_avg + exp_avg_sq per parameter, plus a float32 scalar 'step' tensor per parameter on CPU
    assert r.optimizer == 2 * PARAM_BYTES + 2 * 4 == _state_bytes(opt)
    assert r.peak_bytes == r.params + r.grads + r.optimizer + r.activations + r.other
    assert r.activation_peak_bytes > 0


def test_tracker_counts_grads_freed_before_exit():
    model, opt = _linear_adamw()
    x = torch.randn(16, 1000)
    _step(model, opt, x, zero_grad_at_end=True)
    tracker = TensorMemoryTracker(model, opt)
    with tracker:
        _step(model, opt, x, zero_grad_at_end=True)
    r = tracker.result()
    assert all(p.grad is None for p in model.parameters())
    assert (r.params, r.grads, r.optimizer) == (PARAM_BYTES, PARAM_BYTES, 2 * PARAM_BYTES + 8)


def test_tracker_model_called_several_times_per_step():
    model, opt = _linear_adamw()
    x = torch.randn(64, 1000)
    _step(model, opt, x, micro_batches=4)
    tracker = TensorMemoryTracker(model, opt)
    with tracker:
        _step(model, opt, x, micro_batches=4)
    r = tracker.result()
    assert (r.params, r.grads, r.optimizer) == (PARAM_BYTES, PARAM_BYTES, 2 * PARAM_BYTES + 8)
    # one micro-batch of 16 at a time: its output (16 x 1000 floats) and its square are alive together
    assert r.activation_peak_bytes >= 2 * 16 * 1000 * 4
    assert r.activation_peak_bytes < 2 * 64 * 1000 * 4


def test_tracker_is_repeatable():
    model, opt = _linear_adamw()
    x = torch.randn(32, 1000)
    _step(model, opt, x)
    results = []
    for _ in range(2):
        tracker = TensorMemoryTracker(model, opt)
        with tracker:
            _step(model, opt, x)
        results.append(tracker.result())
    assert results[0] == results[1]


def _mlp_activation_peak(batch: int) -> int:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, 64)
    tracker = TensorMemoryTracker(model, opt)
    with tracker:
        _step(model, opt, x)
    return tracker.result().activation_peak_bytes


def test_tracker_activations_scale_with_batch():
    small, large = _mlp_activation_peak(32), _mlp_activation_peak(64)
    # The peak is the moment ReLU's output (B x 256 float32) exists beside its input; the input is freed right after
    # (ReLU saves its output, not its input), and the later output (B x 10) and its square add less than that.
    assert small == 2 * 4 * 256 * 32
    assert large == 2 * 4 * 256 * 64
    assert large / small == 2.0


@pytest.mark.gpu
@needs_cuda
def test_tracker_on_cuda():
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 1000, device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 1000, device="cuda")
    tracker = TensorMemoryTracker(model, opt)
    with tracker:
        _step(model, opt, x)
    r = tracker.result()
    assert (r.params, r.grads) == (PARAM_BYTES, PARAM_BYTES)
    assert r.optimizer == _state_bytes(opt)


# ---- FLOPs -----------------------------------------------------------------------------------------------------------

B, IN, OUT = 8, 16, 32


def test_flops_linear_forward():
    layer = torch.nn.Linear(IN, OUT)
    x = torch.randn(B, IN)
    assert count_flops(lambda: layer(x)) == 2 * B * IN * OUT


@pytest.mark.parametrize("input_grad, factor", [(False, 4), (True, 6)])
def test_flops_linear_forward_backward(input_grad, factor):
    # backward computes the weight gradient always, the input gradient only when the input requires grad
    layer = torch.nn.Linear(IN, OUT)
    x = torch.randn(B, IN, requires_grad=input_grad)
    assert count_flops(lambda: layer(x).sum().backward()) == factor * B * IN * OUT


# ---- energy ----------------------------------------------------------------------------------------------------------


def test_energy_unavailable_gives_reason(tmp_path):
    result = EnergyMeter("cpu", powercap_root=tmp_path / "no-powercap").stop()
    assert result.joules is None and result.source is None
    assert "no RAPL powercap counters readable" in result.reason


def test_energy_this_machine_is_honest():
    meter = EnergyMeter("cpu")
    meter.start()
    result = meter.stop()
    if meter.available:
        assert result.joules is not None and result.joules >= 0 and result.source.startswith("rapl:")
    else:
        assert result.joules is None and result.reason


def _zone(root: Path, name: str, label: str, energy: int, max_range: int = 1_000_000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "name").write_text(label + "\n")
    (d / "energy_uj").write_text(f"{energy}\n")
    (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    return d / "energy_uj"


def test_rapl_fake_sysfs_with_wraparound(tmp_path):
    pkg0 = _zone(tmp_path, "intel-rapl:0", "package-0", 999_500)
    core0 = _zone(tmp_path, "intel-rapl:0:0", "core", 10)  # inside package-0: must not be added
    pkg1 = _zone(tmp_path, "intel-rapl:1", "package-1", 2_000)
    psys = _zone(tmp_path, "intel-rapl:2", "psys", 0)  # whole platform overlaps the packages: ignored
    meter = EnergyMeter("cpu", powercap_root=tmp_path)
    assert meter.available
    meter.start()
    pkg0.write_text("1500\n")  # wrapped: 500 to the top of the range, then 1500
    core0.write_text("9999\n")
    pkg1.write_text("5000\n")
    psys.write_text("999999\n")
    result = meter.stop()
    assert result.source == "rapl:package-0+package-1"
    assert result.joules == pytest.approx((2_000 + 3_000) / 1e6)
    assert result.reason is None


def test_rapl_counter_that_wraps_without_a_range_is_no_reading_not_a_guess(tmp_path):
    d = tmp_path / "intel-rapl:0"
    d.mkdir()
    (d / "name").write_text("package-0\n")
    (d / "energy_uj").write_text("500\n")  # no max_energy_range_uj: a wrap cannot be corrected
    meter = EnergyMeter("cpu", powercap_root=tmp_path)
    meter.start()
    (d / "energy_uj").write_text("100\n")
    with pytest.raises(ValueError, match="went backwards and has no max_energy_range_uj"):
        meter._reader.joules_between([500], [100])
    result = meter.stop()  # the trial keeps its other measurements: no joules, and why
    assert result.joules is None and "went backwards and has no max_energy_range_uj" in result.reason


def test_rapl_psys_only_and_unreadable(tmp_path):
    _zone(tmp_path, "intel-rapl:0", "psys", 100)
    reader = RaplReader(tmp_path)
    assert reader.source == "rapl:psys"
    assert reader.joules_between([100], [2_100]) == pytest.approx(0.002)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("not a number")
    assert not RaplReader(tmp_path).available


@pytest.mark.gpu
@needs_cuda
def test_energy_nvml():
    meter = EnergyMeter("cuda")
    meter.start()
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        a = torch.tanh(a @ a)
    torch.cuda.synchronize()
    result = meter.stop()
    if meter.available:
        assert result.joules is not None and result.joules >= 0 and result.source.startswith("nvml:")
    else:
        assert result.joules is None and result.reason


def test_tracker_agrees_with_torch_memtracker():
    # An independent check: torch's own MemTracker sees the same peak on a model it can handle (called once).
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)
    _step(model, opt, x)
    theirs = mem_tracker.MemTracker()
    theirs.track_external(model, opt)
    with theirs:
        _step(model, opt, x)
    ours = TensorMemoryTracker(model, opt)
    with ours:
        _step(model, opt, x)
    peak = next(iter(theirs.get_tracker_snapshot("peak").values()))
    # MemTracker also counts the module's input (the batch, created before entering); this tracker does not
    assert ours.result().peak_bytes + x.nbytes == peak["Total"]


@pytest.mark.parametrize("groups", [1, 4, 16])
def test_a_grouped_convolution_step_counts_three_times_its_forward(groups):
    """Forward, input gradient and weight gradient are one convolution's FLOPs each, grouped or not (torch 2.13's own
    formula counted a depthwise conv's weight gradient ``groups`` times over)."""
    conv = torch.nn.Conv2d(16, 16, 3, padding=1, groups=groups, bias=False)
    x = torch.randn(4, 16, 14, 14, requires_grad=True)
    forward = 2 * 4 * 14 * 14 * 16 * (16 // groups) * 9  # 2 x output points x c_out x (c_in / groups) x k x k
    assert count_flops(lambda: conv(x)) == forward
    assert count_flops(lambda: conv(x).sum().backward()) == 3 * forward
