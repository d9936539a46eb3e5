"""Where a step's time goes: the phase clock's arithmetic, labels that cover the step, the trial's phase pass, the
diagnosis of injected bottlenecks (a GPU left idle among them), and the report's table."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.analyze.bottleneck import BUSY_BOUND, SHORT_OP_S, diagnose
from bench.measure import phases as phases_mod
from bench.measure.phases import PHASES, PhaseClock, summarize_phases
from bench.records.results import PhaseResult, ResultStore, TrialRecord
from bench.report import build, markdown
from bench.trial import run
from techniques.base import Kind, Technique
from tests.helpers import build_loop
from tests.records import record
from tests.test_trial import registered, spec  # noqa: F401  (the fixture)

REPO = Path(__file__).resolve().parent.parent
H200_SWEEP = REPO / "reports" / "example-h200-first"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_regions_add_up_and_other_is_the_rest_of_the_step():
    fake = FakeClock()
    clock = PhaseClock("cpu", clock=fake)
    for data, fwd in ((0.010, 0.020), (0.030, 0.020)):
        with clock.step():
            with clock.region("data"):
                fake.t += data
            for _ in range(2):  # two micro-batches: one phase, summed
                with clock.region("forward"):
                    fake.t += fwd / 2
            fake.t += 0.005  # between regions: "other"
    assert clock.steps[0] == pytest.approx({"data": 0.010, "forward": 0.020, "other": 0.005, "step": 0.035})
    stats = summarize_phases(clock.steps)
    assert stats.steps == 2 and stats.step_s == pytest.approx(0.045)
    assert stats.mean_s["data"] == pytest.approx(0.020) and stats.mean_s["backward"] == 0.0
    assert stats.share["data"] == pytest.approx(0.040 / 0.090) and sum(stats.share.values()) == pytest.approx(1.0)
    assert stats.iqr_s["data"] == pytest.approx(0.010)  # numpy's linear interpolation over two values


def test_a_region_outside_a_step_is_an_error():
    with pytest.raises(RuntimeError, match="outside a step"), PhaseClock("cpu").region("data"):
        pass


def test_the_loop_labels_cover_the_step_and_match_a_plain_step():
    """On a tiny model the labelled regions hold almost all of a step (the rest is Python between them), and a
    step timed in phases takes what a plain step takes: steps alternate between the two, so the machine's drift
    cancels (a ratio in one process with generous bounds, not a time)."""
    torch.manual_seed(0)
    loop, batches, _ = build_loop("mlp", "baseline")
    for _ in range(3):
        loop.step(next(batches))
    clock, plain = PhaseClock("cpu"), []
    for _ in range(40):
        t0 = time.perf_counter()
        loop.step(next(batches))
        plain.append(time.perf_counter() - t0)
        loop.time_phases(clock)
        with clock.step():
            with clock.region("data"):
                batch = next(batches)
            loop.step(batch)
        loop.time_phases(None)
    stats = summarize_phases(clock.steps)
    assert stats.share["other"] < 0.3, stats.share  # the labels cover the step
    assert all(stats.median_s[p] > 0 for p in ("h2d", "forward", "backward", "optimizer"))
    phased = float(np.median([s["step"] - s["data"] for s in clock.steps]))
    assert 0.5 < phased / float(np.median(plain)) < 2.0
    assert len(clock.steps) == 40  # detached between rounds: the plain steps were not timed in phases


class SlowStep(Technique):
    """Exact, with a slow optimizer step (an injected bottleneck)."""

    name = "slow_step"
    kind = Kind.EXACT
    own_flops = hides_tensors = False
    tune_options = ()

    @dataclass(frozen=True)
    class Options:
        seconds: float = 0.05

    def optimizer_step(self, optimizer, ctx):
        time.sleep(self.options.seconds)
        optimizer.step()
        return True


def test_the_trial_records_its_phases_and_names_a_slow_optimizer(spec):  # noqa: F811
    base = run(spec(mode="speed"))
    with registered(SlowStep):
        slow = run(spec(techniques=["slow_step"], mode="speed"))
    assert base.status == slow.status == "ok", (base.reason, slow.reason)
    TrialRecord.from_dict(json.loads(slow.to_json()))
    for rec in (base, slow):
        ph = rec.phases
        assert ph.steps == 10 and sum(ph.share.values()) == pytest.approx(1.0) and set(ph.share) == set(PHASES)
    assert slow.phases.diagnosis.startswith("optimizer-bound")
    # the injected 50 ms sleep lands in the optimizer phase (AdamW alone is already a large part of the tiny MLP's
    # step on a CPU, so the baseline may be called optimizer-bound too: the time is the deterministic check)
    assert slow.phases.mean_s["optimizer"] - base.phases.mean_s["optimizer"] > 0.03


def test_slow_data_is_named_as_the_bottleneck():
    loop, batches, _ = build_loop("mlp", "baseline")

    def slow(source):
        for batch in source:
            time.sleep(0.1)
            yield batch

    clock = PhaseClock("cpu")
    loop.time_phases(clock)
    slow_batches = slow(batches)
    for _ in range(5):
        with clock.step():
            with clock.region("data"):
                batch = next(slow_batches)
            loop.step(batch)
    share = summarize_phases(clock.steps).share
    assert share["data"] > 0.3
    line = diagnose(share)
    assert line.startswith("input-bound") and "loader:workers=2" in line


@pytest.mark.parametrize(("share", "start", "hint"), [
    ({"data": 0.41, "forward": 0.3, "backward": 0.29}, "input-bound: 41%", "loader:workers=2"),
    ({"h2d": 0.2, "forward": 0.4, "backward": 0.4}, "copy-bound: 20%", "device"),
    ({"optimizer": 0.3, "forward": 0.3, "backward": 0.4}, "optimizer-bound: 30%", "fused_adamw"),
    ({"other": 0.4, "forward": 0.3, "backward": 0.3}, "overhead-bound: 40%", "compile"),
    ({"forward": 0.4, "backward": 0.5, "other": 0.1}, "compute-bound: 90%", "compile"),
])
def test_diagnosis_rules(share, start, hint):
    line = diagnose(share)
    assert line.startswith(start) and hint in line


def test_diagnosis_does_not_suggest_what_the_set_already_uses():
    assert "raise loader:workers" in diagnose({"data": 0.5}, ("loader",))
    assert "fused_adamw" not in diagnose({"optimizer": 0.5}, ("fused_adamw",))
    assert "pin_memory" in diagnose({"h2d": 0.5}, (), "cuda")
    assert "a longer period" in diagnose({"optimizer": 0.4, "forward": 0.3, "backward": 0.3}, ("local_sgd",))
    pipeline = diagnose({"forward": 0.9, "other": 0.1}, ("pp",))  # the schedule is one region, bubble included
    assert pipeline.startswith("pipeline: 90%") and "compile" not in pipeline and "bf16" not in pipeline


FAST_BF16 = {"float32": 1.5e11, "bfloat16": 8e11}
SLOW_BF16 = {"float32": 1.5e11, "bfloat16": 1.8e10}
_INPUT, _COMPUTE = "input-bound: 60% of the step waits for data; ", "compute-bound: 90% of the step is forward and backward; "


@pytest.mark.parametrize(("args", "line"), [
    (({"data": 0.6},), _INPUT + "try loader:workers=2 (a DataLoader with worker processes)"),
    (({"data": 0.6}, ("loader",)), _INPUT + "raise loader:workers, or make the per-sample transform cheaper"),
    (({"data": 0.6}, (), "cpu", None, {"input": "loader:workers=2 0.74x"}),
     _INPUT + "worker processes did not pay here (loader:workers=2 0.74x): cache the transformed batches or make the "
              "transform cheaper"),
    (({"h2d": 0.2},), "copy-bound: 20% of the step copies inputs to the device; keep the data on the device"),
    (({"h2d": 0.2}, (), "cuda"), "copy-bound: 20% of the step copies inputs to the device; try loader:pin_memory=true"),
    (({"optimizer": 0.3},), "optimizer-bound: 30% of the step is the optimizer; try fused_adamw"),
    (({"optimizer": 0.3}, ("fused_adamw",)), "optimizer-bound: 30% of the step is the optimizer; a ZeRO set spreads it "
                                             "over ranks"),
    (({"optimizer": 0.3}, ("local_sgd",)), "optimizer-bound: 30% of the step is the optimizer; local_sgd averages the "
                                           "parameters inside the optimizer step: a longer period averages less often"),
    (({"other": 0.4},), "overhead-bound: 40% of the step is outside the labelled phases; try compile (fewer Python and "
                        "kernel-launch costs)"),
    (({"other": 0.4}, ("compile",)), "overhead-bound: 40% of the step is outside the labelled phases; look at the "
                                     "trace's top operators"),
    (({"forward": 0.4, "backward": 0.5},), _COMPUTE + "try compile, or lower precision where its calibrated peak beats "
                                                      "fp32's"),
    (({"forward": 0.4, "backward": 0.5}, (), "cpu", FAST_BF16),
     _COMPUTE + "try bf16 (its calibrated peak beats fp32's here) or compile"),
    (({"forward": 0.4, "backward": 0.5}, (), "cpu", SLOW_BF16),
     _COMPUTE + "try compile (fuses small ops); not bf16: its calibrated peak is below fp32's on this machine"),
    (({"forward": 0.4, "backward": 0.5}, ("bf16",), "cpu", FAST_BF16), _COMPUTE + "try compile (fuses small ops)"),
    (({"forward": 0.4, "backward": 0.5}, ("bf16", "compile"), "cpu", FAST_BF16),
     _COMPUTE + "look at the trace's top operators"),
    (({"forward": 0.4, "backward": 0.5}, ("pp",)),
     "pipeline: 90% of the step is the pipeline schedule (stage compute, point-to-point sends and the bubble: see pp's "
     "measured bubble); more micro-batches shrink the bubble (pp:microbatches)"),
])
def test_each_diagnosis_line_in_the_techniques_words(args, line):
    """The lines read as they did when bench/analyze/bottleneck.py spelled them out; now each fix is a technique's remedy."""
    from techniques.base import Bottleneck

    if len(args) == 5:
        args = (*args[:4], {Bottleneck(k): v for k, v in args[4].items()})
    assert diagnose(*args) == line


