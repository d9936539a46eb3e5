"""Reading a torch.profiler trace (bench/measure/trace.py): the device's busy time as the union of its kernels,
copies and memsets, exact on hand-made traces with known overlaps, and measured from the recorded H200 trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.measure import trace as T
from bench.measure.phases import PHASES

FIXTURE = Path(__file__).parent / "fixtures" / "h200-profile"


def kernel(ts, dur, name="k", stream=7, corr=None, cat="kernel"):
    args = {"stream": stream, **({"correlation": corr} if corr is not None else {})}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": args}


def host(name, ts, dur, tid=1, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def launch(ts, corr, tid=1, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": "cudaLaunchKernel", "pid": 100, "tid": tid, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def test_union_and_overlap_are_exact():
    assert T.merge([(5, 20), (0, 10), (30, 40), (40, 45)]) == [(0, 20), (30, 45)]  # touching intervals join
    merged = T.merge([(0, 10), (20, 30)])
    assert T.overlap(merged, 5, 25) == 10  # 5 of each
    assert T.overlap(merged, 10, 20) == 0
    assert T.overlap(merged, -5, 100) == 20
    assert T.overlap([], 0, 1) == 0


def test_busy_time_counts_overlapping_streams_once_and_only_inside_the_steps():
    events = [
        host("ProfilerStep#1", 0, 40), host("ProfilerStep#2", 50, 50),
        kernel(0, 10, stream=7), kernel(5, 15, stream=8),  # two streams overlapping: busy 0..20
        kernel(35, 15, cat="gpu_memcpy"),  # 35..50: 5 inside step 1, the rest in the gap before step 2
        kernel(60, 10, cat="gpu_memset"), kernel(90, 20),  # step 2: 10, then 90..100 of a kernel ending at 110
        host("aten::mm", 0, 40, cat="cpu_op"), launch(1, corr=1),  # host events are not device time
    ]
    busy = T.from_trace(events)
    assert busy.steps == 2
    assert busy.wall_s == pytest.approx(45e-6)  # (40 + 50) / 2 steps, microseconds to seconds
    assert busy.busy_s == pytest.approx((20 + 5 + 10 + 10) / 2 * 1e-6)
    assert busy.fraction == pytest.approx(45 / 90)
    # ops counted where they start inside a step: 3 in step 1 (the copy at 35 too), 2 in step 2
    assert busy.ops_per_step == 2.5 and busy.mean_op_s == pytest.approx((10 + 15 + 15 + 10 + 20) / 5 * 1e-6)
    assert busy.launched_s == {}


def test_each_phase_owns_the_device_time_of_what_it_launched_from_any_thread():
    """Backward's kernels are launched by autograd's own thread while the main thread waits inside the
    ``backward`` range: the launch's time, not its thread, names the phase; the kernel may run after it ends."""
    events = [
        host("ProfilerStep#1", 0, 100),
        host("forward", 10, 20), host("backward", 40, 30), host("optimizer", 5, 3), host("optimizer", 80, 10),
        launch(12, corr=1), kernel(15, 30, corr=1),  # launched in forward, runs on into backward's time
        launch(45, corr=2, tid=2), kernel(50, 8, corr=2),  # launched in backward from another thread
        launch(82, corr=3, cat="cuda_driver"), kernel(85, 4, corr=3, cat="gpu_memset"),  # optimizer, driver API
        launch(95, corr=4), kernel(96, 2, corr=4),  # launched outside every phase: left out
        kernel(97, 1, corr=99),  # its launch is not in the trace: left out
    ]
    busy = T.from_trace(events, PHASES)
    assert busy.launched_s == pytest.approx({"forward": 30e-6, "backward": 8e-6, "optimizer": 4e-6})
    assert busy.busy_s == pytest.approx((30 + 8 + 4 + 2) * 1e-6)  # the last two overlap: 96..98 and 97..98


def test_a_pass_traced_for_device_activity_only_is_measured_against_its_host_wall_time():
    events = [kernel(0, 10), kernel(5, 10, stream=8), kernel(40, 20, cat="gpu_memcpy")]
    busy = T.from_activity(events, wall_s=200e-6, steps=2)
    assert busy.busy_s == pytest.approx(35e-6 / 2) and busy.wall_s == pytest.approx(100e-6)
    assert busy.fraction == pytest.approx(35 / 200)
    assert busy.ops_per_step == 1.5 and busy.mean_op_s == pytest.approx(40e-6 / 3)
    assert busy.source == "CUDA activity over 2 steps"


