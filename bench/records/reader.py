"""The one reader of sweep directories: ``results.jsonl``, ``env.json`` and ``sweep.toml``, for the analysis, the
report, ``bench compare``, the exporters and ``bench.load``. Bad input stops with one line, never a traceback.

- ``load(dirs)`` reads one or more sweep directories into a ``Sweep``: each directory once, each trial id once per
  directory, with ``notes`` on what was dropped and which shards of a split sweep are here.

- A record of the wrong shape (not an object, a missing or unknown field, a field of the wrong type, an unknown
  schema) raises ``InputError`` naming the file, the line and what is wrong; ``bench.records.results`` checks the structure
  and every value's type against the record's annotations, down to an eval curve's points.
- Whatever the message echoes from the file is cut to ``ECHO_CHARS``, so a corrupt line cannot flood a terminal.
- A trial id written twice (two sweeps once ran at the same time into one directory) is counted once, the first
  record kept; the caller shows ``duplicates_note`` so the reader knows.
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.records.results import ResultStore, TrialRecord


class InputError(ValueError):
    """The report's input is unusable (no results.jsonl, unknown reference set): the message says what to do."""


log = logging.getLogger(__name__)

ECHO_CHARS = 80
_QUOTED_RE = re.compile(r"'[^']*'|\"[^\"]*\"")


