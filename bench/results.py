"""The trial record (one JSON line per trial, versioned) and the append-only JSONL store.

Units are in the field names or fixed: seconds, bytes, FLOPs, joules. A record is written once and never
rewritten; a sweep that resumes reads the store to know which trials are done.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
STATUSES = ("ok", "skipped", "failed", "oom", "timeout", "diverged")


@dataclass
class TrialRecord:
    """Everything one trial measured. Sections that were not measured are empty dicts or None, never guesses."""

    sweep_id: str
    trial_id: str
    workload: dict[str, Any]  # name, size, dataset {...}, params {...}
    techniques: list[dict[str, Any]]  # [{name, options}], empty for the baseline
    technique_label: str  # "bf16+grad_accum:steps=4" or "baseline"
    seed: int
    repeat: int
    world_size: int
    device: str
    status: str
    reason: str | None = None
    timestamp_utc: str = ""
    timing: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    energy: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] = field(default_factory=dict)
    env_ref: str = "env.json"
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got '{self.status}'")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False, default=_jsonable)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"record schema_version {version} is not supported (this trainbench reads {SCHEMA_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"record has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**data)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__} in a record")


def sanitize(value: Any) -> Any:
    """Replace NaN/inf floats with None so records stay strict JSON (a diverged loss is said in ``status``)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: sanitize(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [sanitize(v) for v in value]
    return value


class ResultStore:
    """``results.jsonl``: append-only, one record per line, fsync'd so an interrupted sweep loses nothing written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = record.to_json()
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def repair_tail(self) -> bool:
        """Drop a last line cut short by an interrupted write, so appends start on a fresh line. True if cut."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        data = self.path.read_bytes()
        if data.endswith(b"\n"):
            return False
        keep = data.rfind(b"\n") + 1
        log.warning("dropping %d bytes of a half-written last record in %s", len(data) - keep, self.path)
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
        return True

    def read(self) -> list[TrialRecord]:
        return list(self.iter_records())

    def iter_records(self) -> Iterable[TrialRecord]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            lines = fh.readlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield TrialRecord.from_dict(json.loads(line))
            except json.JSONDecodeError:
                # Only the last line can be cut short by an interrupted write; anything else is corruption.
                if number == len(lines):
                    log.warning("ignoring a truncated last line in %s", self.path)
                    continue
                raise ValueError(f"{self.path}:{number} is not valid JSON") from None

    def done_trial_ids(self) -> set[str]:
        return {r.trial_id for r in self.iter_records()}