def test_no_device_op_claims_nothing():
    cpu_trace = [host("ProfilerStep#1", 0, 10), host("aten::mm", 1, 5, cat="cpu_op")]
    assert T.from_trace(cpu_trace) is None  # a CPU trace
    assert T.from_activity([], wall_s=1.0, steps=3) is None  # the profiler saw nothing: not "idle"
    assert T.kernel_table(cpu_trace) == []


def test_the_kernel_table_ranks_device_ops_by_device_time_with_their_own_shares():
    events = [host("ProfilerStep#1", 0, 100), host("ProfilerStep#2", 100, 100),
              kernel(0, 30, "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float> >(float*)"),
              kernel(100, 30, "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float> >(float*)"),
              kernel(40, 10, "nvjet_sm90_tst_192x128"), kernel(140, 10, "nvjet_sm90_tst_192x128"),
              kernel(300, 99, "after the steps"), host("aten::mm", 0, 100, cat="cpu_op")]
    rows = T.kernel_table(events)
    assert [r.short for r in rows] == ["reduce_kernel<…> (1)", "reduce_kernel<…> (2)", "nvjet_sm90_tst_192x128"]
    assert rows[0].name.startswith("void at::native::reduce_kernel<128")  # the full name is kept
    assert rows[2].calls == 2 and rows[2].per_step_s == pytest.approx(10e-6)  # 20 us over 2 steps
    assert [r.share for r in rows] == pytest.approx([0.375, 0.375, 0.25])


@pytest.mark.parametrize(("name", "short"), [
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>(long, float*)",
     "GammaBetaBackwardCUDAKernelTemplate<…>"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", "vectorized_elementwise_kernel<…>"),
    ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT", "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16…"),
])
def test_short_kernel_names(name, short):
    assert T.short_name(name) == short and len(T.short_name(name)) <= 60


def test_a_trace_file_loads_gzipped_or_not(tmp_path):
    events = [kernel(0, 1)]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert T.load(tmp_path / "t.json") == T.load(tmp_path / "t.json.gz") == events


# ---- the recorded H200 trace -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200():
    """``bench profile gpt:gpt2-124m --techniques bf16`` at batch 8 on one H200 (2026-12-04): 2 profiled steps,
    each region synchronised at its edges (the profiler of that day), CPU operators recorded."""
    return T.load(FIXTURE / "trace.json.gz")


def test_the_recorded_h200_step_keeps_its_gpu_busy_a_quarter_of_the_time(h200):
    """Measured from the committed trace (one trace of 2 steps, so no interval): the device is busy 17.65 ms of
    each 69.3 ms profiled step, 25.5%; 863 kernels, copies and memsets per step, 20.4 us on average. Against the
    40.9 ms step of the same profile's unprofiled phase pass the same device time is 43% of the step."""
    busy = T.from_trace(h200, PHASES)
    assert busy.steps == 2
    assert busy.busy_s == pytest.approx(17.647e-3, abs=1e-6)
    assert busy.wall_s == pytest.approx(69.325e-3, abs=1e-6)
    assert busy.fraction == pytest.approx(0.2546, abs=1e-4)
    assert busy.ops_per_step == 863 and busy.mean_op_s == pytest.approx(20.45e-6, abs=0.01e-6)
    phase_pass = json.loads((FIXTURE / "profile.json").read_text())["phases"]
    assert busy.busy_s / phase_pass["step_s"] == pytest.approx(0.4316, abs=1e-3)
    # every device op was launched in a labelled phase: forward and backward hold 15.9 of the 17.6 ms
    launched = busy.launched_s
    assert sum(launched.values()) == pytest.approx(busy.ops_per_step * busy.mean_op_s)
    assert launched["forward"] == pytest.approx(4.821e-3, abs=1e-6)
    assert launched["backward"] == pytest.approx(11.097e-3, abs=1e-6)
    assert launched["optimizer"] == pytest.approx(1.718e-3, abs=1e-6)
    assert launched["data"] == 0.0


def test_the_recorded_kernel_table_holds_kernels_only(h200):
    """Before, ``aten::mm`` (an operator's device time) sat beside the ``nvjet`` kernels it launched: the same
    time twice. The kernel table ranks device ops only, and its shares add up to what the device did."""
    rows = T.kernel_table(h200, top=10_000)
    assert not any(r.name.startswith(("aten::", "Optimizer.")) for r in rows)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert sum(r.per_step_s for r in rows) == pytest.approx(17.647e-3, abs=2e-6)  # one stream: sum = union
    top = rows[0]
    assert top.short.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_bprop")  # attention's backward
    assert top.calls == 24 and top.per_step_s == pytest.approx(1.454e-3, abs=1e-6)
    assert all(len(r.short) <= 64 for r in rows)
