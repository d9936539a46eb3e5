import json
from pathlib import Path

import pytest

from bench.results import SCHEMA_VERSION, ResultStore, TrialRecord, sanitize


def make_record(trial_id="mlp:tiny/baseline/seed0/r0", **kw) -> TrialRecord:
    fields = dict(
        sweep_id="s",
        trial_id=trial_id,
        workload={"name": "mlp", "size": "tiny"},
        techniques=[],
        technique_label="baseline",
        seed=0,
        repeat=0,
        world_size=1,
        device="cpu",
        status="ok",
        timing={"samples_per_s": 1234.5, "step_time_s": {"median": 0.01, "iqr": 0.001, "n": 10}},
        memory={"peak_bytes": 1000, "breakdown": {"params": 10, "grads": 10}},
        accuracy={"curve": [[0.0, 0, None, 0.1], [1.5, 10, 2.3, 0.5]]},
    )
    fields.update(kw)
    return TrialRecord(**fields)


def test_record_round_trips_through_json():
    rec = make_record()
    again = TrialRecord.from_dict(json.loads(rec.to_json()))
    assert again == rec
    assert json.loads(rec.to_json())["schema_version"] == SCHEMA_VERSION


def test_record_rejects_bad_status_unknown_fields_and_other_versions():
    with pytest.raises(ValueError, match="status must be one of"):
        make_record(status="great")
    data = make_record().to_dict()
    with pytest.raises(ValueError, match="unknown fields: extra"):
        TrialRecord.from_dict({**data, "extra": 1})
    with pytest.raises(ValueError, match="schema_version 99 is not supported"):
        TrialRecord.from_dict({**data, "schema_version": 99})


def test_nan_is_not_written_as_invalid_json():
    assert sanitize({"a": float("nan"), "b": [1.0, float("inf")], "c": 2}) == {"a": None, "b": [1.0, None], "c": 2}
    with pytest.raises(ValueError):
        make_record(accuracy={"final": float("nan")}).to_json()


def test_store_appends_and_repairs_a_half_written_line(tmp_path: Path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(make_record("a"))
    store.append(make_record("b"))
    with open(store.path, "a") as fh:
        fh.write('{"schema_version": 1, "trial_id": "c", "sta')  # interrupted mid-write
    assert [r.trial_id for r in store.read()] == ["a", "b"]
    assert store.repair_tail() is True
    store.append(make_record("d"))
    assert store.done_trial_ids() == {"a", "b", "d"}
    assert store.repair_tail() is False
