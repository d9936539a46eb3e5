"""The eager fp32 reference: computed in its own process, cached by key, and what its trajectories measure."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from bench import reference
from bench.plan.planner import ReferenceKey
from bench.reference import Trajectory
from bench.trial import TrialSpec, run
from tests.conftest import TINY_BUDGET

KEY = ReferenceKey("mlp", "tiny", 0, 64, 3)


def test_the_child_process_computes_what_this_process_would_and_caches_it(tmp_path):
    reference.ensure([KEY], tmp_path, "cpu")
    cached = reference.load(tmp_path, KEY)
    assert reference.path_of(tmp_path, KEY).name == "mlp-tiny-seed0-b64-k3.json"
    here = reference.compute(KEY, torch.device("cpu"))
    assert cached.losses == pytest.approx(here.losses, rel=1e-6)
    assert cached.distances == pytest.approx(here.distances, rel=1e-6)
    assert cached.flops_per_step == here.flops_per_step > 0 and cached.dataset == here.dataset
    assert len(cached.losses) == 3 and cached.distances[0] < cached.distances[1] < cached.distances[2]
    mtime = reference.path_of(tmp_path, KEY).stat().st_mtime_ns
    reference.ensure([KEY], tmp_path, "cpu")  # cached: nothing recomputed
    assert reference.path_of(tmp_path, KEY).stat().st_mtime_ns == mtime


def test_adam_moves_every_weight_by_about_the_learning_rate_in_its_first_step():
    # why the distance trajectory catches a learning-rate bug: d_1 = lr * sqrt(n) for sign-like Adam updates
    result = reference.compute(dataclasses.replace(KEY, steps=1), torch.device("cpu"))
    n_params = 144_650
    assert result.distances[0] == pytest.approx(2e-3 * math.sqrt(n_params), rel=0.05)  # 0.744 vs 0.761: a few
    # weights get (near-)zero gradients


def test_trajectory_is_the_distance_from_the_initial_weights():
    model = nn.Linear(3, 2)
    trajectory = Trajectory(model)
    assert trajectory.distance() == 0.0
    with torch.no_grad():
        model.weight.add_(1.0)
    assert trajectory.distance() == pytest.approx(math.sqrt(6))


def test_a_reference_of_other_data_is_refused(tmp_path):
    budget = {**TINY_BUDGET, "parity_steps": 3, "train_steps": 5, "eval_points": 1}
    spec = TrialSpec(sweep_id="t", trial_id="x", workload="mlp", size="tiny", techniques=[], seed=0, repeat=0,
                     device="cpu", budget=budget, mode="quality", reference_dir=str(tmp_path))
    assert run(spec).status == "ok"
    path = reference.path_of(tmp_path, KEY)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "dataset": "0" * 64}))
    rec = run(spec)
    assert rec.status == "failed" and "was computed on other data" in rec.reason and "delete it" in rec.reason


def test_the_reference_records_its_calibration_runs(tmp_path):
    ref = reference.compute(KEY, torch.device("cpu"))
    assert ref.format == reference.FORMAT and set(ref.perturbed) == {"exact", "numeric", reference.BUG}
    assert all(len(r["losses"]) == len(r["distances"]) == 3 for r in ref.perturbed.values())
    # the bug's first update moves every weight by 1.1x the reference's (Adam's step follows the learning rate)
    assert ref.perturbed[reference.BUG]["distances"][0] / ref.distances[0] == pytest.approx(1.1, rel=1e-3)
    # an ulp moves a calm start by about an ulp; TF32's rounding unit by more, still far below the bug
    ulp = reference.rel_drift(ref.perturbed["exact"]["losses"], ref.losses)
    tf32 = reference.rel_drift(ref.perturbed["numeric"]["losses"], ref.losses)
    bug = reference.rel_drift(ref.perturbed[reference.BUG]["losses"], ref.losses)
    assert ulp < 1e-5 and ulp < tf32 < bug / 10
    assert reference.load(reference.save(tmp_path, ref).parent, KEY) == ref


def test_a_cache_file_of_the_old_format_is_computed_again_never_misread(tmp_path):
    path = reference.path_of(tmp_path, KEY)
    path.write_text(json.dumps({"key": KEY.name, "losses": [9.0] * 3, "distances": [9.0] * 3, "flops_per_step": 1,
                                "torch": "x", "seconds": 0.0, "dataset": None}))  # format 1: no calibration
    assert reference.load(tmp_path, KEY) is None
    reference.ensure([KEY], tmp_path, "cpu")
    again = reference.load(tmp_path, KEY)
    assert again is not None and again.losses[0] != 9.0 and again.perturbed


def test_jitter_changes_each_weight_by_at_most_its_scale_and_is_seeded():
    model = nn.Linear(64, 64)
    before = [p.detach().clone() for p in model.parameters()]
    reference.jitter(model, 2.0 ** -11, seed=7)
    ratios = torch.cat([(p.detach() / b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    assert float((ratios - 1).abs().max()) <= 2.0 ** -11 * (1 + 1e-3) and float((ratios - 1).abs().max()) > 2.0 ** -12
    again = nn.Linear(64, 64)
    again.load_state_dict({k: v for k, v in zip(model.state_dict(), before, strict=True)})
    reference.jitter(again, 2.0 ** -11, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters(), strict=True))