def _with_phases(rec, share: dict[str, float], step_s: float, diagnosis: str = "x"):
    full = {p: share.get(p, 0.0) for p in PHASES}
    rec.phases = PhaseResult(steps=10, step_s=step_s, mean_s={p: v * step_s for p, v in full.items()},
                             median_s={p: v * step_s for p, v in full.items()}, iqr_s=dict.fromkeys(PHASES, 0.0),
                             share=full, diagnosis=diagnosis)
    return rec


def test_the_report_shows_each_sets_phases_and_bottleneck(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    for seed in range(3):
        store.append(_with_phases(record("baseline", seed, workload="cnn"),
                                  {"data": 0.5 + 0.01 * seed, "forward": 0.2, "backward": 0.25}, 0.010))
        store.append(_with_phases(record("loader", seed, workload="cnn"),
                                  {"data": 0.05, "forward": 0.4, "backward": 0.5}, 0.006))
    analysis, report = build([tmp_path])
    rows = analysis.configs.set_index("technique")
    assert rows.loc["baseline", "phase_data_share"] == pytest.approx(0.51)  # median over seeds
    assert rows.loc["baseline", "phase_diagnosis"].startswith("input-bound: 51%")
    assert rows.loc["loader", "phase_diagnosis"].startswith("compute-bound")
    text = markdown.render(report)
    assert "## Where the step's time goes" in text and "input-bound: 51% of the step waits for data" in text
    assert "phases" in report.figures and report.figures["phases"].png.startswith(b"\x89PNG")


def test_records_without_phases_leave_the_section_out(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    for seed in range(2):
        store.append(record("baseline", seed))
    _, report = build([tmp_path], with_figures=False)
    assert report.section("phases") is None and "Where the step's time goes" not in markdown.render(report)


def test_the_reports_diagnosis_knows_the_sweeps_loader_and_the_machines_peaks(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    for seed in range(3):
        store.append(_with_phases(record("baseline", seed, workload="cnn", sps=100),
                                  {"data": 0.6, "forward": 0.2, "backward": 0.2}, 0.010))
        store.append(_with_phases(record("loader:workers=2", seed, workload="cnn", sps=74 + seed),
                                  {"data": 0.1, "forward": 0.4, "backward": 0.5}, 0.014))
    (tmp_path / "env.json").write_text(json.dumps({"peak_flops": {"float32": {"flops": 1.5e11},
                                                                  "bfloat16": {"flops": 1.8e10}}}))
    analysis, _ = build([tmp_path], with_figures=False)
    rows = analysis.configs.set_index("technique")
    base = rows.loc["baseline", "phase_diagnosis"]
    assert base.startswith("input-bound: 60%") and "did not pay here (loader:workers=2 0.75x" in base
    assert "try loader" not in base
    loader = rows.loc["loader:workers=2", "phase_diagnosis"]
    assert loader.startswith("compute-bound") and "not bf16" in loader


# ---- a GPU left idle -----------------------------------------------------------------------------------------

_GPU_STEP = {"data": 0.08, "h2d": 0.01, "forward": 0.29, "backward": 0.48, "optimizer": 0.12, "other": 0.02}


@pytest.mark.parametrize(("busy", "op_s", "start"), [
    (0.43, 20e-6, "launch-bound: the GPU is busy 43% of the step, its kernels average 20 us"),
    (0.43, 400e-6, "host-bound: the GPU is busy 43% of the step, its kernels average 400 us, not short"),
    (0.43, None, "host- or launch-bound: the GPU is busy 43% of the step"),
    (0.79, SHORT_OP_S, "host-bound: the GPU is busy 79%"),  # the thresholds: busy < 80%, ops < 50 us
    (BUSY_BOUND, 20e-6, "compute-bound: the GPU is busy 80% of the step, forward and backward 77%"),
])
def test_a_gpu_busy_less_than_four_fifths_of_the_step_is_host_or_launch_bound(busy, op_s, start):
    line = diagnose(_GPU_STEP, ("bf16",), "cuda", busy=busy, op_s=op_s)
    assert line.startswith(start), line
    if not start.startswith("compute-bound"):
        assert "a larger batch" in line and "compile:mode=reduce-overhead" in line


def test_the_idle_gpu_advice_follows_the_set():
    launch = diagnose(_GPU_STEP, ("bf16",), "cuda", busy=0.3, op_s=10e-6)
    assert "fused_adamw (one kernel for the optimizer's update" in launch
    host = diagnose(_GPU_STEP, ("bf16",), "cuda", busy=0.3, op_s=1e-3)
    assert "fused_adamw" not in host  # a fused optimizer saves launches, not the host's other work
    held = diagnose(_GPU_STEP, ("bf16", "compile", "fused_adamw"), "cuda", busy=0.3, op_s=10e-6)
    assert held.endswith("try a larger batch (more work per kernel and per host step); compile:mode=reduce-overhead "
                         "where compile runs another mode (CUDA graphs replay the step's kernels with one launch)")
    # a data wait is still named first: its fix is cheaper, and it is one reason the device waits
    assert diagnose({**_GPU_STEP, "data": 0.3}, (), "cuda", busy=0.3, op_s=10e-6).startswith("input-bound")


def test_a_gpu_step_without_busy_data_is_not_called_compute_bound():
    """Host-side phase times on a GPU hold launch and wait alike: without the device's busy time the line says
    what it knows and what it does not."""
    line = diagnose(_GPU_STEP, ("bf16",), "cuda")
    assert line.startswith("forward and backward take 77% of the step (host-side phase shares; device busy "
                           "unknown: python -m bench profile measures it); try compile"), line
    assert "compute-bound" not in line
    assert diagnose(_GPU_STEP, ("bf16",), "cpu").startswith("compute-bound: 77%")  # the CPU is synchronous


def test_the_recorded_h200_sweep_makes_no_compute_bound_claim_without_busy_data():
    """The first H200 sweep's phase passes measured no device-busy time: its report called every set
    compute-bound, bf16 (31 ms steps, 17% of the datasheet peak) and eager fp8 (181 ms) alike. Rendered again,
    no set is called compute-bound and each line says the device's busy time is unknown."""
    records = [TrialRecord.from_dict(json.loads(line)) for line in (H200_SWEEP / "results.jsonl").open()]
    assert all(r.phases.device_busy is None for r in records if r.phases)  # old records load, busy unknown
    analysis, _ = build([H200_SWEEP], with_figures=False)
    rows = analysis.configs.set_index("technique")
    assert {"bf16", "bf16+fp8", "bf16+compile", "tf32", "baseline"} <= set(rows.index)
    for technique, line in rows["phase_diagnosis"].items():
        assert "compute-bound" not in line and "device busy unknown" in line, (technique, line)
    assert rows.loc["bf16+fp8", "phase_diagnosis"].startswith("forward and backward take 9")


def test_the_report_reads_the_trials_busy_fraction(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    for seed in range(3):
        rec = _with_phases(record("baseline", seed, workload="gpt"), _GPU_STEP, 0.04)
        rec.device = "cuda"
        rec.phases = dataclasses.replace(rec.phases, device_busy=0.40 + 0.01 * seed, device_op_s=20e-6)
        store.append(rec)
    analysis, _ = build([tmp_path], with_figures=False)
    row = analysis.configs.set_index("technique").loc["baseline"]
    assert row["phase_device_busy"] == pytest.approx(0.41)  # the median over seeds
    assert row["phase_diagnosis"].startswith("launch-bound: the GPU is busy 41% of the step")
    found = [f.text for f in analysis.findings if f.topic == "bottleneck"]  # "What to try next" says it too
    assert any("is launch-bound: the GPU is busy 41%" in text for text in found), found


def test_the_device_busy_pass_claims_nothing_where_it_cannot_trace_the_device(caplog):
    """This CPU build of torch has no CUDA activity to trace: the pass says so and runs no step, never "idle"."""
    calls = []
    with caplog.at_level("WARNING", logger="bench.measure.phases"):
        busy, why = phases_mod.device_busy_pass(lambda: calls.append(1), torch.device("cpu"), steps=3)
    assert busy is None and "cannot trace CUDA activity" in why
    assert calls == [] and "device busy not measured" in caplog.text


def test_the_device_busy_pass_claims_nothing_when_the_profiler_saw_no_device_op(monkeypatch, caplog):
    """A profiler that traced no kernel (CUPTI missing them) gives no figure rather than a busy time of 0."""

    class Blind:
        def __init__(self, activities, schedule, on_trace_ready):
            self.ready, self.steps = on_trace_ready, 0

        def start(self):
            pass

        def step(self):
            self.steps += 1

        def stop(self):
            self.ready(self)

        def export_chrome_trace(self, path):
            Path(path).write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                                                               "ts": 0, "dur": 5}]}))

    monkeypatch.setattr(torch.profiler, "profile", Blind)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    calls = []
    with caplog.at_level("WARNING", logger="bench.measure.phases"):
        busy, why = phases_mod.device_busy_pass(lambda: calls.append(1), torch.device("cpu"), steps=3)
    assert busy is None and why == "the profiler traced no kernel on cpu"
    assert calls == [1, 1, 1, 1] and "traced no kernel" in caplog.text  # the profiler's warm-up step, then 3


