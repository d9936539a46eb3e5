"""A report's "Reproduce" line: the command that made a sweep, written so that it makes the same sweep again.

env.json records the command as it was typed. Three things in it can stop meaning what they meant then:

- ``--out`` may name a temporary directory (``--out /tmp/quick-auto8``): the line names the report's own directory.
- a setting left to the preset follows the preset's value of today, not of the day the sweep ran (the quick preset's
  ``repeats`` became ``auto`` after ``reports/example-cpu`` was made with 3 fixed repeats): a sweep's line loads the
  settings it resolved and recorded, ``--config DIR/sweep.toml``, so every setting the command did not give is
  pinned too. A ``--config`` the command named (often a temporary file) is replaced by that recorded one. A sweep
  of ``--model`` or ``--technique`` files records them by their absolute paths on the machine that ran it, so its
  line keeps its own flags and pins the repeats design alone (``--repeats 3``).
- ``--resume`` and ``--extend`` continued a sweep that exists; to make it again they are dropped.

The flags the command gave are kept as typed: they are what its author chose, and they equal the recorded settings
(``tests/test_docs.py`` checks that each committed report's line resolves to its recorded sweep.toml).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from bench.core.files import REPO_DIR

DROPPED = ("--resume", "--extend")  # flags without a value that continue a sweep rather than make one
REPLACED = ("--out", "--config")  # flags with a value that the line rewrites


def shown_path(path: Path, root: Path = REPO_DIR) -> str:
    """``path`` relative to the repository when it lies inside it (``reports/example-cpu``), else as given."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def command(recorded: str | None, directory: Path, settings: dict[str, Any] | None = None,
            root: Path = REPO_DIR) -> str | None:
    """The line that makes the sweep in ``directory`` again, from the ``recorded`` command (env.json's); None when
    nothing was recorded. ``settings`` is the sweep.toml the sweep wrote (None: there is none to pin with)."""
    if not recorded:
        return None
    try:
        words = shlex.split(recorded)
    except ValueError:  # not a command line we can take apart: shown as it was recorded
        return recorded
    if words[:3] != ["python", "-m", "bench"] or len(words) < 4 or words[3] not in ("sweep", "tune"):
        return recorded
    kept, skip = [], False
    for word in words[4:]:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in REPLACED and (name != "--config" or words[3] == "sweep"):
            skip = "=" not in word
            continue
        if word in DROPPED:
            continue
        kept.append(word)
    here = shown_path(directory, root)
    if words[3] == "sweep" and settings is not None:
        kept += _pinned(kept, settings, f"{here}/sweep.toml")
    return shlex.join([*words[:4], *kept, "--out", here])


def _pinned(given: list[str], settings: dict[str, Any], toml: str) -> list[str]:
    """The flags that pin what ``given`` left to the preset: the recorded sweep.toml; or, where it names a model or
    technique file by the path it had on the machine that ran it (not portable), the repeats design alone."""
    if not (settings.get("models") or settings.get("technique_plugins")):
        return ["--config", toml]
    if any(w.split("=", 1)[0] == "--repeats" for w in given) or "repeats" not in settings:
        return []
    cap = settings.get("max_repeats") or 0
    return ["--repeats", str(settings["repeats"]), *(["--max-repeats", str(cap)] if cap else [])]
