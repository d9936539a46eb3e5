"""How long the device was busy, read off a ``torch.profiler`` Chrome trace (``export_chrome_trace``).

A GPU runs what the host launched, asynchronously: the host-side time of a phase says how long the host spent
there, not whether the device was working. The trace says: each kernel, copy and memset is an interval on a device
stream (categories ``kernel``, ``gpu_memcpy``, ``gpu_memset``). The device is busy where at least one of them runs,
so its busy time over a span is the length of the union of those intervals inside the span (streams that overlap
count once). Each device op also names the host call that launched it (``args.correlation``, matched to a
``cuda_runtime`` / ``cuda_driver`` event): an op belongs to the labelled phase (``record_function`` range on the
host: data, h2d, forward, backward, optimizer) in which it was launched, whichever thread launched it (autograd's
backward runs on its own thread while the main thread waits inside ``backward``).

Pure arithmetic on the trace's JSON (microseconds, as the format has them): torch-free, tested on hand-made traces
with known overlaps and on the recorded H200 trace (tests/fixtures/h200-profile/).
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEVICE_OPS = ("kernel", "gpu_memcpy", "gpu_memset")  # what occupies a device stream
LAUNCHES = ("cuda_runtime", "cuda_driver")  # host calls that launch them (cudaLaunchKernel, cuLaunchKernelEx, ...)
HOST_RANGES = ("user_annotation", "cpu_op")  # where record_function ranges land (older torch: cpu_op)
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's range around each step of its schedule


def load(path: str | Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace file, gzipped (``.gz``) or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:  # type: ignore[operator]
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as sorted, disjoint intervals (touching ones join)."""
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def overlap(merged: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the part of ``[lo, hi]`` that sorted, disjoint ``merged`` intervals cover."""
    starts = [m[0] for m in merged]
    total = 0.0
    for a, b in merged[max(bisect.bisect_right(starts, lo) - 1, 0):]:
        if a >= hi:
            break
        total += max(0.0, min(b, hi) - max(a, lo))
    return total


def _spans(events: Iterable[dict[str, Any]], cats: Sequence[str]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats and "dur" in e]


def device_ops(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace's kernels, copies and memsets."""
    return _spans(events, DEVICE_OPS)


def _interval(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def host_ranges(events: Iterable[dict[str, Any]], names: Iterable[str]) -> dict[str, list[tuple[float, float]]]:
    """Per name, the host-side ``record_function`` ranges of that name (merged: a phase entered twice in a step,
    such as the optimizer's zero_grad and its step, counts once where they would overlap)."""
    wanted = set(names)
    found: dict[str, list[tuple[float, float]]] = {}
    for e in _spans(events, HOST_RANGES):
        if e.get("name") in wanted:
            found.setdefault(e["name"], []).append(_interval(e))
    return {name: merge(spans) for name, spans in found.items()}


def step_ranges(events: Iterable[dict[str, Any]]) -> list[tuple[float, float]]:
    """The profiler schedule's steps (``ProfilerStep#N`` ranges on the host), in order."""
    return sorted(_interval(e) for e in _spans(events, HOST_RANGES) if str(e.get("name", "")).startswith(STEP_PREFIX))


def launched_in(events: Sequence[dict[str, Any]], ranges: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Device microseconds of the ops launched inside each named host range (matched through the launch's
    correlation id); an op launched outside every range, or whose launch the trace lacks, is left out."""
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in _spans(events, LAUNCHES)
              if "correlation" in e.get("args", {})}
    flat = sorted((lo, hi, name) for name, spans in ranges.items() for lo, hi in spans)
    starts = [f[0] for f in flat]
    out = dict.fromkeys(ranges, 0.0)
    for op in device_ops(events):
        t = launch.get(op.get("args", {}).get("correlation"))
        if t is None:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and flat[i][0] <= t <= flat[i][1]:
            out[flat[i][2]] += float(op["dur"])
    return out


@dataclass(frozen=True)
class DeviceBusy:
    """How busy the device was over some steps: per step, the wall time, the union of its ops, their count and
    mean duration, and (from a trace with phase labels) the device time of the ops each phase launched."""

    steps: int
    wall_s: float  # per step
    busy_s: float  # per step: the union of the device's kernel, copy and memset intervals
    fraction: float  # busy_s / wall_s
    ops_per_step: float  # kernels, copies and memsets
    mean_op_s: float  # their mean duration (sum of durations / count)
    source: str  # what was measured: "trace of 2 profiled steps", "CUDA activity over 5 steps"
    launched_s: dict[str, float] = field(default_factory=dict)  # per step: phase -> device seconds it launched


def _busy(steps: int, wall_s: float, busy_s: float, ops: Sequence[dict[str, Any]], source: str,
          launched_s: dict[str, float] | None = None) -> DeviceBusy:
    """Per-step figures from totals over ``steps`` (seconds) and the device ops counted."""
    total = sum(float(o["dur"]) for o in ops) * 1e-6
    return DeviceBusy(steps=steps, wall_s=wall_s / steps, busy_s=busy_s / steps,
                      fraction=busy_s / wall_s if wall_s > 0 else 0.0, ops_per_step=len(ops) / steps,
                      mean_op_s=total / len(ops) if ops else 0.0, source=source,
                      launched_s={k: v / steps for k, v in (launched_s or {}).items()})


def from_trace(events: Sequence[dict[str, Any]], phases: Sequence[str] = ()) -> DeviceBusy | None:
    """The device's busy time over the trace's profiled steps (each ``ProfilerStep#N`` range: the union of the
    device ops inside it, against its wall time), with the device time each of ``phases`` launched. None when the
    trace has no device ops (a CPU trace) or no steps."""
    ops, steps = device_ops(events), step_ranges(events)
    if not ops or not steps:
        return None
    busy = merge(_interval(o) for o in ops)
    inside = [o for o in ops if any(lo <= float(o["ts"]) < hi for lo, hi in steps)]
    launched = launched_in(events, host_ranges(events, phases)) if phases else {}
    return _busy(len(steps), sum(hi - lo for lo, hi in steps) * 1e-6,
                 sum(overlap(busy, lo, hi) for lo, hi in steps) * 1e-6, inside,
                 f"trace of {len(steps)} profiled steps", {k: v * 1e-6 for k, v in launched.items()})


def from_activity(events: Sequence[dict[str, Any]], wall_s: float, steps: int) -> DeviceBusy | None:
    """The device's busy time over a pass whose every device op the trace holds (synchronised at both edges, so
    none started before it or ran on after it): the union of all of them against the pass's host wall time. None
    when the trace has no device op (the profiler saw none: nothing to say rather than "idle")."""
    ops = device_ops(events)
    if not ops or steps < 1 or wall_s <= 0:
        return None
    busy = sum(hi - lo for lo, hi in merge(_interval(o) for o in ops)) * 1e-6
    return _busy(steps, wall_s, busy, ops, f"CUDA activity over {steps} steps")


# ---- the kernel table -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelTime:
    """One device op's share of the profiled steps' device time (kernels, copies and memsets: one kind of event)."""

    name: str  # in full, as the trace has it
    short: str  # for a table: namespaces, template arguments and parameters left out
    calls: int
    device_s: float  # over the profiled steps
    per_step_s: float
    share: float  # of all device ops' time


def kernel_table(events: Sequence[dict[str, Any]], top: int = 15) -> list[KernelTime]:
    """The device ops of the profiled steps by total device time, longest first (``top`` of them)."""
    steps = step_ranges(events)
    ops = [o for o in device_ops(events) if not steps or any(lo <= float(o["ts"]) < hi for lo, hi in steps)]
    per: dict[str, list[float]] = {}
    for o in ops:
        per.setdefault(o.get("name", "?"), []).append(float(o["dur"]))
    total = sum(sum(v) for v in per.values()) or 1.0
    n = max(len(steps), 1)
    rows = sorted(per.items(), key=lambda kv: sum(kv[1]), reverse=True)[:top]
    shorts = _numbered([short_name(name) for name, _ in rows])
    return [KernelTime(name, short, len(d), sum(d) * 1e-6, sum(d) * 1e-6 / n, sum(d) / total)
            for (name, d), short in zip(rows, shorts, strict=True)]


def short_name(name: str, width: int = 60) -> str:
    """A kernel's name for a table: ``void at::native::reduce_kernel<128, 4, ...>(...)`` -> ``reduce_kernel<…>``
    (no return type, namespaces, template arguments or parameter list), cut to ``width`` characters."""
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    kept, depth, templated = [], 0, False
    for ch in text:
        if ch == "<":
            depth += 1
            templated = True
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and not depth:
            break  # the parameter list
        elif not depth:
            kept.append(ch)
    base = "".join(kept).strip().rsplit("::", 1)[-1] or text
    base += "<…>" if templated else ""
    return base if len(base) <= width else base[:width - 1] + "…"


def _numbered(names: list[str]) -> list[str]:
    """Names made distinct where shortening made several alike: "reduce_kernel<…> (1)", "... (2)"."""
    seen: dict[str, int] = {}
    total = {n: names.count(n) for n in names}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(f"{n} ({seen[n]})" if total[n] > 1 else n)
    return out