def clip(text: object, limit: int = ECHO_CHARS) -> str:
    """One line; every quoted string and every long word cut to ``limit`` characters, the whole to 3 x ``limit``."""
    s = " ".join(str(text).split())
    s = _QUOTED_RE.sub(lambda m: _cut(m.group(0), limit), s)
    s = " ".join(_cut(word, limit) for word in s.split(" "))
    return _cut(s, 3 * limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def problem(path: Path, exc: BaseException) -> str:
    """``PATH:LINE: what is wrong`` from a reader's exception, the path kept whole and the rest clipped."""
    text = " ".join(str(exc).split())
    prefix = f"{path}:"
    if text.startswith(prefix):  # ResultStore's own "PATH:LINE: ..." (the path may be long: it is not input)
        return prefix + clip(text[len(prefix):])
    return f"{path}: {clip(text)}"


def read_records(path: Path | str) -> list[TrialRecord]:
    """Every record of one ``results.jsonl``; ``InputError`` for the first line of the wrong shape."""
    path = Path(path)
    try:
        return ResultStore(path).read()  # checks each record's shape and value types (bench.records.results)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # bench.records.results.RecordError too, and a file that is not UTF-8
        raise InputError(problem(path, exc)) from None


def unique_trials(records: Sequence[TrialRecord]) -> tuple[list[TrialRecord], int]:
    """The first record of each trial id, in file order, and how many trial ids occurred more than once."""
    first: dict[Any, TrialRecord] = {}
    repeated: set[Any] = set()
    for r in records:
        if r.trial_id in first:
            repeated.add(r.trial_id)
        else:
            first[r.trial_id] = r
    return list(first.values()), len(repeated)


def duplicates_note(path: Path | str, count: int) -> str:
    ids = "trial id" if count == 1 else "trial ids"
    return (f"{path} holds {count} duplicated {ids} (a second sweep wrote into the same directory?); each was "
            "counted once, the first record kept")


def blocking_file(path: Path) -> Path | None:
    """``path`` or its nearest existing parent when that is not a directory: nothing can be written there (checked
    up front, so a long analysis does not end in a mkdir error)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    return None if existing.is_dir() else existing


# ---- sweeps -------------------------------------------------------------------------------------------------


@dataclass
class Source:
    """One sweep directory: its records, environment and (when present) resolved sweep settings."""

    path: Path
    records: list[TrialRecord]
    env: dict[str, Any]
    settings: dict[str, Any] | None = None
    machine: str = ""

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class Sweep:
    """Records of one or more sweeps. ``machines`` maps each machine label to the environment it came from;
    ``notes`` say what the reader dropped (a directory given twice, duplicated trial ids) and which shards are
    here."""

    sources: list[Source]
    machines: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def records(self) -> list[TrialRecord]:
        return [r for s in self.sources for r in s.records]


def load(dirs: Sequence[Path | str], strict_env: bool = True) -> Sweep:
    """The sweeps in ``dirs``: ``results.jsonl`` (required; every record's shape and value types checked),
    ``env.json`` and ``sweep.toml`` (optional). ``InputError`` (one line: file, line, what is wrong) for bad input;
    with ``strict_env=False`` an unreadable env.json is warned about and left out, as ``bench compare`` wants.

    Trials are keyed by (directory, trial id): a directory given twice is read once, and within a directory the
    first record of a trial id is kept. The same trial id in two directories is two trials (two sweeps, two
    machines, the two sides of an A/B run).
    """
    unique: dict[Path, Path] = {}
    notes = []
    for d in map(Path, dirs):
        if d.resolve() in unique:
            notes.append(f"{d} was given twice; its trials were counted once")
        else:
            unique[d.resolve()] = d
    sources = [read_source(path, strict_env) for path in unique.values()]
    for source in sources:
        source.records, repeated = unique_trials(source.records)
        if repeated:
            notes.append(duplicates_note(source.path / "results.jsonl", repeated))
    machines: dict[str, dict[str, Any]] = {}
    for s in sources:
        machines.setdefault(s.machine, s.env)
    sweep = Sweep(sources, machines, notes)
    sweep.notes.extend(shard_notes(sweep))
    return sweep


def read_source(path: Path | str, strict_env: bool = True) -> Source:
    """One sweep directory as it is on disk (duplicates kept: ``load`` drops them)."""
    path = Path(path)
    results = path / "results.jsonl"
    if not results.is_file():
        raise InputError(f"{path} has no results.jsonl (give the directory a sweep wrote, e.g. runs/quick-...)")
    records = read_records(results)
    env = _read_env(path / "env.json", strict_env)
    settings = None
    if (path / "sweep.toml").is_file():
        try:
            settings = tomllib.loads((path / "sweep.toml").read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
            log.warning("ignoring an unreadable %s", path / "sweep.toml")
    device = records[0].device if records else env.get("device", "?")
    return Source(path, records, env, settings, machine_label(env, device))


def _read_env(path: Path, strict: bool) -> dict[str, Any]:
    if not path.is_file():
        log.warning("%s has no env.json: the report cannot say which machine it ran on", path.parent)
        return {}
    try:
        env = json.loads(path.read_text())
        if not isinstance(env, dict):
            raise InputError(f"{path} holds a {type(env).__name__}, not a JSON object")
    except (ValueError, OSError) as exc:  # not JSON, not UTF-8, not a file (InputError is a ValueError too)
        if not strict:
            log.warning("cannot read %s: %s", path, exc)
            return {}
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{path} is not valid JSON ({exc}): rewrite or remove it") from None
    return env


def machine_label(env: dict[str, Any], device: str) -> str:
    """A short, stable name for the machine and software a sweep ran on; sweeps with different labels are kept
    apart in every statistic."""
    if not env:
        return f"{device}, unknown machine (no env.json)"
    gpu = env.get("gpu") or {}
    if str(device).startswith("cuda") and gpu:
        count = gpu.get("count") or 1
        hw = f"{count} x {gpu.get('name')}" if count > 1 else str(gpu.get("name"))
    else:
        cores = env.get("cpu_affinity") or env.get("cpu_logical")
        hw = f"{env.get('cpu_model') or 'unknown CPU'}" + (f" ({cores} cores)" if cores else "")
    parts = [str(device), hw]
    if env.get("hostname"):
        parts.append(f"host {env['hostname']}")
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return ", ".join(parts)


def shard_notes(sweep: Sweep) -> list[str]:
    """What a reader of a sharded sweep must know: which shards are here, and which are missing."""
    shards: dict[int, set[int]] = {}
    for source in sweep.sources:
        text = (source.settings or {}).get("shard")
        index, _, count = str(text or "").partition("/")
        if index.isdigit() and count.isdigit():
            shards.setdefault(int(count), set()).add(int(index))
    notes = []
    for count, present in sorted(shards.items()):
        missing = sorted(set(range(count)) - present)
        listed = ", ".join(f"{i}/{count}" for i in sorted(present))
        if missing:
            notes.append(f"this report holds shard(s) {listed} of a sweep split in {count}: the workloads of shard(s) "
                         f"{', '.join(f'{i}/{count}' for i in missing)} are not in it (give every shard's directory)")
        else:
            notes.append(f"shards {listed} merged: each shard ran whole workloads (all their technique sets and "
                         "repeats), so no comparison pairs trials of two shards")
    return notes


__all__ = ["ECHO_CHARS", "InputError", "Source", "Sweep", "load", "machine_label", "read_source", "shard_notes", "blocking_file", "clip", "duplicates_note", "problem", "read_records", "unique_trials"]
