"""The Python API: run a sweep and read results from a notebook or a script (docs/api.md).

    import bench
    frame = bench.sweep(models=["my_model.py:build"], techniques=["bf16", "grad_accum:steps=4"], repeats=3)
    best = bench.tune("gpt:tiny", memory_limit="64MiB")       # tune.json's content, with "out": the directory
    frame = bench.load("runs/quick-20261201-120000")         # one row per trial, flat typed columns
    configs = bench.configurations(frame)                     # one row per workload x technique set
    bench.export("runs/quick-20261201-120000", to="mlflow")  # or parquet, csv, tensorboard (bench/exporters)

``sweep`` and ``tune`` take the CLI's options as keyword arguments and write the same directory (results.jsonl,
env.json, summary.md, report.md/html; tune.json and tune.md) through the same workflow (``bench.run.workflow``); bad
input raises ``bench.ConfigError`` with the CLI's one-line message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from bench.analyze import analysis
from bench.core.errors import ConfigError
from bench.records import columns, reader
from bench.records.frame import records_frame

if TYPE_CHECKING:
    from bench.report.exporters import Exported

log = logging.getLogger(__name__)

BUDGET_ARGS = {"steps": "train_steps", "eval_points": "eval_points", "seconds": "max_train_seconds",
               "window_steps": "min_steps", "window_seconds": "min_seconds", "timeout": "timeout_s",
               "memory": "memory"}


def sweep(
    workloads: str | Sequence[str] | None = None,
    techniques: str | Sequence[str] | None = None,
    *,
    models: str | Sequence[str] | None = None,
    blocks: str | None = None,
    technique_plugins: str | Sequence[str] | None = None,
    preset: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    extend: bool = False,
    device: str | None = None,
    on_trial: Callable[[Any], None] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Run a sweep (the CLI's ``sweep``) and return its trials as ``load`` does.

    ``workloads``, ``techniques``, ``models`` and ``technique_plugins`` take a comma string or a list, as
    ``--workloads``/``--techniques``/``--model``/``--technique`` do. Other options by the CLI's names:
    ``repeats``, ``max_repeats``, ``decide_within``, ``order``, ``seed``, ``mode``, ``threads``, ``nproc``, ``nnodes``,
    ``price_per_hour``, ``instance``, ``shard`` (``"0/2"``: this machine's part
    of a sweep split over several, docs/clusters.md), ``isolation`` (``"fork"``, the default, or ``"fresh"``: how
    each trial's process starts, docs/methodology.md), and the budget's ``steps``,
    ``eval_points``, ``seconds``, ``window_steps``, ``window_seconds``, ``timeout``, ``memory`` (bool).
    ``on_trial`` is called with a ``bench.run.runner.Progress`` after each trial. The report is written into ``out``
    (default: runs/<preset>-<UTC time>/), whose path is in the frame's ``attrs["out"]``.
    """
    from bench.plan.config import build_config
    from bench.run import workflow

    budget = {BUDGET_ARGS[k]: options.pop(k) for k in list(options) if k in BUDGET_ARGS}
    known = {"repeats", "max_repeats", "decide_within", "order", "seed", "mode", "threads", "nproc", "nnodes", "shard",
             "isolation", "price_per_hour", "instance"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"bench.sweep() got unknown option(s) {', '.join(unknown)} (valid: workloads, techniques, "
                          f"models, blocks, technique_plugins, preset, config, out, resume, extend, device, on_trial, "
                          f"{', '.join(sorted(known | set(BUDGET_ARGS)))})")
    overrides = {"workloads": _listed(workloads), "techniques": _listed(techniques), "models": _listed(models),
                 "blocks": blocks, "technique_plugins": _listed(technique_plugins), "device": device, **options,
                 "budget": budget or None}
    if options.get("nnodes", 1) != 1:
        raise ConfigError("bench.sweep() runs on this machine only (nnodes=1); for a multi-node sweep run "
                          "`python -m bench sweep --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` on every node")
    if extend and not resume:
        raise ConfigError("extend=True grows a sweep that exists: use it with resume=True and out=DIR")
    out_dir = Path(out) if out is not None else None
    config_path = Path(config) if config is not None else None
    if resume:
        if out_dir is None:
            raise ConfigError("resume=True needs out= (the sweep directory to continue)")
        if config_path is None and (out_dir / "sweep.toml").exists():
            config_path = out_dir / "sweep.toml"
    cfg = build_config(preset, overrides, config_path)
    done = workflow.sweep(cfg, out_dir, resume=resume, extend=extend, on_progress=on_trial,
                          command=f"bench.sweep(...) from Python ({_call_text(overrides, preset)})")
    frame = load(done.out_dir)
    frame.attrs["out"] = str(done.out_dir)
    return frame


TUNE_TRIAL_ARGS = {"steps": "train_steps", "seconds": "max_train_seconds", "window_steps": "min_steps",
                   "window_seconds": "min_seconds", "timeout": "timeout_s"}


