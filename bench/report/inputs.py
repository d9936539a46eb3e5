"""Reading ``results.jsonl`` for ``bench report`` and ``bench compare``: bad input stops with one line, never a
traceback.

- A record of the wrong shape (not an object, a missing or unknown field, a field of the wrong type, an unknown
  schema) raises ``InputError`` naming the file, the line and what is wrong; ``bench.results`` checks the structure
  and every value's type against the record's annotations, down to an eval curve's points.
- Whatever the message echoes from the file is cut to ``ECHO_CHARS``, so a corrupt line cannot flood a terminal.
- A trial id written twice (two sweeps once ran at the same time into one directory) is counted once, the first
  record kept; the caller shows ``duplicates_note`` so the reader knows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.analysis import InputError
from bench.results import ResultStore, TrialRecord

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
        return ResultStore(path).read()  # checks each record's shape and value types (bench.results)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # bench.results.RecordError too, and a file that is not UTF-8
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


__all__ = ["ECHO_CHARS", "blocking_file", "clip", "duplicates_note", "problem", "read_records", "unique_trials"]
