"""What ``bench tune``'s options resolve to before anything runs: the search's options (given, else what a resumed
directory's ``tune.toml`` recorded, else the defaults), the sweep config its trials run under, the candidates and
the search's ``Settings`` (``bench.run.tune``). Bad input raises ``ConfigError`` on the way, checked in the order
the options are read, so the first problem is the one reported.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import workloads
from bench.core.errors import ConfigError
from bench.core.files import write_atomic
from bench.plan.config import (
    DEFAULT_MAX_REPEATS,
    SweepConfig,
    TechniqueSet,
    build_config,
    parse_technique_sets,
)
from bench.plan.planner import incompatibility, resolve_device, world_size_for
from bench.run import tune

if TYPE_CHECKING:
    import torch

TUNE_FILE = "tune.toml"  # the search's own settings beside sweep.toml (what --resume reads back)
SEARCH_OPTIONS = ("objective", "memory_limit", "quality", "techniques", "budget")  # recorded in TUNE_FILE


@dataclass
class Setup:
    """What ``tune``'s options resolve to before anything runs."""

    opts: dict  # the search's options (SEARCH_OPTIONS), as TUNE_FILE records them
    cfg: SweepConfig  # the trials' sweep config
    settings: tune.Settings
    refuse: Callable[[TechniqueSet], str | None]  # the planner's reason a set cannot run here, or None
    kinds: dict[str, str]  # candidate label -> kind
    device: torch.device
    limit: int | None  # --memory-limit in bytes


def options(given: dict[str, Any], out_dir: Path | None, resume: bool) -> dict[str, Any]:
    """The search's options: ``given`` (None: not given), else (on resume) what ``out_dir`` recorded, else the
    defaults. A resume may raise the budget; any other option that differs from the recorded one is refused."""
    import tomllib

    stored: dict = {}
    if resume:
        path = out_dir / TUNE_FILE
        if not path.is_file():
            raise ConfigError(f"--resume --out {out_dir}: no {TUNE_FILE} there, so no search to continue (a sweep "
                              "directory resumes with `bench sweep --resume`)")
        try:
            stored = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--resume: {path} is not valid TOML ({exc}); restore it or start a new --out") from None
        for key, value in given.items():
            if key != "budget" and value is not None and key in stored and str(stored[key]) != str(value):
                raise ConfigError(f"--resume: --{key.replace('_', '-')} {value} differs from the search's "
                                  f"{stored[key]} in {out_dir}; resume without it, or start a new --out")
            if key != "budget" and value is not None and key not in stored:
                raise ConfigError(f"--resume: the search in {out_dir} ran without --{key.replace('_', '-')}; "
                                  "resume without it, or start a new --out")
    merged = {**stored, **{k: v for k, v in given.items() if v is not None}}
    return {"objective": merged.get("objective", "throughput"), "memory_limit": merged.get("memory_limit"),
            "quality": merged.get("quality", "same"), "techniques": merged.get("techniques"),
            "budget": merged.get("budget")}


def write_options(out_dir: Path, opts: dict[str, Any]) -> None:
    """TUNE_FILE: the options given, so that ``--resume`` continues the same search."""
    import tomli_w

    write_atomic(out_dir / TUNE_FILE, tomli_w.dumps({k: v for k, v in opts.items() if v is not None}))


def setup(given: dict[str, Any], overrides: dict[str, Any], *, preset: str | None, config_path: Path | None,
          out_dir: Path | None, resume: bool, max_repeats: int | None) -> Setup:
    """The search's options (``given``, see ``options``), and the sweep config of its trials: ``preset`` (default
    quick), then ``config_path`` (resuming: the directory's sweep.toml), then ``overrides`` (``build_config``'s)."""
    if resume and out_dir is None:
        raise ConfigError("--resume needs --out DIR (the tune directory to continue)")
    opts = options(given, out_dir, resume)
    goal = tune.objective_of(opts["objective"])
    limit = tune.parse_size(opts["memory_limit"]) if opts["memory_limit"] is not None else None
    quality = tune.Quality.parse(opts["quality"])
    if opts["budget"] is not None and not (math.isfinite(opts["budget"]) and opts["budget"] > 0):
        raise ConfigError(f"--budget must be a number of seconds > 0, got {opts['budget']}")
    if max_repeats is not None and not 3 <= max_repeats <= 200:
        raise ConfigError(f"--max-repeats must be between 3 (the fewest pairs that give a verdict) and 200, got "
                          f"{max_repeats}")
    cfg = _config(overrides, preset, config_path, out_dir, resume, goal)
    workload = cfg.workloads[0]
    device = resolve_device(cfg.device)
    world = cfg.world_size

    def refuse(techs: TechniqueSet) -> str | None:
        return incompatibility(techs, workload, device, world_size_for(techs, world))

    restrict = parse_technique_sets(opts["techniques"]) if opts["techniques"] else None
    singles, skipped = tune.candidate_singles(workload, refuse, restrict)
    kinds = {s.label: _kind(s) for s in singles}
    quality_runs = goal.mode == "both" or (quality.rule != "any" and any(k != "exact" for k in kinds.values()))
    cap = max_repeats or (cfg.max_repeats if resume and cfg.max_repeats else DEFAULT_MAX_REPEATS)
    cfg = dataclasses.replace(cfg, name="tune", techniques=tuple(singles) or (tune.BASELINE,), repeats=3,
                              max_repeats=cap, mode="both" if quality_runs else "speed")
    settings = tune.Settings(workload, tuple(singles), goal.name, limit, quality, cap, opts["budget"], cfg.seed,
                             cfg.world_size, tuple(skipped))
    return Setup(opts, cfg, settings, refuse, kinds, device, limit)


def _config(overrides: dict[str, Any], preset: str | None, config_path: Path | None, out_dir: Path | None,
            resume: bool, goal: tune.Objective) -> SweepConfig:
    """The sweep config as given, checked to name one workload (with a target, for time-to-target)."""
    if resume and config_path is None and (out_dir / "sweep.toml").exists():
        config_path = out_dir / "sweep.toml"
    if not resume and not overrides.get("workloads") and not overrides.get("models") and config_path is None:
        raise ConfigError("name the workload to tune (--workloads gpt:small) or give --model PATH.py:FUNCTION")
    cfg = build_config(preset or "quick", overrides, config_path)
    if len(cfg.workloads) != 1:
        raise ConfigError(f"tune searches for one model; got {len(cfg.workloads)} workloads "
                          f"({', '.join(w.label for w in cfg.workloads)}): give one --workloads NAME[:SIZE] or one "
                          "--model")
    workload = cfg.workloads[0]
    if goal.name == "time-to-target" and workloads.get(workload.name).size_params(workload.size).get("target") is None:
        raise ConfigError(f"--objective time-to-target: workload {workload.label} documents no target (its "
                          "build's result may give one: docs/models.md); use throughput or memory")
    return cfg


def _kind(techs: TechniqueSet) -> str:
    from techniques.base import set_kind

    return set_kind(x.resolve() for x in techs.specs).value
