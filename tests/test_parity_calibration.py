"""Parity that does not cry wolf: the loss tolerance calibrated on a harmless perturbation of the reference, the
answer "inconclusive" where a 10% learning-rate bug stays within it, and the LR warm-up that the reference and the
trial apply alike.

The end-to-end case is a loss spike on CPU: gpt:tiny's model at a constant learning rate of 0.06 (20x its own),
AdamW, no warm-up. There the old fixed tolerance (5e-2) would call a harmless jitter of the initial weights a
MISMATCH; the calibrated one lets it pass, and the 10% learning-rate bug still fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
from torch import nn

from bench import reference, workloads
from bench.loop import TrainLoop, lr_warmup_steps
from bench.plan.planner import ReferenceKey
from bench.records.results import PARITY_K_TOL, PARITY_TOLERANCES, parity_answer
from bench.reference import ReferenceResult, judge
from bench.trial import TrialSpec, run
from bench.workloads.base import forget, register
from bench.workloads.gpt_chars import GPTChars
from techniques import base as techniques_base
from techniques.base import Context, Kind, Technique, TrainConfig

CPU = torch.device("cpu")
OLD_NUMERIC_LOSS_TOL = 5e-2  # the fixed tolerance numeric sets had before calibration


# ---- the answer's arithmetic (fast) -----------------------------------------------------------------------------


def _ref(losses, harmless_losses, bug_losses, distances=(1.0, 2.0), harmless_d=None, bug_d=None,
         kind="numeric") -> ReferenceResult:
    """A reference whose calibration runs drift by what the test says (distances: the bug's by 10% unless given)."""
    distances = list(distances)
    run_of = {kind: {"losses": list(harmless_losses), "distances": list(harmless_d or distances)},
              reference.BUG: {"losses": list(bug_losses), "distances": list(bug_d or [d * 1.1 for d in distances])}}
    return ReferenceResult("k", list(losses), distances, 1, "t", 0.0, perturbed=run_of)


def test_a_quiet_start_keeps_the_fixed_floor_and_the_distance_check_decides():
    ref = _ref([2.0, 1.9], [2.0, 1.9 * (1 + 1e-6)], [2.0, 1.9 * 1.01])  # harmless 1e-6, bug 1e-2 on the loss
    result = judge("numeric", [2.0, 1.9 * 1.004], [1.0, 2.002], ref)
    assert result.loss_tolerance == PARITY_TOLERANCES["numeric"][0]  # 5 x 1e-6 is below the floor
    assert result.bug_loss_drift == pytest.approx(1e-2) and result.bug_distance_drift == pytest.approx(0.1)
    assert result.answer == "ok" and result.ok  # the loss check has no power here, the distance check has
    bug = judge("numeric", [2.0, 1.9 * 1.01], [1.0, 2.2], ref)
    assert bug.answer == "mismatch" and not bug.ok


def test_the_loss_tolerance_is_k_times_the_harmless_drift_above_the_floor():
    ref = _ref([4.0, 8.0], [4.0, 8.0 * 1.03], [4.0, 8.0 * 1.5])  # a spike: harmless drift 3e-2
    result = judge("numeric", [4.0, 8.0 * 1.1], [1.0, 2.0], ref)
    assert result.harmless_loss_drift == pytest.approx(0.03)
    assert result.loss_tolerance == pytest.approx(PARITY_K_TOL * 0.03) and result.k_tol == PARITY_K_TOL
    assert result.loss_rel_diff == pytest.approx(0.1) and result.loss_rel_diff > OLD_NUMERIC_LOSS_TOL  # the fixed
    # tolerance would have failed it
    assert result.answer == "ok"
    assert judge("numeric", [4.0, 8.0 * 1.2], [1.0, 2.0], ref).answer == "mismatch"  # 0.2 > 0.15, the bug's 0.5


def test_no_check_with_power_is_inconclusive_whatever_the_drift():
    # the bug moves neither trajectory beyond its tolerance: harmless and bug drifts overlap
    ref = _ref([4.0, 8.0], [4.0, 8.0 * 1.1], [4.0, 8.0 * 1.2], bug_d=[1.0, 2.02])
    assert judge("numeric", [4.0, 8.0], [1.0, 2.0], ref).answer == "inconclusive"  # even a perfect match
    assert judge("numeric", [4.0, 12.0], [1.0, 2.0], ref).answer == "inconclusive"  # and a large drift


def test_a_check_without_power_that_is_exceeded_leaves_the_answer_open():
    ref = _ref([4.0, 8.0], [4.0, 8.0 * 1.01], [4.0, 8.0 * 1.04])  # loss: tolerance 5e-2 (floor), the bug's 4e-2
    result = judge("numeric", [4.0, 8.0 * 1.08], [1.0, 2.0], ref)  # loss beyond it; distance fine
    assert result.answer == "inconclusive" and not result.ok


def test_exact_sets_keep_their_tight_floor_and_are_calibrated_on_an_ulp():
    ref = _ref([2.0, 1.9], [2.0, 1.9 * (1 + 1e-7)], [2.0, 1.9 * 1.01], kind="exact")
    result = judge("exact", [2.0, 1.9 * (1 + 2e-3)], [1.0, 2.0], ref)
    assert result.loss_tolerance == PARITY_TOLERANCES["exact"][0] == 1e-3
    assert result.answer == "mismatch" and "ulp" in result.harmless


def test_a_reference_without_calibration_runs_is_judged_with_the_fixed_tolerances_and_says_so():
    ref = ReferenceResult("k", [2.0, 1.9], [1.0, 2.0], 1, "t", 0.0)  # no ``perturbed`` (a test's or a user's)
    result = judge("numeric", [2.0, 1.9 * 1.06], [1.0, 2.0], ref)
    assert (result.loss_tolerance, result.distance_tolerance) == PARITY_TOLERANCES["numeric"]
    assert result.harmless is None and result.answer is None and result.verdict == "mismatch"


@pytest.mark.parametrize(("checks", "expected"), [
    ([(0.01, 0.05, 0.2), (0.001, 0.02, 0.1)], "ok"),
    ([(0.06, 0.05, 0.2), (0.001, 0.02, 0.1)], "mismatch"),
    ([(0.06, 0.05, 0.04), (0.03, 0.02, 0.1)], "mismatch"),  # the powered distance check decides
    ([(0.06, 0.05, 0.04), (0.001, 0.02, 0.1)], "inconclusive"),
    ([(0.0, 0.05, 0.04), (0.0, 0.02, 0.01)], "inconclusive"),
])
def test_parity_answer(checks, expected):
    assert parity_answer(checks) == expected


# ---- the LR warm-up ---------------------------------------------------------------------------------------------


def test_the_loop_warms_the_learning_rate_up_for_the_step_only():
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4)
    loop = TrainLoop(model, optimizer, lambda out, y: (out - y).sum(), [], Context(device=CPU), lr_warmup=4)
    seen = []
    for _ in range(6):
        before = model.weight.item()
        loop.step((torch.ones(1, 1), torch.zeros(1, 1)))  # d loss / d w = 1: each step moves w by -lr
        seen.append(round(before - model.weight.item(), 6))
        assert optimizer.param_groups[0]["lr"] == 0.4  # restored after every step
    assert seen == [0.1, 0.2, 0.3, 0.4, 0.4, 0.4]  # lr x (step + 1) / 4, then the LR itself


