"""One trial in-process: its typed stages, the two budgets that never mix, parity that can fail, soft failures."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from bench import trial as trial_mod
from bench import workloads
from bench.records.results import TrialRecord
from bench.trial import TrialSpec, run
from techniques import base as techniques_base
from techniques.base import Kind, Technique, TrainConfig
from tests.conftest import TINY_BUDGET


@pytest.fixture
def spec(reference_dir):
    def make(workload="mlp", techniques=(), seed=0, mode="both", **budget) -> TrialSpec:
        return TrialSpec(sweep_id="t", trial_id=f"{workload}/{'+'.join(techniques) or 'baseline'}",
                         workload=workload, size="tiny", techniques=list(techniques), seed=seed, repeat=0,
                         device="cpu", budget={**TINY_BUDGET, **budget}, peaks={"float32": 1e11, "bfloat16": 4e11},
                         peak_source="test", mode=mode, reference_dir=str(reference_dir))
    return make


@contextlib.contextmanager
def registered(*classes: type[Technique]):
    """Test-only techniques, registered for the duration of a test and removed after (the registry test checks
    that every technique registered for real has test settings)."""
    for cls in classes:
        techniques_base.register(cls)
    try:
        yield
    finally:
        for cls in classes:
            techniques_base._REGISTRY.pop(cls.name, None)


class Sleepy(Technique):
    """Exact and slow: the same math as the baseline, with a sleep in every loss computation."""

    name = "sleepy"
    kind = Kind.EXACT
    own_flops = hides_tensors = False
    tune_options = ()

    @dataclass(frozen=True)
    class Options:
        seconds: float = 0.01

    def loss(self, out, batch, base_loss, ctx):
        time.sleep(self.options.seconds)
        return base_loss


class LrBug(Technique):
    """Claims to be exact but trains with a 10% larger learning rate: parity must catch it."""

    name = "lr_bug"
    kind = Kind.EXACT
    own_flops = hides_tensors = False
    tune_options = ()

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        return dataclasses.replace(cfg, lr=cfg.lr * 1.1)


def test_baseline_record_has_every_stage(spec):
    rec = run(spec(memory=True))
    assert rec.status == "ok", rec.reason
    TrialRecord.from_dict(json.loads(rec.to_json()))  # valid, strict JSON
    b, s, q = rec.build, rec.speed, rec.quality
    assert b.batch_size == 64 and b.micro_batches == 1 and b.first_step_s > 0 and b.one_off_s >= 0
    assert s.steps >= 4 and s.step_time_s.n == s.steps
    assert s.samples_per_s == pytest.approx(s.steps * 64 / s.window_s)
    # MFU on the window's own clock: FLOPs x steps / window seconds / peak
    assert s.achieved_flops == pytest.approx(s.flops_per_step * s.steps / s.window_s)
    assert s.mfu == pytest.approx(s.achieved_flops / 1e11) and s.peak_source == "test"
    assert q.budget_samples == 20 * 64 and q.steps_trained == 20 and q.samples_trained == 1280
    assert [p[1] for p in q.curve] == [0, 5, 10, 15, 20] and [p[0] for p in q.curve] == [0, 320, 640, 960, 1280]
    assert q.final == q.curve[-1][-1] and q.cut is None and q.train_time_s == q.curve[-1][2]
    assert rec.parity.ok and rec.parity.kind == "exact" and rec.parity.steps == 4
    assert rec.parity.loss_rel_diff < 1e-6 and rec.parity.distance_rel_diff < 1e-6  # the reference's own math
    assert rec.memory.breakdown["params"] == b.n_params * 4


def test_quality_never_depends_on_speed_an_exact_set_three_times_slower(spec):
    """The same samples, the same curve bit for bit, the same steps-to-target; only the clock differs."""
    base = run(spec(mode="quality"))
    with registered(Sleepy):
        slow = run(spec(techniques=["sleepy:seconds=0.008"], mode="quality"))
    assert base.status == slow.status == "ok", (base.reason, slow.reason)
    assert [p[-1] for p in slow.quality.curve] == [p[-1] for p in base.quality.curve]  # bit-identical metrics
    assert [p[3] for p in slow.quality.curve] == [p[3] for p in base.quality.curve]  # and training losses
    assert slow.quality.final == base.quality.final
    assert slow.quality.samples_trained == base.quality.samples_trained
    ratio = slow.quality.train_time_s / base.quality.train_time_s
    per_step = (slow.quality.train_time_s / 20) / (base.quality.train_time_s / 20)
    assert ratio > 2.0 and ratio == pytest.approx(per_step)  # the clock follows the step time, nothing else


def test_time_to_target_follows_the_step_time_and_steps_to_target_do_not(spec, monkeypatch):
    real_build = workloads.get("mlp").__class__.build

    def with_target(self, size, seed, device):  # a target the tiny budget reaches half-way
        built = real_build(self, size, seed, device)
        return dataclasses.replace(built, target=0.2)

    monkeypatch.setattr(workloads.get("mlp").__class__, "build", with_target)
    base = run(spec(mode="quality"))
    with registered(Sleepy):
        slow = run(spec(techniques=["sleepy:seconds=0.008"], mode="quality"))
    assert base.quality.steps_to_target == slow.quality.steps_to_target is not None
    assert base.quality.samples_to_target == slow.quality.samples_to_target
    expected = slow.quality.train_time_s / base.quality.train_time_s
    assert slow.quality.time_to_target_s / base.quality.time_to_target_s == pytest.approx(expected, rel=0.5)
    assert slow.quality.time_to_target_with_one_off_s == pytest.approx(
        slow.quality.time_to_target_s + slow.build.one_off_s)


@pytest.mark.parametrize("workload", ["mlp", "gpt"])
@pytest.mark.parametrize("label", ["checkpointing", "grad_accum:steps=2"])
def test_exact_techniques_reproduce_the_baseline_eval_curve(spec, workload, label):
    base = run(spec(workload, mode="quality"))
    rec = run(spec(workload, [label], mode="quality"))
    assert rec.status == "ok", rec.reason
    for mine, theirs in zip(rec.quality.curve, base.quality.curve, strict=True):
        assert mine[0] == theirs[0]  # equal samples
        assert mine[-1] == pytest.approx(theirs[-1], rel=1e-4, abs=2e-3)  # one flipped eval sample at most
    assert rec.parity.ok


def test_a_ten_percent_learning_rate_change_fails_parity(spec):
    with registered(LrBug):
        rec = run(spec(techniques=["lr_bug"], mode="speed", memory=False))
    assert rec.status == "ok" and rec.parity.ok is False and rec.parity.answer == "mismatch"
    assert rec.parity.distance_rel_diff == pytest.approx(0.1, abs=0.02)  # d_t moves with the learning rate
    # the reference's own bug run drifts as this trial does: the check has power
    assert rec.parity.bug_distance_drift == pytest.approx(rec.parity.distance_rel_diff, rel=1e-6)
    baseline = run(spec(mode="speed", memory=False))
    assert baseline.parity.ok and baseline.parity.answer == "ok" and baseline.parity.distance_rel_diff < 1e-6


def test_numeric_sets_are_judged_with_looser_tolerances(spec):
    rec = run(spec("gpt", ["bf16"], mode="speed", memory=False))
    assert rec.status == "ok" and rec.kind == "numeric" and rec.parity.kind == "numeric"
    # a calm start: the calibrated tolerances stay at their floors (5 x a TF32-sized jitter's drift is below them)
    assert (rec.parity.loss_tolerance, rec.parity.distance_tolerance) == (5e-2, 2e-2) and rec.parity.ok
    assert 0 < rec.parity.harmless_loss_drift < 1e-2 and rec.parity.k_tol == 5.0 and "TF32" in rec.parity.harmless
    assert rec.parity.answer == "ok"  # the distance check has power: the bug moves d_t by 10%
    assert rec.speed.compute_dtype == "bfloat16" and rec.speed.peak_flops == 4e11


def test_batchnorm_accumulation_mismatch_is_reported_with_its_reason(spec):
    rec = run(spec("cnn", ["grad_accum:steps=4"], mode="speed", memory=False))
    assert rec.status == "ok"
    assert rec.parity.ok is False and "BatchNorm" in rec.parity.note


def test_modes_run_only_their_stages(spec):
    speed = run(spec(mode="speed", memory=False))
    assert speed.quality is None and speed.speed is not None and speed.mode == "speed"
    quality = run(spec(mode="quality"))
    assert quality.speed is None and quality.memory is None and quality.quality is not None
    assert quality.build.one_off_s is not None and quality.parity.ok


def test_the_safety_cap_marks_a_cut_run(spec):
    rec = run(spec(mode="quality", max_train_seconds=0.0))
    assert rec.status == "ok" and rec.quality.cut.startswith("stopped at step 5 of 20")
    assert rec.quality.final is None and rec.quality.steps_trained == 5


def test_a_failing_trial_becomes_a_record(spec):
    rec = run(spec(techniques=["grad_accum:steps=7"]))
    assert rec.status == "failed"
    assert "not divisible by steps=7" in rec.reason and "Traceback" in rec.error


class CountingWorkload(workloads.Workload):
    """Wraps the MLP and counts, independently of the harness, the samples the trial draws and when."""

    name = "counting"
    sizes = {"tiny": workloads.base.Size()}
    draws: list = []

    def build(self, size, seed, device):
        built = workloads.get("mlp").build("tiny", seed, device)
        inner = built.batches
        log = []
        CountingWorkload.draws.append(log)

        def batches(batch_size, seed):
            for x, y in inner(batch_size, seed):
                log.append((time.perf_counter(), len(x)))
                yield x, y

        return dataclasses.replace(built, batches=batches)


def test_throughput_matches_an_independent_count(spec, monkeypatch):
    CountingWorkload.draws = []
    real_get = workloads.get
    monkeypatch.setattr(workloads, "get", lambda n: CountingWorkload() if n == "counting" else real_get(n))
    monkeypatch.setattr(trial_mod, "reference", lambda session: trial_mod.reference_mod.ReferenceResult(
        "x", [1.0] * 4, [1.0] * 4, 1000, "t", 0.0))
    # no contention retry: a window measured again would draw more batches than the record counts
    rec = run(spec("counting", min_steps=30, memory=False, warmup_steps=4, mode="speed", contention_retries=0))
    assert rec.status == "ok", rec.reason
    draws = CountingWorkload.draws[0]
    window = draws[4:4 + rec.speed.steps]  # after the four warm-up batches; the phase pass's batches follow
    assert len(draws) == 4 + rec.speed.steps + trial_mod.PHASE_STEPS
    samples = sum(n for _, n in window)
    # the window ends after the last step, so from the first draw to the last one misses exactly one step
    span = window[-1][0] - window[0][0]
    independent = samples / (span * len(window) / (len(window) - 1))
    assert rec.speed.samples_per_s == pytest.approx(independent, rel=0.25)


def test_spec_round_trips():
    s = TrialSpec(sweep_id="t", trial_id="x", workload="mlp", size="tiny", techniques=["bf16"], seed=0, repeat=0,
                  device="cpu", budget=TINY_BUDGET)
    assert TrialSpec.from_json(s.to_json()) == s


def test_diverged_loss_is_recorded(spec, monkeypatch):
    real = trial_mod.TrainLoop.step

    def poisoned(self, batch):
        return real(self, batch) * torch.tensor(float("nan"))

    monkeypatch.setattr(trial_mod.TrainLoop, "step", poisoned)
    rec = run(spec())
    assert rec.status == "diverged" and "nan" in rec.reason


def test_clean_rss_pass_runs_only_in_a_process_of_its_own(spec, tmp_path):
    # In-process the pass is skipped: its malloc settings would outlive the trial in pytest's process.
    rec = run(spec(mode="speed", memory=True))
    assert "not in a trial process of its own" in rec.memory.clean_rss["skipped"]
    # As the runner starts it: python -m bench.trial SPEC RECORD.
    spec_path, record_path = tmp_path / "spec.json", tmp_path / "record.json"
    spec_path.write_text(spec(mode="speed", memory=True).to_json())
    subprocess.run([sys.executable, "-m", "bench.trial", str(spec_path), str(record_path)], check=True,
                   cwd=Path(__file__).parents[1], timeout=120)
    rec = TrialRecord.from_dict(json.loads(record_path.read_text()))
    assert rec.status == "ok", rec.reason
    clean = rec.memory.clean_rss
    assert clean["steps"] == trial_mod.CLEAN_RSS_STEPS and "M_MMAP_THRESHOLD" in clean["malloc"]
    assert 100e6 < clean["at_rest_bytes"] <= clean["peak_bytes"]  # import torch alone is ~220 MB


class StopAtSecondEval(Technique):
    """An algorithmic set whose on_eval hook asks to stop: the early-stopping contract."""

    name = "stop_early"
    kind = Kind.ALGORITHMIC
    own_flops = hides_tensors = False
    tune_options = ()

    def on_eval(self, metrics, ctx):
        ctx.state["evals"] = ctx.state.get("evals", 0) + 1
        return ctx.state["evals"] == 2


def test_a_technique_can_end_the_quality_run_through_on_eval(spec):
    with registered(StopAtSecondEval):
        rec = run(spec(techniques=["stop_early"], mode="quality"))
    assert rec.status == "ok" and rec.kind == "algorithmic" and rec.parity is None
    q = rec.quality
    assert q.stopped_by == "stop_early stopped the run at step 10 of 20" and q.cut is None
    assert q.steps_trained == 10 and q.final == q.curve[-1][-1] and len(q.curve) == 3


def test_a_target_met_before_training_counts_at_the_first_evaluation_after_it(spec, monkeypatch):
    real_build = workloads.get("mlp").__class__.build
    monkeypatch.setattr(workloads.get("mlp").__class__, "build",
                        lambda self, size, seed, device: dataclasses.replace(real_build(self, size, seed, device),
                                                                             target=0.0))
    q = run(spec(mode="quality")).quality
    assert q.samples_to_target == 320 and q.time_to_target_s > 0  # never 0 s: a ratio of times needs both > 0


_SPINNER = """
import os, sys, time
if os.fork():
    os._exit(0)  # the spinner is reparented: not a descendant of the trial, so it counts as another process
