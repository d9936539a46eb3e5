"""What every export target says about a trial: its parameters, its single-number metrics and its curves.

One place, so MLflow's run and TensorBoard's event file name the same things the same way (docs/api.md lists them).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.records.reader import Sweep
from bench.records.results import TrialRecord

# (metric name, frame column): the numbers of a trial worth a column in a tracking tool's table.
SCALAR_METRICS = (
    ("samples_per_s", "samples_per_s"), ("samples_per_s_per_device", "samples_per_s_per_device"),
    ("tokens_per_s", "tokens_per_s"), ("step_time_median_s", "step_time_s"), ("step_time_iqr_s", "step_time_iqr_s"),
    ("first_step_s", "first_step_s"), ("one_off_s", "one_off_s"), ("peak_bytes", "peak_bytes"),
    ("peak_rss_bytes", "peak_rss_bytes"), ("achieved_flops", "achieved_flops"), ("mfu", "mfu"),
    ("mfu_datasheet", "mfu_datasheet"), ("train_time_s", "train_time_s"), ("time_to_target_s", "time_to_target_s"),
    ("time_to_target_one_off_s", "time_to_target_one_off_s"), ("samples_to_target", "samples_to_target"),
    ("steps_to_target", "steps_to_target"), ("energy_j", "energy_j"), ("parity_loss_diff", "parity_loss_diff"),
)
# The speed window's per-step times as the record keeps them (a summary: the record has no step-by-step list).
STEP_TIME_STATS = ("median", "iqr", "min", "max", "mean")


@dataclass
class TrialView:
    """One trial as an exporter sees it: its record, its row of ``bench.load``'s frame, its sweep's environment."""

    record: TrialRecord
    row: dict[str, Any]
    env: dict[str, Any]
    sweep_dir: Path

    @property
    def sweep_id(self) -> str:
        return self.record.sweep_id or self.sweep_dir.name

    @property
    def start_s(self) -> float:
        """The trial's start (UNIX seconds), so re-exports write the same timestamps; the sweep's when unknown."""
        for stamp in (self.record.timestamp_utc, self.env.get("timestamp_utc")):
            try:
                return dt.datetime.fromisoformat(stamp).timestamp()
            except (TypeError, ValueError):  # "" (a bare record), None, not a time
                continue
        return 0.0

    def params(self) -> dict[str, str]:
        """Workload, size, technique set and each technique's options, seed, device, commit, and the rest of what
        the trial ran as, as text."""
        r, wl = self.record, self.record.workload or {}
        git = self.env.get("git") or {}
        values: dict[str, Any] = {
            "workload": wl.get("name"), "size": wl.get("size"), "techniques": r.technique_label,
            "seed": r.seed, "repeat": r.repeat, "device": r.device, "world_size": r.world_size, "mode": r.mode,
            "kind": r.kind, "batch_size": self.row.get("batch_size"), "n_params": self.row.get("n_params"),
            "metric": self.row.get("metric"), "target": self.row.get("target"),
            "compute_dtype": self.row.get("compute_dtype"), "commit": git.get("commit"),
            "commit_dirty": git.get("dirty"), "torch": self.env.get("torch"), "machine": self.row.get("machine"),
        }
        for tech in r.techniques:
            for key, value in sorted((tech.get("options") or {}).items()):
                values[f"option.{tech.get('name')}.{key}"] = value
        return {k: str(v) for k, v in values.items() if v is not None}

    def metrics(self) -> dict[str, float]:
        """The single-number results that were measured (a missing one is left out, never written as 0)."""
        values = {name: self.row.get(col) for name, col in SCALAR_METRICS}
        metric = self.row.get("metric")
        if metric:
            values[f"final_{metric}"] = self.row.get("final")
        if self.record.quality is not None and self.record.quality.target is not None:
            values["target_reached"] = float(self.record.quality.samples_to_target is not None)
        steps = self.record.speed.step_time_s if self.record.speed else None
        for stat in STEP_TIME_STATS if steps else ():
            values[f"step_time_{stat}_s"] = getattr(steps, stat)
        return {k: float(v) for k, v in values.items() if _number(v)}

    def curves(self) -> dict[str, list[tuple[int, float, float]]]:
        """``{"train_loss": [...], METRIC: [...]}`` of the quality run: (samples trained, training clock in
        seconds, value) per evaluation. The x is samples, the same for every technique set of a workload (their
        optimizer steps differ where a set changes the batch)."""
        q = self.record.quality
        if q is None or not q.curve:
            return {}
        cols = list(q.curve_columns)
        x = next((cols.index(c) for c in ("samples", "steps", "step") if c in cols), None)
        if x is None:
            return {}
        clock = cols.index("train_time_s") if "train_time_s" in cols else None
        out: dict[str, list[tuple[int, float, float]]] = {}
        for name in ("train_loss", q.metric):
            if name not in cols:
                continue
            i = cols.index(name)
            points = [(int(p[x]), float(p[clock]) if clock is not None and _number(p[clock]) else 0.0, float(p[i]))
                      for p in q.curve if _number(p[i]) and _number(p[x])]
            if points:
                out[name] = points
        return out


def _number(value: Any) -> bool:
    if value is None:
        return False
    try:
        return not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def trial_views(sweep: Sweep, frame_rows: list[dict[str, Any]]) -> Iterator[TrialView]:
    """The trials of a loaded sweep beside their rows of the frame (``records_frame`` keeps the records' order)."""
    records = [(s, r) for s in sweep.sources for r in s.records]
    for (source, record), row in zip(records, frame_rows, strict=True):
        yield TrialView(record, row, source.env, source.path)