@pytest.mark.gpu
def test_the_device_busy_pass_tells_an_idle_gpu_from_a_busy_one():
    """Not yet run on a GPU. The same kernels, with the host sleeping between them or not: wide bounds on the
    busy fraction (a ratio, not a time)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)

    def busy_step():
        for _ in range(8):
            a @ a

    def idle_step():
        busy_step()
        torch.cuda.synchronize(device)
        time.sleep(0.05)  # the host works while the device waits

    busy_step()
    busy, _ = phases_mod.device_busy_pass(busy_step, device)
    idle, _ = phases_mod.device_busy_pass(idle_step, device)
    assert busy is not None and idle is not None
    assert busy.fraction > 0.8 and idle.fraction < 0.5 and busy.ops_per_step >= 8
    assert busy.mean_op_s > SHORT_OP_S  # 4096^3 bf16 products: long kernels


@pytest.mark.gpu
def test_a_cuda_trial_records_its_device_busy_time(spec):  # noqa: F811
    """Not yet run on a GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    rec = run(dataclasses.replace(spec(mode="speed"), device="cuda"))
    assert rec.status == "ok", rec.reason
    ph = rec.phases
    assert 0.0 < ph.device_busy <= 1.0 and ph.device_ops_per_step > 0 and ph.device_op_s > 0
    assert not ph.diagnosis.startswith("forward and backward take")


def test_a_cpu_trial_records_no_device_busy_time(spec):  # noqa: F811
    rec = run(spec(mode="speed"))
    assert rec.status == "ok" and rec.phases.device_busy is None and rec.phases.device_source is None
