"""The runner: child processes, resume without redoing trials, timeouts and crashes as records."""

import shutil

import pytest
import torch

from bench.plan.config import ConfigError, build_config
from bench.records.results import ResultStore
from bench.run.launcher import TrialLauncher
from bench.run.runner import SweepRunner
from tests.conftest import TINY_BUDGET

CPU = torch.device("cpu")


def config(**over):
    budget = {**TINY_BUDGET, "memory": False, **over.pop("budget", {})}
    return build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1, "budget": budget,
                                  **over})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished one-trial sweep; each test gets a copy (a sweep costs about 15 s here)."""
    out = tmp_path_factory.mktemp("finished") / "sweep"
    SweepRunner(config(), out, CPU).run()
    return out


def copy_of(finished, tmp_path):
    return shutil.copytree(finished, tmp_path / "sweep")


def test_resume_skips_finished_trials_and_loses_none(tmp_path, monkeypatch, finished):
    out = copy_of(finished, tmp_path)
    first = ResultStore(out / "results.jsonl").read()
    assert [r.status for r in first] == ["ok"]
    assert (out / "env.json").exists() and (out / "sweep.toml").exists()

    launched = []
    real = TrialLauncher._launch

    def counting(self, trial, env):
        launched.append(trial.trial_id)
        return real(self, trial, env)

    monkeypatch.setattr(TrialLauncher, "_launch", counting)
    grown = config(repeats=2, techniques="baseline,grad_accum:steps=7")
    with pytest.raises(ConfigError, match=r"the plan differs .*repeats 1 -> 2.*pass --extend"):
        SweepRunner(grown, out, CPU, resume=True).run()
    records = SweepRunner(grown, out, CPU, resume=True, extend=True).run()
    assert launched == ["mlp:tiny/baseline/seed1/r1"]  # grad_accum:steps=7 cannot split the batch: skipped
    assert len(records) == 4 and records[0] == first[0]
    assert len({r.config_hash for r in records}) == 1 and records[0].config_hash
    # the references the plan needed were computed once, in their own process, and kept for the resume
    assert sorted(p.name for p in (out / "references").iterdir()) == [
        "mlp-tiny-seed0-b64-k4.json", "mlp-tiny-seed1-b64-k4.json"]
    skipped = [r for r in records if r.technique_label == "grad_accum:steps=7"]
    assert all(r.status == "skipped" and "not divisible" in r.reason for r in skipped)
    assert "grad_accum:steps=7" in (out / "sweep.toml").read_text()  # the sweep is now the union


def test_resume_with_other_settings_is_refused_and_changes_nothing(tmp_path, finished):
    out = copy_of(finished, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=r"settings differ .*budget.min_seconds 0.05 -> 2.0"):
        SweepRunner(config(budget={"min_seconds": 2.0}), out, CPU, resume=True).run()
    with pytest.raises(ConfigError, match=r"settings differ .*threads 0 -> 2"):
        SweepRunner(config(threads=2), out, CPU, resume=True).run()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_existing_results_are_not_overwritten(tmp_path, finished):
    out = copy_of(finished, tmp_path)
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
