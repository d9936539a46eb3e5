"""What the techniques' ``summarize`` methods share: numbers of several seeds in one cell, counts, byte sizes, and the
one-off cost of an artefact cached for the sweep (a teacher, a pretrained checkpoint). Torch-free."""

from __future__ import annotations

import statistics
from typing import Any

from bench.core.text import fmt_bytes, fmt_secs

__all__ = ["LISTED", "fmt_bytes", "fmt_secs", "g", "mib", "n", "once", "small_bytes", "values"]

LISTED = 6  # seeds listed one by one up to this many; beyond, the median and range


def g(x: float | None) -> str:
    """A number to 3 significant digits (an int as it is), "-" for none."""
    if x is None:
        return "-"
    return str(x) if isinstance(x, int) else f"{x:.3g}"


def values(xs: list[Any]) -> str:
    """One value per seed: "v (each of n)" when they agree, listed up to ``LISTED``, else median and range."""
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    if len(got) > 1 and len(set(got)) == 1:
        return f"{g(got[0])} (each of {len(got)})"
    if len(got) <= LISTED:
        return ", ".join(g(x) for x in got)
    return f"median {g(float(statistics.median(got)))} (range {g(min(got))}-{g(max(got))}, n={len(got)})"


def small_bytes(b: int | None) -> str:
    """Bytes, exact below 10 KiB (a tiny model's KV cache per token would round to "0 KiB")."""
    return fmt_bytes(b) if b is None or b >= 10 * 1024 else f"{b:,} B"


def n(x: int | None) -> str:
    """A count with thousands separators, "-" for none."""
    return "-" if x is None else f"{x:,}"


def mib(b: float | None) -> float | None:
    return None if b is None else b / 2**20


def once(found: list[dict[str, Any]], seconds: str, what: str) -> str:
    """How often a cached artefact (teacher, checkpoint) was trained in these trials and what it cost per trial."""
    trained = [f.get(seconds) or 0.0 for f in found if not f.get("cached")]
    cost = max((f.get(seconds) or 0.0 for f in found), default=0.0)
    if not trained:
        return f"{what} in {fmt_secs(cost)} by an earlier trial (all {len(found)} loaded it from the sweep's cache)"
    return (f"{what} in {fmt_secs(cost)} ({len(trained)} of these {len(found)} trials trained it, the others loaded "
            f"it from the sweep's cache): {fmt_secs(sum(trained) / len(found))} per trial here, outside their "
            "one-off costs")
