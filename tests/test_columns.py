"""``bench.load`` gives typed columns (bench/records/columns.py): the dtypes docs/api.md documents, the records' values in
them, missing values as NaN / <NA> / NaT, and ``bench.configurations`` still the report's numbers."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

import bench
from bench.analyze import analysis
from bench.records import columns, reader
from bench.records.frame import RECORD_COLUMNS, records_frame
from bench.records.results import STATUSES, ResultStore, TrialRecord
from tests.conftest import REPO

EXAMPLE = REPO / "reports" / "example-cpu"
# Committed sweeps of every shape: one process, schema-1 records (no quality run), torchrun trials, failures.
SWEEPS = [EXAMPLE, REPO / "reports" / "example-cpu-2rank", REPO / "reports" / "example-cpu-parallelism" / "gpt",
          REPO / "tests" / "fixtures" / "report"]
NUMERIC = {columns.FLOAT, columns.INT}


def documented_dtypes() -> dict[str, str]:
    """column -> dtype from the table of docs/api.md's ``bench.load`` section."""
    doc = (REPO / "docs" / "api.md").read_text()
    section = doc[doc.index("## `bench.load"):doc.index("## `bench.configurations")]
    found: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            for name in re.findall(r"`([a-z0-9_]+)`", cells[0]):
                assert name not in found, f"{name} documented twice"
                found[name] = cells[1]
    return found


def test_every_column_has_one_documented_dtype_the_code_uses():
    documented = documented_dtypes()
    assert sorted(documented) == sorted(RECORD_COLUMNS)
    assert documented == columns.COLUMN_DTYPES


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_load_gives_every_column_its_documented_dtype(sweep):
    frame = bench.load(sweep)
    assert list(frame.columns) == RECORD_COLUMNS
    assert {c: str(frame[c].dtype) for c in frame.columns} == documented_dtypes()
    numeric = [c for c in RECORD_COLUMNS if columns.COLUMN_DTYPES[c] in NUMERIC]
    summary = frame.describe()
    assert sorted(summary.columns) == sorted(numeric)
    assert summary.loc["count", "samples_per_s"] == frame.samples_per_s.notna().sum() > 0


def test_typed_values_are_the_records_values():
    frame = bench.load(EXAMPLE)
    records = ResultStore(EXAMPLE / "results.jsonl").read()
    assert list(frame.trial_id) == [r.trial_id for r in records]
    for (_, row), r in zip(frame.iterrows(), records, strict=True):
        assert row.samples_per_s == r.speed.samples_per_s and row.window_steps == r.speed.steps
        assert row.contended == r.speed.contended and row.final == r.quality.final
        assert row.timestamp_utc == pd.Timestamp(r.timestamp_utc) and row.timestamp_utc.tzname() == "UTC"
        if r.memory.peak_bytes is None:
            assert row.peak_bytes is pd.NA
        else:
            assert row.peak_bytes == r.memory.peak_bytes
        assert row.curve == r.quality.curve and row.names == tuple(t["name"] for t in r.techniques)
    assert list(frame.status.cat.categories) == list(STATUSES)
    assert frame.status.value_counts()["ok"] == len(records)
    assert list(frame.technique.cat.categories) == list(dict.fromkeys(r.technique_label for r in records))


def test_missing_values_are_nan_na_and_nat():
    bare = TrialRecord(sweep_id="s", trial_id="mlp:tiny/baseline/seed0/r0", workload={"name": "mlp", "size": "tiny"},
                       techniques=[], technique_label="baseline", seed=0, repeat=0, world_size=1, device="cpu",
                       status="killed", reason="killed by signal 9")  # what a trial killed before its build leaves
    frame = columns.typed(records_frame([bare]))
    assert {c: str(frame[c].dtype) for c in frame.columns} == columns.COLUMN_DTYPES
    row = frame.iloc[0]
    assert math.isnan(row.samples_per_s) and math.isnan(row.final)
    assert row.peak_bytes is pd.NA and row.samples_to_target is pd.NA and row.parity_ok is pd.NA
    assert row.timestamp_utc is pd.NaT and row.cut is pd.NA and row.reason == "killed by signal 9"
    assert row.status == "killed" and row.curve == [] and not row.contended

    schema1 = bench.load(REPO / "reports" / "example-cpu-2rank")  # speed and memory only
    assert schema1.final.isna().all() and schema1.samples_to_target.isna().all()
    assert schema1.samples_per_s.notna().all()


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_untyped_gives_back_the_analysis_frame(sweep):
    raw = records_frame(reader.load([sweep]))
    back = columns.untyped(bench.load(sweep))
    for col in raw.columns:
        assert list(back[col]) == list(raw[col]), col
        assert all(v is None for v, w in zip(back[col], raw[col], strict=True) if w is None), col


def test_configurations_of_the_typed_frame_are_the_reports():
    raw = records_frame(reader.load([EXAMPLE]))
    frame = bench.load(EXAMPLE)
    pd.testing.assert_frame_equal(bench.configurations(frame), analysis.configurations(raw))
    gpt = frame[frame.workload == "gpt:tiny"]  # a filter keeps the other workloads' categories
    expected = analysis.configurations(raw[raw.workload == "gpt:tiny"])
    assert list(expected.workload) == ["gpt:tiny"] * 5
    pd.testing.assert_frame_equal(bench.configurations(gpt), expected)
