"""The one pairing of trials: the samples every comparison of two technique sets reads.

The report (``bench.analyze.analysis``), the A/B gate (``bench.analyze.compare``), tune's search (``bench.run.tune``),
the claims check (``bench.analyze.findings``) and the frontier (``bench.report.frontier``) take their samples here,
from the records' frame (``bench.records.frame.records_frame``), so one rule says which trials count and which pair;
the statistics engine (``bench.analyze.stats``) then pairs two samples on their shared keys.

- **Keys.** A sample is {key: value}, the key the frame's ``key``: (sweep directory, seed, repeat). Trials of two
  sets with the same seed start from the same weights and see the same batches, and within a directory (seed,
  repeat) names one trial of a set (a sequential design's speed-only pairs reuse the seeds under new repeat
  numbers). Two directories merged into one report never share a key, so their trials never pair. ``bench compare``
  frames each side's records alone (bare records: a directory named ""), so the same (seed, repeat) of the two sides
  pair: in ``sweep --ab`` the two runs of a trial, made back to back.
- **Which trials.** Only ``ok`` trials of the plan (``trials``): a continuation trains a set's budget a second time,
  so it is no repeat of anything, and a failed trial has no value, so its pair drops out of the comparison.
  A timed window that stayed contended after its retries measured other processes too: it is left out of every
  quantity read from the window (``timed``). A quality run cut by the safety cap did not train the budget: it is left
  out of every quality quantity (``quality_runs``), and a quality run that stayed contended after its retries out of
  every quantity read from its clock, time to target and quality at equal time (``quality_clocks``). A sequential
  design's speed-only trials are trials like the
  others: they count in throughput and memory, and have no quality run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

Key = tuple[str, int, int]  # (sweep directory, seed, repeat)

THROUGHPUT = "throughput"  # samples/s of the timed window: a ratio
PEAK_MEMORY = "peak memory"  # the tensor-level (CUDA: allocator) peak, else peak RSS: a ratio
FINAL_METRIC = "final metric"  # the metric at the full sample budget: a difference
TIME_TO_TARGET = "time to target"  # the training clock at the first evaluation at the target: a ratio; misses counted

# Peak memory's sources, in order of preference: the tensor peak repeats to the byte, RSS carries the process's
# allocator and libraries (about half a tensor saving shows in it), so the two never meet in one comparison.
MEMORY_SOURCES = (("tensors", "peak_bytes"), ("RSS", "peak_rss_bytes"))


def _rows(frame: pd.DataFrame, mask: Sequence[bool]) -> pd.DataFrame:
    """The rows where ``mask`` is true (a plain list of booleans would select columns when empty)."""
    return frame[pd.Series(list(mask), index=frame.index, dtype=bool)]


def trials(rows: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` trials of the plan: continuations (``continues``) are left out."""
    planned = rows["continues"] if "continues" in rows else [None] * len(rows)
    return _rows(rows, [s == "ok" and pd.isna(c) for s, c in zip(rows["status"], planned, strict=True)])


def timed(rows: pd.DataFrame) -> pd.DataFrame:
    """``trials`` whose timed window had the cores to itself: what speed numbers (and the phase pass beside the
    window) are read from."""
    ok = trials(rows)
    return _rows(ok, [not c for c in ok["contended"]])


def quality_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """``trials`` whose quality run trained the whole budget (not cut by the safety cap)."""
    ok = trials(rows)
    return _rows(ok, [bool(c) and not cut for c, cut in zip(ok["curve"], ok["cut"], strict=True)])


def quality_clocks(rows: pd.DataFrame) -> pd.DataFrame:
    """``quality_runs`` whose training clock ran without other processes on the cores (``quality_contended``: still
    contended after its retries): what quality at equal time and time to target read."""
    runs = quality_runs(rows)
    flags = runs["quality_contended"] if "quality_contended" in runs else [False] * len(runs)
    return _rows(runs, [not bool(c) for c in flags])


def values(rows: pd.DataFrame, column: str) -> dict[Key, float]:
    """{key: value} of the rows with a finite ``column``: what the statistics engine pairs on."""
    return {k: float(v) for k, v in zip(rows["key"], rows[column], strict=True)
            if v is not None and math.isfinite(float(v))}


def cap(rows: pd.DataFrame) -> int | None:
    """The sequential design's cap these trials came from (``max_looks``; the largest, when merged sweeps differ),
    None for a fixed design."""
    caps = [int(c) for c in rows["max_looks"] if c is not None and not pd.isna(c)]
    return max(caps) if caps else None


# A one-sided quantity: the trials it is read from, and its column of the frame.
_READ = {THROUGHPUT: (timed, "samples_per_s"), FINAL_METRIC: (quality_runs, "final"),
         TIME_TO_TARGET: (quality_clocks, "time_to_target_s")}


def samples(rows: pd.DataFrame, quantity: str) -> dict[Key, float]:
    """One set's sample of a quantity that needs no other side (not ``PEAK_MEMORY``, whose source does)."""
    read, column = _READ[quantity]
    return values(read(rows), column)


def memory_source(mine: pd.DataFrame, ref: pd.DataFrame) -> tuple[str, str] | None:
    """(source, column) of peak memory for a comparison: the tensor peak where every trial on both sides has one,
    else peak RSS where every trial has that, else None (no ratio)."""
    a, b = trials(mine), trials(ref)
    for name, column in MEMORY_SOURCES:
        if len(a) and len(b) and len(values(a, column)) == len(a) and len(values(b, column)) == len(b):
            return name, column
    return None


@dataclass(frozen=True)
class Pair:
    """One quantity of two sets: ``mine`` (the set judged) against ``ref`` (its reference), each {key: value}; the
    engine pairs them on shared keys (Welch when fewer than two are shared)."""

    quantity: str
    mine: dict[Key, float]
    ref: dict[Key, float]
    cap: int | None = None  # the sequential design's cap of mine's trials (None: a fixed design)
    source: str | None = None  # peak memory's source, "tensors" or "RSS" (None: no ratio)
    misses: tuple[int, int] = (0, 0)  # time to target: the complete runs that never reached it, (mine, ref)


def pair(mine: pd.DataFrame, ref: pd.DataFrame | None, quantity: str) -> Pair:
    """The samples of ``quantity`` for the set whose trials are ``mine`` against the set whose trials are ``ref``
    (None: no reference, an empty sample)."""
    ref = mine.iloc[0:0] if ref is None else ref
    if quantity == PEAK_MEMORY:
        found = memory_source(mine, ref)
        ok = trials(mine)
        if found is None:
            return Pair(quantity, {}, {}, cap(ok))
        name, column = found
        return Pair(quantity, values(ok, column), values(trials(ref), column), cap(ok), name)
    read, column = _READ[quantity]
    a, b = read(mine), read(ref)
    va, vb = values(a, column), values(b, column)
    misses = (len(a) - len(va), len(b) - len(vb)) if quantity == TIME_TO_TARGET else (0, 0)
    return Pair(quantity, va, vb, cap(a), misses=misses)
