"""The runner: child processes, resume without redoing trials, timeouts and crashes as records."""

import torch

from bench.config import ConfigError, build_config
from bench.results import ResultStore
from bench.runner import SweepRunner
from tests.conftest import TINY_BUDGET

CPU = torch.device("cpu")


def config(**over):
    budget = {**TINY_BUDGET, "memory": False, **over.pop("budget", {})}
    return build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1, "budget": budget,
                                  **over})


def test_resume_skips_finished_trials_and_loses_none(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    first = SweepRunner(config(), out, CPU).run()
    assert [r.status for r in first] == ["ok"]
    assert (out / "env.json").exists() and (out / "sweep.toml").exists()

    launched = []
    real = SweepRunner._launch

    def counting(self, trial, env):
        launched.append(trial.trial_id)
        return real(self, trial, env)

    monkeypatch.setattr(SweepRunner, "_launch", counting)
    records = SweepRunner(config(repeats=2, techniques="baseline,grad_accum:steps=7"), out, CPU, resume=True).run()
    assert sorted(launched) == ["mlp:tiny/baseline/seed1/r1", "mlp:tiny/grad_accum:steps=7/seed0/r0",
                                "mlp:tiny/grad_accum:steps=7/seed1/r1"]
    assert len(records) == 4 and records[0] == first[0]
    # the references the plan needed were computed once, in their own process, and kept for the resume
    assert sorted(p.name for p in (out / "references").iterdir()) == [
        "mlp-tiny-seed0-b64-k4.json", "mlp-tiny-seed1-b64-k4.json"]
    failed = [r for r in records if r.technique_label == "grad_accum:steps=7"]
    assert all(r.status == "failed" and "not divisible" in r.reason for r in failed)


def test_existing_results_are_not_overwritten(tmp_path):
    out = tmp_path / "sweep"
    SweepRunner(config(), out, CPU).run()
    try:
        SweepRunner(config(), out, CPU).run()
    except ConfigError as exc:
        assert "pass --resume" in str(exc)
    else:
        raise AssertionError("a second sweep into the same directory must refuse")
    assert len(ResultStore(out / "results.jsonl").read()) == 1


def test_a_trial_past_its_timeout_is_killed_and_recorded(tmp_path):
    records = SweepRunner(config(budget={"timeout_s": 0.5, "max_train_seconds": 0.4}), tmp_path / "s", CPU).run()
    assert [r.status for r in records] == ["timeout"]
    assert "timeout_s=0.5" in records[0].reason