def test_only_the_gpu_sized_decoders_warm_up_and_a_changed_batch_warms_up_over_the_same_samples():
    sizes = {(name, size): p.get("lr_warmup_steps", 0) for name, cls in workloads.registry().items()
             for size, p in ((s, cls().size_params(s)) for s in cls.sizes)}
    # the same tokens each: 100 x 8, 25 x 32 and 50 x 16 sequences of 1024
    assert {k: v for k, v in sizes.items() if v} == {("gpt", "gpt2-124m"): 100, ("gpt", "gpt2-124m-b32"): 25,
                                                     ("llama", "180m"): 50}
    built = dataclasses.replace(workloads.get("mlp").build("tiny", 0, CPU), lr_warmup_steps=100)  # batch 64
    assert [lr_warmup_steps(built, b) for b in (64, 128, 32, 100)] == [100, 50, 200, 64]
    assert lr_warmup_steps(workloads.get("mlp").build("tiny", 0, CPU), 32) == 0


@contextlib.contextmanager
def gpt_size(name: str, **changes):
    """A gpt size of gpt:tiny's shape with ``changes``, for this test only."""
    GPTChars.sizes[name] = dataclasses.replace(GPTChars.sizes["tiny"], **changes)
    try:
        yield name
    finally:
        del GPTChars.sizes[name]


def _spec(workload: str, size: str, techniques: list[str], seed: int, cache, steps: int = 8) -> TrialSpec:
    budget = {"parity_steps": steps, "train_steps": steps, "eval_points": 1, "memory": False,
              "max_train_seconds": 60.0, "timeout_s": 120.0}
    return TrialSpec(sweep_id="t", trial_id=f"{workload}:{size}/{'+'.join(techniques) or 'baseline'}",
                     workload=workload, size=size, techniques=techniques, seed=seed, repeat=0, device="cpu",
                     budget=budget, mode="quality", reference_dir=str(cache))


