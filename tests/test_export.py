"""``bench export`` / ``bench.export``: each target read back with its own tool's reader (pandas, MLflow's client,
TensorBoard's EventAccumulator), from committed sweeps; a missing extra is one line naming it, exit 2."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

import bench
from bench.cli import main
from bench.records import columns
from bench.records.results import ResultStore
from tests.conftest import REPO

EXAMPLE = REPO / "reports" / "example-cpu"
FIXTURE = REPO / "tests" / "fixtures" / "report"  # 23 ok, 1 failed, 1 skipped


def records(sweep: Path) -> dict:
    return {r.trial_id: r for r in ResultStore(sweep / "results.jsonl").read()}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ---- parquet / csv ----------------------------------------------------------------------------------------------


def test_parquet_reads_back_with_the_frames_dtypes(tmp_path):
    pytest.importorskip("pyarrow", reason="the parquet extra (pyarrow) is not installed")
    from bench.report.exporters import read_parquet

    done = bench.export(EXAMPLE, to="parquet", out=tmp_path / "t.parquet")
    assert (done.trials, done.where) == (45, str(tmp_path / "t.parquet"))
    frame = bench.load(EXAMPLE)
    back = pd.read_parquet(tmp_path / "t.parquet")
    expected = {c: "string" if d == columns.OBJECT else d for c, d in columns.COLUMN_DTYPES.items()}
    assert {c: str(back[c].dtype) for c in back.columns} == expected  # nested columns are JSON text
    typed = [c for c, d in columns.COLUMN_DTYPES.items() if d != columns.OBJECT]
    pd.testing.assert_frame_equal(back[typed], frame[typed])
    assert list(back.status.cat.categories) == list(frame.status.cat.categories)
    nested = read_parquet(tmp_path / "t.parquet")
    assert list(nested.curve) == list(frame.curve)
    assert [tuple(k) for k in nested.key] == list(frame.key)


def test_csv_holds_every_trial_and_its_numbers(tmp_path, capsys):
    assert main(["export", str(EXAMPLE), "--to", "csv", "--out", str(tmp_path / "t.csv")]) == 0
    assert f"csv: 45 trials -> {tmp_path / 't.csv'}" in capsys.readouterr().out
    back = pd.read_csv(tmp_path / "t.csv")
    frame = bench.load(EXAMPLE)
    assert list(back.trial_id) == list(frame.trial_id)
    assert back.samples_per_s.tolist() == pytest.approx(frame.samples_per_s.tolist(), rel=1e-12)
    assert [json.loads(c) for c in back.curve] == list(frame.curve)


# ---- MLflow -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def no_telemetry():
    """MLflow 3 sends usage telemetry unless told not to: not from the tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        yield


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """example-cpu exported once into a SQLite store: (its URI, the Exported). About 10-20 s on 2 cores: MLflow
    migrates a new database, then commits each run's writes."""
    for module in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module, reason="the mlflow extra is not installed")
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return f"sqlite:///{db}", bench.export(EXAMPLE, to="mlflow", out=db)