def tune(
    workloads: str | Sequence[str] | None = None,
    *,
    models: str | Sequence[str] | None = None,
    blocks: str | None = None,
    technique_plugins: str | Sequence[str] | None = None,
    techniques: str | Sequence[str] | None = None,
    objective: str | None = None,
    memory_limit: str | int | None = None,
    quality: str | None = None,
    budget: float | None = None,
    max_repeats: int | None = None,
    preset: str | None = None,
    config: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    device: str | None = None,
    on_trial: Callable[[Any], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Search for the best technique set for one model (the CLI's ``tune``) and return its result.

    Writes what ``python -m bench tune`` writes (results.jsonl, env.json, sweep.toml, tune.toml, tune.json, tune.md
    and its figure, summary.md, report.md/html) into ``out`` (default: runs/tune-<UTC time>/). Returns tune.json's
    content (the recommended set, its comparisons, the trace, the frontier, what was not tried) with ``out`` added:
    the directory. ``recommended`` is None when no set was found (``stop`` says why; ``smallest_peak`` names the
    smallest peak when none fits under ``memory_limit``).

    ``workloads`` names ONE workload (or give ``models``, one); ``techniques`` restricts the candidates; ``objective``
    (throughput, time-to-target, memory), ``memory_limit`` ("512MiB" or bytes), ``quality`` (same, within=X, any),
    ``budget`` (seconds of trial time), ``max_repeats`` as the CLI's flags. Other options by the CLI's names:
    ``seed``, ``threads``, ``nproc`` and the trials' ``steps``, ``seconds``, ``window_steps``, ``window_seconds``,
    ``timeout``. ``on_trial`` is called with a ``bench.run.runner.Progress`` after each trial. Bad input raises
    ``bench.ConfigError`` with the CLI's one-line message, before anything is written.
    """
    from bench.run import tune_setup, workflow

    trial_budget = {TUNE_TRIAL_ARGS[k]: options.pop(k) for k in list(options) if k in TUNE_TRIAL_ARGS}
    known = {"seed", "threads", "nproc"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"bench.tune() got unknown option(s) {', '.join(unknown)} (valid: workloads, models, "
                          "blocks, technique_plugins, techniques, objective, memory_limit, quality, budget, "
                          "max_repeats, preset, config, out, resume, device, on_trial, "
                          f"{', '.join(sorted(known | set(TUNE_TRIAL_ARGS)))})")
    restrict = techniques if techniques is None or isinstance(techniques, str) else ",".join(techniques)
    given = {"objective": objective, "memory_limit": None if memory_limit is None else str(memory_limit),
             "quality": quality, "techniques": restrict, "budget": budget}
    overrides = {"workloads": _listed(workloads), "models": _listed(models), "blocks": blocks,
                 "technique_plugins": _listed(technique_plugins), "device": device, **options,
                 "budget": trial_budget or None}
    out_dir = Path(out) if out is not None else None
    setup = tune_setup.setup(given, overrides, preset=preset, config_path=Path(config) if config else None,
                             out_dir=out_dir, resume=resume, max_repeats=max_repeats)
    done = workflow.tune(setup, out_dir, resume=resume, on_progress=on_trial,
                         command=f"bench.tune(...) from Python ({_call_text({**given, **overrides}, preset)})")
    return {**done.result, "out": str(done.out_dir)}


def load(*dirs: str | Path) -> pd.DataFrame:
    """The trials of one or more sweep directories: one row per trial, the columns of
    ``bench.records.frame.RECORD_COLUMNS`` in the dtypes of ``bench.records.columns.COLUMN_DTYPES`` (both documented in
    docs/api.md: float64 with NaN, nullable Int64 and boolean, categoricals, UTC datetimes; nested values stay
    objects), read from each ``results.jsonl`` (and the machine from ``env.json``). Raises
    ``bench.records.reader.InputError`` when a directory holds no sweep."""
    if not dirs:
        raise ConfigError("bench.load() needs at least one sweep directory")
    return columns.typed(records_frame(reader.load([Path(d) for d in dirs])))


def configurations(frame: pd.DataFrame, baseline: str = analysis.BASELINE) -> pd.DataFrame:
    """One row per machine x workload x technique set from ``load``'s frame (or a filtered part of it): the
    speedups, memory ratios, quality differences and time-to-target with their intervals and verdicts, as the
    report shows them."""
    return analysis.configurations(columns.untyped(frame), baseline)


def export(*dirs: str | Path, to: str, out: str | Path | None = None) -> Exported:
    """Write the trials of sweep directories to ``to`` (``parquet``, ``csv``, ``mlflow`` or ``tensorboard``) at
    ``out`` (default: inside the one directory given); returns a ``bench.report.exporters.Exported`` saying where and how
    many. A target whose package is missing raises ``bench.report.exporters.MissingExtra`` (a ``ConfigError``) naming the
    extra to install. See docs/api.md."""
    from bench.report.exporters import export as export_dirs

    return export_dirs([Path(d) for d in dirs], to, out)


def _listed(value: str | Sequence[str] | None) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    return list(value)


def _call_text(overrides: dict[str, Any], preset: str | None) -> str:
    given = {"preset": preset, **overrides}  # no preset: the device's default (build_config), as the call said
    return ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)
