"""One trial in-process: the record it produces, its throughput against an independent count, soft failures."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import trial as trial_mod
from bench import workloads
from bench.results import TrialRecord
from bench.trial import TrialSpec, run
from tests.conftest import TINY_BUDGET


def spec(workload="mlp", techniques=(), **budget) -> TrialSpec:
    return TrialSpec(sweep_id="t", trial_id=f"{workload}/{'+'.join(techniques) or 'baseline'}", workload=workload,
                     size="tiny", techniques=list(techniques), seed=0, repeat=0, device="cpu",
                     budget={**TINY_BUDGET, **budget}, peaks={"float32": 1e11, "bfloat16": 4e11})


def test_baseline_trial_record_is_complete():
    rec = run(spec(train_steps=12, eval_points=2))
    assert rec.status == "ok", rec.reason
    TrialRecord.from_dict(json.loads(rec.to_json()))  # valid, strict JSON
    t = rec.timing
    assert t["steps"] >= 4 and t["step_time_s"]["n"] == t["steps"]
    assert t["samples_per_s"] == pytest.approx(t["steps"] * rec.workload["batch_size"] / t["window_s"])
    assert t["first_step_s"] > 0 and 0 <= t["data_wait_frac"] < 1
    assert rec.compute["flops_per_step"] > 0
    assert rec.compute["mfu"] == pytest.approx(rec.compute["achieved_flops"] / 1e11)
    assert rec.memory["peak_rss_bytes"] > 100e6
    b = rec.memory["breakdown"]
    assert b["params"] == rec.workload["n_params"] * 4
    assert b["optimizer"] >= 2 * b["params"]
    acc = rec.accuracy
    measured = t["warmup_steps"] + t["steps"]  # training goes on to the budget, never below what was timed
    assert acc["steps_trained"] == max(12, measured) and [p[1] for p in acc["curve"]][0] == 0
    assert acc["curve"][-1][1] == acc["steps_trained"] and acc["final"] == acc["curve"][-1][3]
    assert rec.parity == {"kind": "exact", "reference": True}


def test_exact_technique_has_parity_numeric_is_judged_loosely():
    rec = run(spec(techniques=["grad_accum:steps=2"]))
    assert rec.status == "ok" and rec.parity["ok"] is True
    assert rec.parity["max_rel_loss_diff"] < 1e-4
    bf = run(spec(techniques=["bf16"]))
    assert bf.parity["kind"] == "numeric" and bf.parity["tolerance"] == 0.05
    assert bf.compute["compute_dtype"] == "bfloat16" and bf.compute["peak_flops"] == 4e11


def test_batchnorm_accumulation_mismatch_is_reported_with_its_reason():
    rec = run(spec("cnn", ["grad_accum:steps=4"], memory=False))
    assert rec.status == "ok"
    assert rec.parity["ok"] is False and "BatchNorm" in rec.parity["note"]


def test_a_failing_trial_becomes_a_record():
    rec = run(spec(techniques=["grad_accum:steps=7"]))
    assert rec.status == "failed"
    assert "not divisible by steps=7" in rec.reason


class CountingWorkload(workloads.Workload):
    """Wraps the MLP and counts, independently of the harness, the samples the trial draws and when."""

    name = "counting"
    sizes = {"tiny": {}}
    draws: list = []

    def build(self, size, seed, device):
        built = workloads.get("mlp").build(size, seed, device)
        inner = built.batches
        log = []
        CountingWorkload.draws.append(log)

        def batches(batch_size, seed):
            for x, y in inner(batch_size, seed):
                log.append((time.perf_counter(), len(x)))
                yield x, y

        return dataclasses.replace(built, batches=batches)


def test_throughput_matches_an_independent_count(monkeypatch):
    CountingWorkload.draws = []
    real_get = workloads.get
    monkeypatch.setattr(workloads, "get", lambda n: CountingWorkload() if n == "counting" else real_get(n))
    rec = run(spec("counting", min_steps=30, memory=False, warmup_steps=2))
    assert rec.status == "ok", rec.reason
    trial_draws = CountingWorkload.draws[0]  # the trial's model; later builds are the parity/FLOPs reference
    window = trial_draws[2:]  # after the two warm-up batches
    assert len(window) == rec.timing["steps"]
    samples = sum(n for _, n in window)
    # the window ends after the last step, so from the first draw to the last one misses exactly one step
    span = window[-1][0] - window[0][0]
    independent = samples / (span * len(window) / (len(window) - 1))
    assert rec.timing["samples_per_s"] == pytest.approx(independent, rel=0.25)


def test_spec_round_trips():
    s = spec(techniques=["bf16"])
    assert TrialSpec.from_json(s.to_json()) == s


def test_diverged_loss_is_recorded(monkeypatch):
    real = trial_mod.TrainLoop.step

    def poisoned(self, batch):
        return real(self, batch) * torch.tensor(float("nan"))

    monkeypatch.setattr(trial_mod.TrainLoop, "step", poisoned)
    rec = run(spec())
    assert rec.status == "diverged" and "nan" in rec.reason


def test_clean_rss_pass_runs_only_in_a_process_of_its_own(tmp_path):
    # In-process (as above) the pass is skipped: its malloc settings would outlive the trial in pytest's process.
    rec = run(spec(memory=True))
    assert "not in a trial process of its own" in rec.memory["clean_rss"]["skipped"]
    # As the runner starts it: python -m bench.trial SPEC RECORD.
    spec_path, record_path = tmp_path / "spec.json", tmp_path / "record.json"
    spec_path.write_text(spec(memory=True).to_json())
    subprocess.run([sys.executable, "-m", "bench.trial", str(spec_path), str(record_path)], check=True,
                   cwd=Path(__file__).parents[1], timeout=120)
    rec = TrialRecord.from_dict(json.loads(record_path.read_text()))
    assert rec.status == "ok", rec.reason
    clean = rec.memory["clean_rss"]
    assert clean["steps"] == trial_mod.CLEAN_RSS_STEPS and "M_MMAP_THRESHOLD" in clean["malloc"]
    assert 100e6 < clean["at_rest_bytes"] <= clean["peak_bytes"]  # import torch alone is ~220 MB