def _runs(uri: str, name: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    return client.search_runs([exp.experiment_id], max_results=1000)


@pytest.mark.slow
def test_mlflow_has_one_run_per_trial_with_its_params_and_metrics(mlflow_store):
    uri, done = mlflow_store
    assert (done.trials, done.created, done.updated) == (45, 45, 0)
    commit = json.loads((EXAMPLE / "env.json").read_text())["git"]["commit"]
    runs = _runs(uri, "example-cpu")
    by_trial = {run.data.tags["trainbench.trial_id"]: run for run in runs}
    recs = records(EXAMPLE)
    assert len(runs) == 45 and sorted(by_trial) == sorted(recs)
    for trial_id, run in by_trial.items():
        r, p, m = recs[trial_id], run.data.params, run.data.metrics
        assert (p["workload"], p["size"]) == (r.workload["name"], r.workload["size"])
        assert (p["techniques"], p["seed"], p["device"], p["commit"]) == (r.technique_label, str(r.seed), "cpu",
                                                                          commit)
        assert m["samples_per_s"] == r.speed.samples_per_s and m.get("tokens_per_s") == r.speed.tokens_per_s
        assert m["mfu"] == r.speed.mfu and m[f"final_{r.quality.metric}"] == r.quality.final
        assert m.get("peak_bytes") == r.memory.peak_bytes  # None (not logged) where the record has none
        assert m.get("time_to_target_s") == r.quality.time_to_target_s
        assert run.info.status == "FINISHED" and run.info.run_name == trial_id
        assert run.data.tags["trainbench.status"] == "ok"
    assert by_trial["gpt:tiny/grad_accum:steps=4/seed0/r0"].data.params["option.grad_accum.steps"] == "4"


@pytest.mark.slow
def test_mlflow_holds_the_eval_curve_and_the_artifacts(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, _ = mlflow_store
    client = MlflowClient(tracking_uri=uri)
    recs = records(EXAMPLE)
    run = next(r for r in _runs(uri, "example-cpu") if r.data.tags["trainbench.trial_id"] == "cnn:tiny/bf16/seed1/r1")
    r = recs["cnn:tiny/bf16/seed1/r1"]
    cols = r.quality.curve_columns
    history = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert [(h.step, h.value) for h in history] == [(p[cols.index("samples")], p[cols.index("accuracy")])
                                                    for p in r.quality.curve]
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert len(losses) == len(r.quality.curve) - 1  # no training loss before the first step
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["record.json", "report.html"]
    got = Path(client.download_artifacts(run.info.run_id, "record.json", str(tmp_path)))
    assert json.loads(got.read_text()) == json.loads(r.to_json())


@pytest.mark.slow
def test_mlflow_export_again_updates_and_never_duplicates(mlflow_store):
    from mlflow.tracking import MlflowClient

    uri, _ = mlflow_store
    client = MlflowClient(tracking_uri=uri)
    before = {r.info.run_id: len(client.get_metric_history(r.info.run_id, "eval/val_loss"))
              for r in _runs(uri, "example-cpu")}
    again = bench.export(EXAMPLE, to="mlflow", out=uri)
    assert (again.created, again.updated) == (0, 45)
    after = {r.info.run_id: len(client.get_metric_history(r.info.run_id, "eval/val_loss"))
             for r in _runs(uri, "example-cpu")}
    assert after == before and len(after) == 45
    assert len(client.search_experiments()) == 1 + 1  # MLflow's Default and the sweep's


def test_mlflow_file_store_finds_every_trial_and_exporting_again_adds_nothing(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient

    done = bench.export(FIXTURE, to="mlflow", out=tmp_path / "mlruns")
    assert done.where == (tmp_path / "mlruns").resolve().as_uri() and "MLFLOW_ALLOW_FILE_STORE=true" in done.view
    recs = records(FIXTURE)
    sweep_id = next(iter(recs.values())).sweep_id
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens its file store only when told
    runs = _runs(done.where, sweep_id)
    assert sorted(run.data.tags["trainbench.trial_id"] for run in runs) == sorted(recs)
    expected = {"ok": "FINISHED", "skipped": "FINISHED", "failed": "FAILED"}
    for run in runs:
        r = recs[run.data.tags["trainbench.trial_id"]]
        assert (run.info.status, run.data.tags["trainbench.status"]) == (expected[r.status], r.status)
        assert (run.data.params["techniques"], run.data.params["seed"]) == (r.technique_label, str(r.seed))
        assert run.data.metrics.get("samples_per_s") == (r.speed.samples_per_s if r.speed else None)
        if r.status == "failed":
            assert run.data.tags["trainbench.reason"] == r.reason[:5000]

    # The file store keeps every point it is sent: the export itself must skip what a run already has.
    client = MlflowClient(tracking_uri=done.where)
    metric = next(r for r in recs.values() if r.quality).quality.metric
    before = {run.info.run_id: len(client.get_metric_history(run.info.run_id, f"eval/{metric}")) for run in runs}
    again = bench.export(FIXTURE, to="mlflow", out=tmp_path / "mlruns")
    assert (again.created, again.updated) == (0, len(recs))
    runs = _runs(done.where, sweep_id)
    assert {run.info.run_id: len(client.get_metric_history(run.info.run_id, f"eval/{metric}"))
            for run in runs} == before
    assert sum(before.values()) > 0


# ---- TensorBoard ------------------------------------------------------------------------------------------------


def test_tensorboard_curves_read_back_with_event_accumulator(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from bench.report.exporters.to_tensorboard import run_dir
    from bench.report.exporters.trials import TrialView

    done = bench.export(EXAMPLE, to="tensorboard", out=tmp_path)
    assert (done.trials, done.created) == (45, 45)
    recs = records(EXAMPLE)
    env = json.loads((EXAMPLE / "env.json").read_text())
    seen = set()
    for r in recs.values():
        where = run_dir(tmp_path, TrialView(r, {}, env, EXAMPLE))
        acc = EventAccumulator(str(where))
        acc.Reload()
        cols, metric = r.quality.curve_columns, r.quality.metric
        evals = acc.Scalars(f"eval/{metric}")
        assert [e.step for e in evals] == [p[cols.index("samples")] for p in r.quality.curve]
        assert [e.value for e in evals] == pytest.approx([p[cols.index(metric)] for p in r.quality.curve],
                                                         rel=1e-6)  # event files hold float32
        assert len(acc.Scalars("train/loss")) == len(r.quality.curve) - 1
        assert acc.Scalars("samples_per_s")[0].value == pytest.approx(r.speed.samples_per_s, rel=1e-6)
        assert acc.Scalars("step_time_median_s")[0].value == pytest.approx(r.speed.step_time_s.median, rel=1e-6)
        assert "_hparams_/experiment" in acc.PluginTagToContent("hparams")
        seen.add(where)
    assert len(seen) == 45 == len(list(tmp_path.rglob("events.out.tfevents.*")))

    again = bench.export(EXAMPLE, to="tensorboard", out=tmp_path)  # replaces, never adds
    assert (again.created, again.updated) == (0, 45)
    assert len(list(tmp_path.rglob("events.out.tfevents.*"))) == 45
    acc = EventAccumulator(str(next(iter(seen))))
    acc.Reload()
    assert len(acc.Scalars("train/loss")) == 10


# ---- bad input: one line, exit 2, nothing written ----------------------------------------------------------------


@pytest.mark.parametrize("target,module,extra", [
    ("parquet", "pyarrow", "parquet"), ("mlflow", "mlflow", "mlflow"), ("mlflow", "sqlalchemy", "mlflow"),
    ("tensorboard", "tensorboard", "tensorboard"),
])
def test_a_missing_extra_is_one_line_naming_it(target, module, extra, tmp_path, capsys, monkeypatch):
    if module == "sqlalchemy":
        pytest.importorskip("mlflow", reason="the mlflow extra is not installed")  # mlflow there, its SQLite parts not
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError, as when not installed
    out = tmp_path / ("store.db" if target == "mlflow" else "out")
    assert main(["export", str(FIXTURE), "--to", target, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"error: --to {target} needs the {module} package: pip install "
                                        f"'trainbench[{extra}]'"]
    assert list(tmp_path.iterdir()) == []


BAD = {
    "several dirs without --out": (lambda t: [str(FIXTURE), str(EXAMPLE), "--to", "csv"],
                                   "--out is required when exporting several directories"),
    "no sweep": (lambda t: [str(t), "--to", "csv", "--out", str(t / "x.csv")], "has no results.jsonl"),
    "out is a directory": (lambda t: [str(FIXTURE), "--to", "csv", "--out", str(t)], "is a directory"),
    "out under a file": (lambda t: [str(FIXTURE), "--to", "csv", "--out", str(t / "file" / "x.csv")],
                         "is a file, not a directory"),
    "a tracking server": (lambda t: [str(FIXTURE), "--to", "mlflow", "--out", "http://localhost:5000"],
                          "no server"),
    "tensorboard under a file": (lambda t: [str(FIXTURE), "--to", "tensorboard", "--out", str(t / "file")],
                                 "is a file, not a directory"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_export_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, capsys):
    if name in ("a tracking server",):
        pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    if name == "tensorboard under a file":
        pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    (tmp_path / "file").write_text("not a directory")
    make_args, message = BAD[name]
    before, sources = _tree(tmp_path), _tree(FIXTURE)
    assert main(["export", *make_args(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert _tree(tmp_path) == before and _tree(FIXTURE) == sources


def test_an_unknown_target_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["export", str(FIXTURE), "--to", "wandb"])
    assert caught.value.code == 2
    assert "invalid choice: 'wandb'" in capsys.readouterr().err