def test_the_reference_and_the_trial_warm_up_alike(tmp_path):
    with gpt_size("warm", lr_warmup_steps=4):
        warm = reference.compute(ReferenceKey("gpt", "warm", 0, 16, 2), CPU)
        cold = reference.compute(ReferenceKey("gpt", "tiny", 0, 16, 2), CPU)
        assert warm.lr_warmup_steps == 4 and cold.lr_warmup_steps == 0
        # Adam's first update moves every weight by about the LR: a quarter of it in the first warm-up step
        assert warm.distances[0] / cold.distances[0] == pytest.approx(0.25, rel=1e-3)
        reference.save(tmp_path, warm)
        rec = run(_spec("gpt", "warm", [], 0, tmp_path, steps=2))
        assert rec.status == "ok", rec.reason
        assert rec.parity.answer == "ok" and rec.parity.distance_rel_diff < 1e-6  # the trial's loop warmed up too
        reference.save(tmp_path, dataclasses.replace(warm, lr_warmup_steps=0))  # a reference of another schedule
        stale = run(_spec("gpt", "warm", [], 0, tmp_path, steps=2))
        assert stale.status == "failed" and "warmed its LR up over 0 steps, this trial over 4" in stale.reason


# ---- a loss spike on CPU, end to end ----------------------------------------------------------------------------


class SpikyGPT(GPTChars):
    """gpt:tiny's model at a constant learning rate of 0.06 with no warm-up: its loss spikes within 8 steps."""

    name = "gpt_spiky"
    sizes = {"tiny": dataclasses.replace(GPTChars.sizes["tiny"], lr=0.06)}


class HarmlessJitter(Technique):
    """Numeric and harmless: the initial weights jittered at TF32's rounding unit, with another draw than the
    reference's calibration run."""

    name = "harmless_jitter"
    kind = Kind.NUMERIC
    own_flops = hides_tensors = False
    tune_options = ()

    def transform_model(self, model, ctx):
        reference.jitter(model, 2.0 ** -11, seed=2)
        return model


class LrBug(Technique):
    """Numeric, and wrong: the learning rate 10% higher."""

    name = "lr_bug_numeric"
    kind = Kind.NUMERIC
    own_flops = hides_tensors = False
    tune_options = ()

    def configure(self, cfg: TrainConfig) -> TrainConfig:
        return dataclasses.replace(cfg, lr=cfg.lr * 1.1)


@pytest.fixture
def spiky(tmp_path):
    register(SpikyGPT)
    for cls in (HarmlessJitter, LrBug):
        techniques_base.register(cls)
    try:
        yield tmp_path
    finally:
        forget(SpikyGPT.name)
        for cls in (HarmlessJitter, LrBug):
            techniques_base._REGISTRY.pop(cls.name, None)


def test_in_a_loss_spike_a_harmless_change_passes_and_a_learning_rate_bug_fails(spiky):
    seed = 3
    ref = reference.compute(ReferenceKey("gpt_spiky", "tiny", seed, 16, 8), CPU)
    reference.save(spiky, ref)
    jumps = [b / a for a, b in zip(ref.losses, ref.losses[1:], strict=False)]
    assert max(jumps) > 1.5  # the spike: a loss more than 1.5x the one before it

    harmless = run(_spec("gpt_spiky", "tiny", ["harmless_jitter"], seed, spiky))
    bug = run(_spec("gpt_spiky", "tiny", ["lr_bug_numeric"], seed, spiky))
    assert harmless.status == bug.status == "ok", (harmless.reason, bug.reason)
    h, b = harmless.parity, bug.parity
    assert h.harmless_loss_drift > OLD_NUMERIC_LOSS_TOL  # the reference's own jitter already drifts beyond it
    # the old fixed tolerance would have cried wolf: the harmless change drifts the loss beyond 5e-2 ...
    assert h.loss_rel_diff > OLD_NUMERIC_LOSS_TOL
    # ... and the calibrated tolerance lets it pass
    assert h.loss_rel_diff <= h.loss_tolerance == pytest.approx(PARITY_K_TOL * h.harmless_loss_drift)
    assert h.answer == "ok" and h.ok
    # the bug fails: its parameter distance moves by 10%, and that check keeps its power in the spike
    assert b.answer == "mismatch" and not b.ok
    assert b.distance_rel_diff == pytest.approx(0.1, abs=0.04) and b.distance_rel_diff > b.distance_tolerance
    assert b.bug_distance_drift > b.distance_tolerance
    # what the spike costs: the loss check alone cannot tell this bug from harmless drift (said, not hidden)
    assert b.loss_rel_diff <= b.loss_tolerance and b.bug_loss_drift <= b.loss_tolerance
    assert math.isclose(b.loss_rel_diff, b.bug_loss_drift, rel_tol=1e-5)  # the trial's bug is the reference's
