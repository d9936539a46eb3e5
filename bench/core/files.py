"""Files the harness writes: whole or not at all.

A reader (a report, a resumed sweep, another node) never sees a half-written ``env.json``, ``sweep.toml``, summary,
report or trial record: each is written to a temporary file beside its destination and moved over it with
``os.replace``, which is atomic on POSIX filesystems. ``results.jsonl`` is the exception: it is appended to, one
fsync'd line per record (``bench.records.results.ResultStore``).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

# The checkout this package runs from: reports/, docs/ and the trial processes' working directory hang off it.
REPO_DIR = Path(__file__).resolve().parents[2]
# Where a user's sweeps, tunes and profiles go by default (git-ignored), apart from the committed examples in reports/.
RUNS_DIR = REPO_DIR / "runs"


def write_atomic(path: Path | str, data: str | bytes, encoding: str = "utf-8") -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old content or all of the new."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding=encoding)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


__all__ = ["write_atomic"]


def save_torch_atomic(path: Path | str, obj: Any) -> None:
    """``torch.save(obj)`` to ``path`` whole or not at all (a cache entry other trials may be loading), creating its
    directory."""
    import torch  # lazily: the reporting side of the harness imports this module without needing torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_atomic(path, buf.getvalue())
