"""A sweep's trials in the tools people already use (``python -m bench export``, ``bench.export(...)``).

- ``parquet`` / ``csv``: ``bench.load``'s typed frame, one row per trial; nested columns (curves, tuples, dicts) as
  JSON text, since neither format has one type for them. Parquet keeps every other dtype (pyarrow: the
  ``parquet`` extra).
- ``mlflow``: one experiment per sweep, one run per trial (params, metrics, the eval curve, the report and the
  record as artifacts) in a local SQLite or file tracking store, no server (``bench.report.exporters.to_mlflow``).
- ``tensorboard``: event files, one run directory per trial (``bench.report.exporters.to_tensorboard``).

Each target that needs a package checks for it first: without it, ``MissingExtra`` names the extra to install.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.core.errors import ConfigError
from bench.records.export_targets import DEFAULT_OUT, EXTRAS, TARGETS

log = logging.getLogger(__name__)


class MissingExtra(ConfigError):
    """An export target's package is not installed: the message names the extra that brings it."""


@dataclass(frozen=True)
class Exported:
    """Where an export went: ``where`` (a path or a tracking URI), ``trials`` written, of them ``created`` new and
    ``updated`` already there (MLflow runs, TensorBoard run directories), and ``view``: how to look at it."""

    target: str
    where: str
    trials: int
    created: int
    updated: int
    view: str


def require(target: str, modules: Sequence[str] | None = None) -> None:
    """Raise ``MissingExtra`` unless the target's packages import."""
    extra, needed = EXTRAS[target]
    for module in modules or needed:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtra(f"--to {target} needs the {module} package: pip install 'trainbench[{extra}]'"
                               ) from None


def export(dirs: Sequence[Path | str], to: str, out: Path | str | None = None) -> Exported:
    """Write the trials of ``dirs`` to target ``to`` at ``out`` (default: ``DEFAULT_OUT`` inside the one directory
    given). Bad input raises ``ConfigError`` (``MissingExtra`` for a missing package) or
    ``bench.records.reader.InputError`` (a directory without a sweep) before anything is written."""
    if to not in TARGETS:
        raise ConfigError(f"unknown export target '{to}' (valid: {', '.join(TARGETS)})")
    if not dirs:
        raise ConfigError("export needs at least one sweep directory")
    if to in EXTRAS:
        require(to)
    if out is None:
        if len(dirs) > 1:
            raise ConfigError(f"--out is required when exporting several directories (e.g. --out {DEFAULT_OUT[to]})")
        out = Path(dirs[0]) / DEFAULT_OUT[to]
    from bench.records import columns, reader

    sweep = reader.load(dirs)
    for note in sweep.notes:
        log.warning("%s", note)
    from bench.records.frame import records_frame

    raw = records_frame(sweep)
    if to in ("parquet", "csv"):
        path = _file_out(Path(out), to)
        write_table(columns.typed(raw), path, to)
        return Exported(to, str(path), len(raw), len(raw), 0, f"pandas.read_{to}({str(path)!r})")
    from bench.report.exporters.trials import trial_views

    views = list(trial_views(sweep, raw.to_dict("records")))
    if to == "mlflow":
        from bench.report.exporters import to_mlflow

        return to_mlflow.export(views, out)
    from bench.report.exporters import to_tensorboard

    return to_tensorboard.export(views, Path(out))


def _file_out(path: Path, to: str) -> Path:
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory: give the {to} file to write, e.g. {path / DEFAULT_OUT[to]}")
    existing = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"cannot write {path}: {existing} is a file, not a directory")
    return path


def flat(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its nested (object) columns as JSON text (tuples become lists), every other column as is."""
    out = frame.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = pd.array([None if v is None else json.dumps(v, default=str) for v in out[col]],
                                dtype="string")
    return out


def write_table(frame: pd.DataFrame, path: Path, to: str) -> None:
    """``frame`` (typed) as Parquet or CSV, whole or not at all."""
    from bench.core.files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    table = flat(frame)
    if to == "csv":
        write_atomic(path, table.to_csv(index=False))
    else:
        write_atomic(path, table.to_parquet(engine="pyarrow", index=False))


def read_parquet(path: Path | str) -> pd.DataFrame:
    """A Parquet export read back as ``bench.load`` gave it: the nested columns' JSON parsed again (lists where
    the frame had tuples)."""
    from bench.records.columns import COLUMN_DTYPES, OBJECT

    frame = pd.read_parquet(path, engine="pyarrow")
    for col in frame.columns:
        if COLUMN_DTYPES.get(col) == OBJECT:
            frame[col] = pd.Series([None if pd.isna(v) else json.loads(v) for v in frame[col]],
                                   index=frame.index, dtype=object)
    return frame


__all__ = ["DEFAULT_OUT", "EXTRAS", "TARGETS", "Exported", "MissingExtra", "export", "flat", "read_parquet",
           "require", "write_table"]
