"""The Python API: ``bench.sweep`` runs a sweep and returns its trials; ``bench.load`` reads them back."""

from __future__ import annotations

import re

import pytest

import bench
from bench.records.frame import RECORD_COLUMNS
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "report"


def test_every_column_of_load_is_documented():
    doc = (REPO / "docs" / "api.md").read_text()
    documented = set(re.findall(r"`([a-z0-9_]+)`", doc))
    assert [c for c in RECORD_COLUMNS if c not in documented] == []


def test_load_reads_a_sweep_directory():
    frame = bench.load(FIXTURE)
    assert list(frame.columns) == RECORD_COLUMNS
    assert len(frame) == len((FIXTURE / "results.jsonl").read_text().splitlines())
    assert set(frame.status) <= {"ok", "skipped", "failed", "oom", "diverged", "timeout", "killed"}


def test_load_without_a_sweep_says_what_to_give(tmp_path):
    from bench.records.reader import InputError

    with pytest.raises(InputError, match="has no results.jsonl"):
        bench.load(tmp_path)


def test_sweep_rejects_an_unknown_option_before_running(tmp_path):
    with pytest.raises(bench.ConfigError, match="unknown option.*repeatz.*valid:"):
        bench.sweep("mlp", "bf16", repeatz=2, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_sweep_returns_the_trials_it_ran(tmp_path):
    seen = []
    frame = bench.sweep("mlp", ["baseline"], preset="smoke", repeats=1, steps=4, eval_points=1, window_steps=3,
                        window_seconds=0.05, memory=False, out=tmp_path / "out", on_trial=seen.append)
    assert list(frame.trial_id) == ["mlp:tiny/baseline/seed0/r0"] and list(frame.status) == ["ok"]
    assert frame.attrs["out"] == str(tmp_path / "out") and len(seen) == 1 and seen[0].record.status == "ok"
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "summary.md").is_file()
    assert frame.samples_per_s.iloc[0] > 0 and frame.final.notna().iloc[0]  # NaN where missing


def test_sweep_refuses_what_the_cli_refuses(tmp_path):
    with pytest.raises(bench.ConfigError, match="nnodes=1"):
        bench.sweep("mlp", "bf16", nnodes=2, out=tmp_path / "out")
    with pytest.raises(bench.ConfigError, match="extend=True grows a sweep that exists"):
        bench.sweep("mlp", "bf16", extend=True, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
