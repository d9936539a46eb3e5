import json
from pathlib import Path

import pytest

from bench.records.results import SCHEMA_1_QUALITY_NOTE, SCHEMA_VERSION, ResultStore, TrialRecord, sanitize
from tests.records import record


def test_record_round_trips_through_json_with_its_typed_sections():
    rec = record("bf16", final=0.8, target=0.7, ttt=0.5, peak=1000, breakdown={"params": 10, "grads": 10})
    again = TrialRecord.from_dict(json.loads(rec.to_json()))
    assert again == rec
    assert again.speed.step_time_s.n == 20 and again.quality.curve == rec.quality.curve
    assert json.loads(rec.to_json())["schema_version"] == SCHEMA_VERSION == 2


def test_record_rejects_bad_status_unknown_or_missing_fields_and_other_versions():
    with pytest.raises(ValueError, match="status must be one of"):
        record(status="great")
    data = record(final=0.5).to_dict()
    with pytest.raises(ValueError, match="unknown fields: 'extra'"):
        TrialRecord.from_dict({**data, "extra": 1})
    with pytest.raises(ValueError, match=r"record.quality has unknown fields: 'oops'"):
        TrialRecord.from_dict({**data, "quality": {**data["quality"], "oops": 1}})
    with pytest.raises(ValueError, match=r"record.speed is missing the field 'samples_per_s'"):
        TrialRecord.from_dict({**data, "speed": {k: v for k, v in data["speed"].items() if k != "samples_per_s"}})
    with pytest.raises(ValueError, match="record.seed must be an integer, got str"):
        TrialRecord.from_dict({**data, "seed": "0"})
    with pytest.raises(ValueError, match="record.speed.samples_per_s must be a number, got list"):
        TrialRecord.from_dict({**data, "speed": {**data["speed"], "samples_per_s": [1]}})
    with pytest.raises(ValueError, match="schema_version 99 is not supported"):
        TrialRecord.from_dict({**data, "schema_version": 99})
    with pytest.raises(ValueError, match="a record is a JSON object"):
        TrialRecord.from_dict([1, 2])


def test_schema_1_records_keep_speed_and_memory_and_drop_quality_with_the_reason():
    old = {"schema_version": 1, "sweep_id": "s", "trial_id": "mlp:tiny/bf16/seed0/r0",
           "workload": {"name": "mlp", "size": "tiny", "batch_size": 64, "n_params": 10}, "techniques": [],
           "technique_label": "bf16", "seed": 0, "repeat": 0, "world_size": 1, "device": "cpu", "status": "ok",
           "reason": None, "timestamp_utc": "", "env_ref": "env.json",
           "timing": {"steps": 20, "window_s": 1.0, "samples_per_s": 1280.0, "first_step_s": 0.2,
                      "step_time_s": {"median": 0.05, "iqr": 0.01, "min": 0.04, "max": 0.06, "mean": 0.05, "n": 20},
                      "contention": {"other_cpu_s": 0.0, "window_s": 1.0, "ncpu": 2, "fraction": 0.0}},
           "memory": {"peak_bytes": 123, "peak_rss_bytes": 456, "breakdown": None},
           "compute": {"flops_per_step": 10, "mfu": 0.1, "compute_dtype": "bfloat16"},
           "accuracy": {"final": 0.5, "steps_trained": 40}, "energy": {}, "parity": {"kind": "numeric"}}
    rec = TrialRecord.from_dict(old)
    assert rec.schema_version == 2 and rec.mode == "speed" and rec.kind == "numeric"
    assert rec.speed.samples_per_s == 1280.0 and rec.speed.compute_dtype == "bfloat16"
    assert rec.memory.peak_rss_bytes == 456 and rec.build.first_step_s == 0.2
    assert rec.quality is None and rec.notes == [SCHEMA_1_QUALITY_NOTE]


def test_nan_is_not_written_as_invalid_json():
    assert sanitize({"a": float("nan"), "b": [1.0, float("inf")], "c": 2}) == {"a": None, "b": [1.0, None], "c": 2}
    rec = record(sps=float("nan"))
    with pytest.raises(ValueError):
        rec.to_json()
    assert json.loads(sanitize(rec).to_json())["speed"]["samples_per_s"] is None


def test_store_appends_and_repairs_a_half_written_line(tmp_path: Path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(record(sweep_id="a"))
    store.append(record("bf16"))
    with open(store.path, "a") as fh:
        fh.write('{"schema_version": 2, "trial_id": "c", "sta')  # interrupted mid-write
    assert [r.technique_label for r in store.read()] == ["baseline", "bf16"]
    assert store.repair_tail() is True
    store.append(record("grad_accum"))
    assert len(store.done_trial_ids()) == 3
    assert store.repair_tail() is False


def test_a_bad_record_in_the_middle_names_its_line(tmp_path: Path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(record())
    with open(store.path, "a") as fh:
        fh.write('{"schema_version": 2}\n')
    store.append(record("bf16"))
    with pytest.raises(ValueError, match=r"results.jsonl:2: record is missing the field 'sweep_id'"):
        store.read()


def test_the_records_documentation_is_generated_from_the_dataclasses():
    from bench.dev import schema_doc as records_doc

    assert records_doc.main(["--check"]) == 0, "docs/records.md is out of date: run python -m bench.dev.schema_doc"
    text = records_doc.render()
    assert "## QualityResult" in text and "| `time_to_target_with_one_off_s` |" in text


def test_a_parity_section_written_before_calibration_still_loads_and_keeps_its_answer():
    old = json.loads(record("bf16", parity_result=None).to_json())
    old["parity"] = {"kind": "numeric", "steps": 2, "ok": False, "loss_rel_diff": 0.065, "distance_rel_diff": 3e-3,
                     "loss_tolerance": 0.05, "distance_tolerance": 0.02, "losses": [5.3, 6.2],
                     "reference_losses": [5.3, 6.2], "distances": [5.5, 8.7], "reference_distances": [5.5, 8.7],
                     "note": None, "reference": "gpt-gpt2-124m-seed1-b8-k2"}  # the H200 sweep's fields
    parity = TrialRecord.from_dict(old).parity
    assert parity.answer is None and parity.harmless is None and parity.verdict == "mismatch"
    assert TrialRecord.from_dict({**old, "parity": {**old["parity"], "ok": True}}).parity.verdict == "ok"