started, stop = sys.argv[1], sys.argv[2]
with open(started, "w") as fh:
    fh.write(str(os.getpid()))
t = time.time()
while not os.path.exists(stop) and time.time() - t < 60:
    sum(range(10000))
"""


def test_a_contended_window_is_measured_again_and_the_retry_recorded(spec, tmp_path, monkeypatch):
    started, stop = tmp_path / "started", tmp_path / "stop"
    subprocess.run([sys.executable, "-c", _SPINNER, str(started), str(stop)], check=True)
    while not started.exists() or not started.read_text():
        time.sleep(0.05)
    spinner = int(started.read_text())
    real = trial_mod._timed_window
    windows = []

    def first_window_contended(session, planned):
        result = real(session, planned)
        windows.append(result[2].fraction)
        stop.touch()  # the other process ends after the first window
        while psutil.pid_exists(spinner):
            time.sleep(0.05)
        return result

    monkeypatch.setattr(trial_mod, "_timed_window", first_window_contended)
    monkeypatch.setattr(trial_mod, "CONTENTION_PAUSE_S", 0.1)
    try:
        rec = run(spec(mode="speed", min_seconds=0.3, contention_retries=2))
    finally:
        stop.touch()
    assert rec.status == "ok", rec.reason
    assert windows[0] > trial_mod.CONTENTION_WARN  # the busy process took its share of the cores
    assert rec.speed.contention_retries[0] == pytest.approx(windows[0], abs=1e-4)
    assert len(windows) == len(rec.speed.contention_retries) + 1 <= 3
    assert rec.speed.contended == (windows[-1] > trial_mod.CONTENTION_WARN)


def test_the_timed_window_runs_with_the_cyclic_garbage_collector_off():
    import gc
    import types

    import torch

    from bench.plan.config import Budget
    from bench.trial import _timed_window

    seen = []

    class Loop:
        def step(self, batch):
            seen.append(gc.isenabled())
            return torch.tensor(0.0)

    session = types.SimpleNamespace(budget=Budget(min_steps=3, min_seconds=0.0, max_seconds=5.0),
                                    device=torch.device("cpu"), batches=iter(range(100)), loop=Loop(),
                                    spec=types.SimpleNamespace(world_size=1))
    assert gc.isenabled()
    _, _, _, _, steps = _timed_window(session, None)
    assert steps == 3 and seen == [False] * 3 and gc.isenabled()  # off inside, back on after
