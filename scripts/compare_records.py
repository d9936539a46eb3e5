"""Two sweeps' records compared field by field, by trial id: which fields differ, in how many trials, and which
exist on one side only. For a change that must not move what is recorded (a refactor, a faster harness): run the
same sweep with the old and the new code and read what differs; only measured times should.

    .venv/bin/python scripts/compare_records.py OLD_DIR NEW_DIR

(reports/example-cpu-trial-cost/README.md shows one such comparison.)
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def flat(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, leaf) pairs; a list of numbers is one leaf, a list of objects is indexed."""
    if isinstance(value, dict):
        for key, v in value.items():
            yield from flat(v, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        for i, v in enumerate(value):
            yield from flat(v, f"{prefix}[{i}]")
    else:
        yield prefix, value


def records(sweep_dir: str) -> dict[str, dict]:
    path = Path(sweep_dir) / "results.jsonl"
    if not path.is_file():
        sys.exit(f"compare_records: {path} does not exist (give two directories a sweep wrote)")
    return {r["trial_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def main(old_dir: str, new_dir: str) -> None:
    old, new = records(old_dir), records(new_dir)
    both = sorted(set(old) & set(new))
    print(f"trials: {len(old)} old, {len(new)} new, {len(both)} in both; only old: {sorted(set(old) - set(new))}; "
          f"only new: {sorted(set(new) - set(old))}")
    differ: collections.Counter = collections.Counter()
    equal: set[str] = set()
    one_side: collections.Counter = collections.Counter()
    for trial in both:
        a, b = dict(flat(old[trial])), dict(flat(new[trial]))
        for key in a.keys() | b.keys():
            if key not in a or key not in b:
                one_side[(key, "old" if key in a else "new")] += 1
            elif a[key] == b[key]:
                equal.add(key)
            else:
                differ[key] += 1
    print(f"fields equal in every trial: {len(equal - set(differ))}")
    print("fields that differ (in how many trials):")
    for key, n in sorted(differ.items()):
        print(f"  {key}: {n}")
    print("fields on one side only:")
    for (key, side), n in sorted(one_side.items()):
        print(f"  {key} ({side}): {n}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: scripts/compare_records.py OLD_DIR NEW_DIR (two directories a sweep wrote)")
    main(sys.argv[1], sys.argv[2])
