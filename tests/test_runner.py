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


@pytest.mark.slow  # a sweep interrupted and resumed end to end
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
    assert sorted(p.name for p in (out / "references").glob("*.json")) == [
        "mlp-tiny-seed0-b64-k4.json", "mlp-tiny-seed1-b64-k4.json"]
    # ... and the dataset they decoded first, which every trial read back instead of generating it again
    assert [p.name.split("-")[0] for p in (out / "references" / "datasets").iterdir()] == ["mnist1d"]
    assert [r.caches for r in records if r.status == "ok"] == [{"dataset": "read"}] * 2
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


@pytest.mark.slow  # waits out a real timeout
def test_a_trial_past_its_timeout_is_killed_and_recorded(tmp_path):
    # A 3 s window: a forked trial of the tiny budget alone can end within 0.5 s.
    budget = {"timeout_s": 0.5, "max_train_seconds": 0.4, "min_seconds": 3.0}
    records = SweepRunner(config(budget=budget), tmp_path / "s", CPU).run()
    assert [r.status for r in records] == ["timeout"]
    assert "timeout_s=0.5" in records[0].reason


def test_a_trial_records_where_its_wall_time_went(finished):
    """A real trial process: every stage it passed through is in its record, none negative, the measured ones equal
    to the record's own window and training clock, and together (with ``unaccounted``) they are its wall time."""
    from bench.measure.stages import MEASURED, STAGES

    (rec,) = ResultStore(finished / "results.jsonl").read()
    stages = rec.stages
    expected = {"launch", "start", "imports", "setup", "data", "build", "reference", "quality_train", "evaluation",
                "warmup", "window", "window_retries", "phases", "parity", "finalize", "teardown", "collect",
                "unaccounted"}
    assert expected <= set(stages) <= set(STAGES)
    assert "process" not in stages  # the trial wrote its own stages: the launcher did not fall back to one block
    assert all(v >= 0 for k, v in stages.items() if k != "unaccounted"), stages
    assert sum(stages.values()) == pytest.approx(rec.wall_s, abs=0.01)
    assert abs(stages["unaccounted"]) <= 0.1 * rec.wall_s  # the stages cover the trial, not just add up to it
    assert stages["window"] == pytest.approx(rec.speed.window_s, abs=1e-3)
    assert stages["quality_train"] == pytest.approx(rec.quality.train_time_s, abs=1e-3)
    assert stages.get("one_off", 0.0) == pytest.approx(rec.build.one_off_s, abs=1e-3)
    measured = sum(stages.get(k, 0.0) for k in MEASURED)
    assert 0 < measured < rec.wall_s
