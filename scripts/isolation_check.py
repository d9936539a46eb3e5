"""Two sweeps of one plan, one run with ``--isolation fork`` and one with ``--isolation fresh`` (or the two sides of
``bench sweep --ab . --ab-isolation fresh``), checked for what must not move between them:

- quality, bit for bit: the eval curves' losses and metrics, the final metric, steps and samples to target, parity's
  losses and distances, the tensor memory breakdown, FLOPs per step, parameter counts and status. Trials that
  compiled with TorchInductor (``caches.inductor`` in their records) are reported apart: compiled CPU code is not
  bitwise deterministic from process to process in either mode, so they are held to a
  relative difference of ``--compiled-rtol`` instead;
- memory, within ``--memory-rtol``: the window's peak RSS and the clean pass's RSS at rest and peak, trial by
  trial (their ratio fork / fresh), the figures the fork server's page mapping exists for.

Speed is not checked here: ``bench compare A B`` judges it with intervals (the A/B run writes compare.md).

    .venv/bin/python scripts/isolation_check.py FORK_DIR FRESH_DIR

Exit code 0 when everything agrees, 1 when something differs (each difference is printed), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

CURVE_TIME_COLUMN = "train_time_s"
QUALITY_KEYS = ("final", "samples_to_target", "steps_to_target", "budget_samples", "budget_steps", "samples_trained",
                "steps_trained", "cut", "stopped_by", "tokens_trained", "curve_extra")
RSS_FIGURES = {"peak RSS (window)": ("memory", "peak_rss_bytes"),
               "RSS at rest (clean pass)": ("memory", "clean_rss", "at_rest_bytes"),
               "peak RSS (clean pass)": ("memory", "clean_rss", "peak_bytes")}


def records(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    path = sweep_dir / "results.jsonl"
    if not path.is_file():
        print(f"isolation_check: {path} does not exist (give two directories a sweep wrote)", file=sys.stderr)
        raise SystemExit(2)
    return {r["trial_id"]: r for r in map(json.loads, path.read_text().splitlines()) if r.get("status") != "skipped"}


def _get(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        record = record.get(key) if isinstance(record, dict) else None
    return record


def quality_view(r: dict[str, Any]) -> dict[str, Any]:
    """What a trial learned and counted, without a single clock reading: equal bit for bit in both modes."""
    q, parity, memory, speed, build = (r.get(k) or {} for k in ("quality", "parity", "memory", "speed", "build"))
    columns = q.get("curve_columns") or []
    keep = [i for i, c in enumerate(columns) if c != CURVE_TIME_COLUMN]
    return {
        "status": r.get("status"),
        "reason": r.get("reason"),
        **{f"quality.{k}": q.get(k) for k in QUALITY_KEYS},
        "quality.curve": [[row[i] for i in keep] for row in q.get("curve") or []],
        **{f"parity.{k}": v for k, v in parity.items()},
        "memory.breakdown": memory.get("breakdown"),
        "speed.flops_per_step": speed.get("flops_per_step"),
        "build.n_params": build.get("n_params"),
        "build.batch_size": build.get("batch_size"),
        "build.micro_batches": build.get("micro_batches"),
        "build.threads": build.get("threads"),
    }


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


def rel_diff(a: Any, b: Any) -> float:
    """The largest relative difference between the numbers of two equally shaped values (inf: shapes differ)."""
    x, y = _numbers(a), _numbers(b)
    if len(x) != len(y) or (a is None) != (b is None):
        return math.inf
    return max((abs(p - q) / max(abs(p), abs(q), 1e-30) for p, q in zip(x, y, strict=True) if p != q), default=0.0)


def check(fork_dir: Path, fresh_dir: Path, memory_rtol: float = 0.02, compiled_rtol: float = 1e-4) -> list[str]:
    """The lines of the comparison; the differences that fail it start with ``DIFFERS``."""
    fork, fresh = records(fork_dir), records(fresh_dir)
    both = sorted(set(fork) & set(fresh))
    lines = [f"trials: {len(fork)} fork, {len(fresh)} fresh, {len(both)} in both"]
    for name, mine, theirs in (("fork", fork, fresh), ("fresh", fresh, fork)):
        if set(mine) - set(theirs):
            lines.append(f"DIFFERS: trials only in the {name} sweep: {sorted(set(mine) - set(theirs))[:5]}")
    modes = {r.get("isolation") for r in fork.values()}, {r.get("isolation") for r in fresh.values()}
    lines.append(f"isolation recorded: fork sweep {sorted(map(str, modes[0]))}, fresh sweep {sorted(map(str, modes[1]))}")
    identical, compiled = 0, []
    for trial in both:
        a, b = quality_view(fork[trial]), quality_view(fresh[trial])
        differ = [k for k in a if a[k] != b[k]]
        if not differ:
            identical += 1
            continue
        if (fork[trial].get("caches") or {}).get("inductor") or (fresh[trial].get("caches") or {}).get("inductor"):
            worst = max(rel_diff(a[k], b[k]) for k in differ)
            compiled.append(worst)
            if worst <= compiled_rtol:
                continue
        lines.append(f"DIFFERS: {trial}: {', '.join(differ[:6])}")
    lines.append(f"quality: identical bit for bit in {identical} of {len(both)} trials" + (
        f"; {len(compiled)} compiled trial(s) differ by at most {max(compiled):.2g} relative "
        f"(allowed {compiled_rtol:g}: compiled CPU code is not bitwise deterministic between processes)"
        if compiled else ""))
    for name, path in RSS_FIGURES.items():
        pairs = [(_get(fork[t], path), _get(fresh[t], path)) for t in both]
        pairs = [(a, b) for a, b in pairs if a and b]
        if not pairs:
            continue
        ratios = [a / b for a, b in pairs]
        worst = max(pairs, key=lambda p: abs(p[0] - p[1]))
        lines.append(f"{name}: fork / fresh median {statistics.median(ratios):.4f} over {len(pairs)} trials, range "
                     f"[{min(ratios):.4f}, {max(ratios):.4f}]; largest difference {(worst[0] - worst[1]) / 2**20:+.1f}"
                     " MiB")
        if max(abs(r - 1) for r in ratios) > memory_rtol:
            lines.append(f"DIFFERS: {name} beyond {memory_rtol:.0%} in "
                         f"{sum(abs(r - 1) > memory_rtol for r in ratios)} trial(s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("fork_dir", type=Path)
    p.add_argument("fresh_dir", type=Path)
    p.add_argument("--memory-rtol", type=float, default=0.02, help="allowed relative RSS difference (default 2%%)")
    p.add_argument("--compiled-rtol", type=float, default=1e-4,
                   help="allowed relative difference of a compiled trial's quality figures (default 1e-4)")
    args = p.parse_args(argv)
    lines = check(args.fork_dir, args.fresh_dir, args.memory_rtol, args.compiled_rtol)
    print("\n".join(lines))
    return 1 if any(line.startswith("DIFFERS") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
