"""Trials as MLflow runs in a local tracking store (SQLite file or file store; no server).

One experiment per sweep (named by its sweep id), one run per trial, keyed by the tag ``trainbench.trial_id``: a
second export of the same sweep finds each trial's run and adds only what it lacks (a new trial of a resumed sweep,
a changed value), so runs and metric points are never duplicated. A run holds:

- params: ``TrialView.params`` (workload, size, techniques and each option, seed, device, commit, ...);
- metrics: ``TrialView.metrics`` at step 0, and the quality run's curves ``train/loss`` and ``eval/<metric>`` with
  the samples trained as MLflow's step and the trial's start plus its training clock as the timestamp;
- artifacts: ``record.json`` (the trial's record) and the sweep's ``report.html`` (self-contained) when present;
- tags: the trial id, sweep id, status and reason; ``mlflow.source.git.commit``. A run's status: FINISHED (ok,
  skipped), KILLED (killed, timeout), FAILED (failed, oom, diverged).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench.core.errors import ConfigError
from bench.report.exporters import Exported, require
from bench.report.exporters.trials import TrialView

log = logging.getLogger(__name__)

TRIAL_TAG = "trainbench.trial_id"
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
RUN_STATUS = {"ok": "FINISHED", "skipped": "FINISHED", "killed": "KILLED", "timeout": "KILLED"}
# MLflow's limits per log_batch call
BATCH = {"metrics": 800, "params": 100, "tags": 100}  # and 1000 entities in all


def tracking_uri(out: Path | str) -> tuple[str, Path | None]:
    """The tracking URI of ``out`` (a .db file: SQLite; another path: a file store; or such a URI) and, for SQLite,
    where the artifacts go (``mlartifacts`` beside the database; a file store keeps its own)."""
    text = str(out)
    if "://" in text or text.startswith("file:"):
        scheme = urlparse(text).scheme
        if scheme == "sqlite":
            db = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:///") else None
            if db is None:
                raise ConfigError(f"--out {text}: a SQLite URI is sqlite:///PATH (e.g. sqlite:///mlflow.db)")
            return f"sqlite:///{db.resolve()}", db.resolve().parent / "mlartifacts"
        if scheme == "file":
            return Path(urlparse(text).path).resolve().as_uri(), None
        raise ConfigError(f"--out {text}: bench export writes a local tracking store, no server: give a .db file "
                          "(SQLite) or a directory (MLflow's file store)")
    path = Path(text)
    if path.suffix in SQLITE_SUFFIXES:
        return f"sqlite:///{path.resolve()}", path.resolve().parent / "mlartifacts"
    return path.resolve().as_uri(), None


def export(views: Sequence[TrialView], out: Path | str) -> Exported:
    uri, artifact_root = tracking_uri(out)
    store_path = Path(urlparse(uri).path) if uri.startswith("file:") else Path(uri.removeprefix("sqlite:///"))
    _check_writable(store_path, directory=uri.startswith("file:"))
    if uri.startswith("sqlite:"):
        require("mlflow", ("sqlalchemy", "alembic"))  # MLflow's SQLite store; mlflow-skinny alone lacks them
    sweeps: dict[str, list[TrialView]] = {}
    dirs: dict[str, Path] = {}
    for view in views:
        if dirs.setdefault(view.sweep_id, view.sweep_dir.resolve()) != view.sweep_dir.resolve():
            raise ConfigError(f"{dirs[view.sweep_id]} and {view.sweep_dir} both hold sweep '{view.sweep_id}': "
                              "their runs would share one experiment; export them to different stores")
        sweeps.setdefault(view.sweep_id, []).append(view)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    created = updated = 0
    with _file_store_allowed(uri), tempfile.TemporaryDirectory(prefix="trainbench-mlflow-") as tmp:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        for sweep_id, trials in sweeps.items():
            exp_id = _experiment(client, sweep_id, trials[0], artifact_root)
            runs = _runs_by_trial(client, exp_id)
            for view in trials:
                run = runs.get(view.record.trial_id)
                _log_trial(client, exp_id, view, run, Path(tmp))
                created, updated = created + (run is None), updated + (run is not None)
    allow = "MLFLOW_ALLOW_FILE_STORE=true " if uri.startswith("file:") else ""  # MLflow 3 asks for it
    return Exported("mlflow", uri, len(views), created, updated, f"{allow}mlflow ui --backend-store-uri {uri}")


def _check_writable(path: Path, directory: bool) -> None:
    if directory and path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} is a file: give a .db file (SQLite) or a directory (file store)")
    existing = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"cannot write {path}: {existing} is a file, not a directory")


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """MLflow 3 refuses its file store unless told it is wanted; the user asked for one by giving a directory."""
    if not uri.startswith("file:"):
        yield
        return
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


def _experiment(client: Any, name: str, first: TrialView, artifact_root: Path | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = (artifact_root / name).as_uri() if artifact_root is not None else None
    return client.create_experiment(name, artifact_location=location, tags={
        "trainbench.sweep_dir": str(first.sweep_dir.resolve()), "trainbench.machine": str(first.row.get("machine"))})


def _runs_by_trial(client: Any, exp_id: str) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs([exp_id], max_results=1000, page_token=token)
        for run in page:
            trial = run.data.tags.get(TRIAL_TAG)
            if trial is not None:
                runs.setdefault(trial, run)
        token = page.token
        if not token:
            return runs


def _log_trial(client: Any, exp_id: str, view: TrialView, run: Any, tmp: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag

    r = view.record
    start_ms = int(view.start_s * 1000)
    if run is None:
        run = client.create_run(exp_id, start_time=start_ms, run_name=r.trial_id, tags={TRIAL_TAG: r.trial_id})
        have_params: dict[str, str] = {}
        have_metrics: dict[str, float] = {}
    else:
        have_params, have_metrics = run.data.params, run.data.metrics
    run_id = run.info.run_id
    params = view.params()
    for key in sorted(k for k in params if k in have_params and have_params[k] != params[k]):
        log.warning("%s: MLflow keeps params once; %s stays %r (now %r)", r.trial_id, key, have_params[key],
                    params[key])
    metrics = [Metric(k, v, start_ms, 0) for k, v in view.metrics().items() if have_metrics.get(k) != v]
    for key, points in _curve_metrics(view).items():
        have = {(m.step, m.value) for m in client.get_metric_history(run_id, key)} if key in have_metrics else set()
        metrics += [Metric(key, value, start_ms + int(clock * 1000), step)
                    for step, clock, value in points if (step, value) not in have]
    _batched(client, run_id, metrics=metrics,
             params=[Param(k, v) for k, v in params.items() if k not in have_params],
             tags=[RunTag(k, v) for k, v in _tags(view).items()])
    record = tmp / "record.json"
    record.write_text(json.dumps(r.to_dict(), indent=1, sort_keys=True, default=str))
    client.log_artifact(run_id, str(record))
    if (view.sweep_dir / "report.html").is_file():
        client.log_artifact(run_id, str(view.sweep_dir / "report.html"))
    window = (r.speed.window_s if r.speed else 0.0) or 0.0
    end_ms = start_ms + int(1000 * ((view.row.get("train_time_s") or 0.0) + window))
    client.set_terminated(run_id, RUN_STATUS.get(r.status, "FAILED"), end_time=end_ms)


def _curve_metrics(view: TrialView) -> dict[str, list[tuple[int, float, float]]]:
    return {("train/loss" if name == "train_loss" else f"eval/{name}"): points
            for name, points in view.curves().items()}


def _tags(view: TrialView) -> dict[str, str]:
    r = view.record
    tags = {TRIAL_TAG: r.trial_id, "trainbench.sweep_id": view.sweep_id, "trainbench.status": r.status,
            "trainbench.kind": r.kind}
    if r.reason:
        tags["trainbench.reason"] = r.reason[:5000]
    commit = (view.env.get("git") or {}).get("commit")
    if commit:
        tags["mlflow.source.git.commit"] = str(commit)
    return tags


def _batched(client: Any, run_id: str, **items: list[Any]) -> None:
    """``log_batch`` within MLflow's per-call limits."""
    while any(items.values()):
        chunk = {k: v[:BATCH[k]] for k, v in items.items()}
        client.log_batch(run_id, **chunk)
        items = {k: v[BATCH[k]:] for k, v in items.items()}
