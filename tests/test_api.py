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


@pytest.mark.parametrize(("option", "value", "refusal"), [
    ("order", "sideways", "order must be one of shuffled, priority"),
    ("max_repeats", 1, r"max_repeats \(1\) must be at least"),
    ("decide_within", -5.0, "decide_within must be a number of seconds"),
    ("price_per_hour", -1.0, "price_per_hour must be a price"),
])
def test_sweep_takes_the_clis_design_and_price_settings_and_validates_them_alike(tmp_path, option, value, refusal):
    # The API passes them to the one config (not "unknown option"), which refuses a bad value before anything runs.
    with pytest.raises(bench.ConfigError, match=refusal):
        bench.sweep("mlp", "baseline", out=tmp_path / "out", **{option: value})
    assert not (tmp_path / "out").exists()


def test_sweep_refuses_what_the_cli_refuses(tmp_path):
    with pytest.raises(bench.ConfigError, match="nnodes=1"):
        bench.sweep("mlp", "bf16", nnodes=2, out=tmp_path / "out")
    with pytest.raises(bench.ConfigError, match="extend=True grows a sweep that exists"):
        bench.sweep("mlp", "bf16", extend=True, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
