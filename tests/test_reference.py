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
