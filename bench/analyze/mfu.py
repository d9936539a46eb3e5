"""MFU that people can compare: each set's achieved FLOP/s over one peak per device, the same for every set.

The headline divides a set's achieved FLOP/s (model FLOPs per step x steps / the timed window's wall time) by the
device's dense bf16 peak: the figure torchtitan's and llm.c's logs quote, and nanoGPT's ``estimate_mfu`` computes
against an A100's 312 TFLOP/s. It is given twice, against the datasheet's peak and against the bf16 peak calibrated
on the machine (``env.json``'s ``peak_flops``). A GPU whose datasheet lists no bf16 (T4, V100) is measured against
its fastest datasheet dtype; a CPU, which has no datasheet, against its fastest calibrated dtype, named.

The record's own MFU (``speed.mfu``: over the calibrated peak of the set's own compute dtype) stays as a second
figure. It says how near a set runs to what its own arithmetic allows, and cannot rank sets of different dtypes: on
the first H200 the fp32 baseline read 88.8% of fp32's peak and bf16 23.9% of bf16's, at 3.8x fp32's samples/s.

Computed from the records' achieved FLOP/s and the environment's peaks, so records written before the headline
existed get it without running again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from bench.measure.env import datasheet_peaks

HEADLINE_DTYPE = "bfloat16"  # the dtype whose dense peak MFU is quoted against on GPUs

# Columns ``with_mfu`` adds to the configurations (None where unknown).
COLUMNS = ("mfu_peak_dtype", "mfu_peak_device", "mfu_sheet", "mfu_sheet_peak", "mfu_calibrated",
           "mfu_calibrated_peak")


@dataclass(frozen=True)
class DevicePeak:
    """The peak the headline MFU of one machine divides by, per device (per rank on a CPU), in FLOP/s."""

    dtype: str  # "bfloat16" on GPUs that have it; otherwise the fastest dtype, named
    device: str  # the GPU's name, or "cpu"
    datasheet: float | None  # the datasheet's dense peak (GPUs the table knows)
    calibrated: float | None  # measured on this machine (env.json), at the trials' thread count


def chosen(dtype: str, device: str) -> str:
    """Which peak the headline divides by, and why that dtype: the words a report puts before the peak."""
    if device == "cpu":
        return f"the peak of this CPU's fastest calibrated dtype ({dtype})"
    if dtype == HEADLINE_DTYPE:
        return f"the dense {dtype} peak of one {device}"
    return f"the peak of the {device}'s fastest dense dtype ({dtype}: it has no {HEADLINE_DTYPE} peak)"


def _flops(entry: Any) -> float | None:
    value = entry.get("flops") if isinstance(entry, Mapping) else entry
    return float(value) if isinstance(value, int | float) and value > 0 else None


def calibrated_table(env: Mapping[str, Any], compute_dtype: str | None = None,
                     own_peak: float | None = None) -> dict[str, Any]:
    """The calibrated peaks a trial ran with. env.json holds one table per thread count the trials used
    (``peak_flops_by_threads``; torchrun ranks on a CPU get one thread each); the trial's own-dtype peak per rank
    (``own_peak``) says which. Without a match: ``peak_flops`` (the one-process trials' table)."""
    default = dict(env.get("peak_flops") or {})
    if compute_dtype is None or own_peak is None:
        return default
    for table in [default, *(env.get("peak_flops_by_threads") or {}).values()]:
        p = _flops((table or {}).get(compute_dtype))
        if p is not None and math.isclose(p, own_peak, rel_tol=1e-6):
            return dict(table)
    return default


def device_peak(env: Mapping[str, Any], compute_dtype: str | None = None, own_peak: float | None = None,
                device: str | None = None) -> DevicePeak | None:
    """The headline's peak on the machine ``env`` describes (None when it has neither a datasheet nor a
    calibrated peak). ``compute_dtype`` and ``own_peak`` (per rank) pick the thread count's calibration;
    ``device``: where the trials ran (env.json's ``device`` by default: a machine with a GPU may run a CPU sweep)."""
    table = calibrated_table(env, compute_dtype, own_peak)
    calibrated = {d: f for d, e in table.items() if (f := _flops(e)) is not None}
    gpu = env.get("gpu") or {}
    on_gpu = str(env.get("device") or device or "").startswith("cuda") and bool(gpu.get("name"))
    sheet = (datasheet_peaks(str(gpu["name"])) or {}) if on_gpu else {}
    if on_gpu and (HEADLINE_DTYPE in sheet or (not sheet and HEADLINE_DTYPE in calibrated)):
        dtype = HEADLINE_DTYPE
    elif sheet or calibrated:
        dtype = max(sheet or calibrated, key=(sheet or calibrated).get)
    else:
        return None
    return DevicePeak(dtype, str(gpu["name"]) if on_gpu else "cpu", sheet.get(dtype), calibrated.get(dtype))


def headline(achieved: float | None, peak: DevicePeak | None, world_size: int | None = 1) -> dict[str, Any]:
    """One configuration's headline columns (``COLUMNS``): its achieved FLOP/s (the sum over its ranks) over the
    peak of as many devices as it ran on."""
    out: dict[str, Any] = dict.fromkeys(COLUMNS)
    if peak is None:
        return out
    ranks = max(int(world_size or 1), 1)
    out.update(mfu_peak_dtype=peak.dtype, mfu_peak_device=peak.device,
               mfu_sheet_peak=peak.datasheet, mfu_calibrated_peak=peak.calibrated)
    if achieved is not None and achieved > 0:
        out["mfu_sheet"] = achieved / (peak.datasheet * ranks) if peak.datasheet else None
        out["mfu_calibrated"] = achieved / (peak.calibrated * ranks) if peak.calibrated else None
    return out


def with_mfu(configs: pd.DataFrame, machines: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """The configurations with the headline MFU columns, from each row's median achieved FLOP/s and its machine's
    peaks (``machines``: machine label -> env.json)."""
    out = configs.copy()
    for column in COLUMNS:
        out[column] = pd.Series([None] * len(out), index=out.index, dtype=object)
    for i, c in zip(out.index, out.itertuples(), strict=True):
        env = machines.get(c.machine) or {}
        ranks = int(c.world_size) if _ok(c.world_size) else 1
        own = float(c.peak_flops) / ranks if _ok(c.peak_flops) else None
        peak = device_peak(env, c.compute_dtype, own, getattr(c, "phase_device", None))
        achieved = float(c.achieved_flops) if _ok(c.achieved_flops) else None
        for column, value in headline(achieved, peak, ranks).items():
            out.at[i, column] = value
    return out


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


# ---- wording (the report and summary.md say it the same way) --------------------------------------------------


def _pct(v: float) -> str:
    return f"{v * 100:.1f}%" if v >= 0.01 else f"{v * 100:.2f}%"


def fmt_flops(f: float) -> str:
    return f"{f / 1e12:.1f} TFLOP/s" if f >= 1e12 else f"{f / 1e9:,.1f} GFLOP/s"


def primary(c: Any) -> float | None:
    """The one headline number: against the datasheet where there is one, else against the calibrated peak."""
    sheet, cal = getattr(c, "mfu_sheet", None), getattr(c, "mfu_calibrated", None)
    return sheet if _ok(sheet) else cal if _ok(cal) else None


def cell_text(c: Any) -> str:
    """``17.1% datasheet, 24.0% calibrated (169.2 TFLOP/s)``; on a CPU ``12.1% calibrated (21.8 GFLOP/s)``."""
    parts = [f"{_pct(v)} {name}" for v, name in ((getattr(c, "mfu_sheet", None), "datasheet"),
                                                 (getattr(c, "mfu_calibrated", None), "calibrated")) if _ok(v)]
    if not parts:
        return "-"
    achieved = getattr(c, "achieved_flops", None)
    return ", ".join(parts) + (f" ({fmt_flops(achieved)})" if _ok(achieved) else "")


def own_text(c: Any) -> str:
    """The own-dtype MFU with its dtype: ``88.8% of float32``."""
    mfu = getattr(c, "mfu", None)
    if not _ok(mfu):
        return "-"
    dtype = getattr(c, "compute_dtype", None)
    return f"{_pct(mfu)} of {dtype}" if dtype else _pct(mfu)


def definition(c: Any) -> str | None:
    """What a row's headline divides by, in one sentence (None without a peak)."""
    if not getattr(c, "mfu_peak_dtype", None):
        return None
    device = str(c.mfu_peak_device)
    peaks = ", ".join(f"{name} {fmt_flops(v)}" for name, v in (("datasheet", c.mfu_sheet_peak),
                                                              ("calibrated", c.mfu_calibrated_peak)) if _ok(v))
    many = ("at the trials' thread count, times the ranks of a multi-process set" if device == "cpu"
            else "times the GPUs a set ran on; the figure torchtitan and llm.c quote")
    return (f"MFU: achieved FLOP/s over {chosen(c.mfu_peak_dtype, device)}: {peaks} ({many}), the same "
            "denominator for every set. MFU own dtype: over the calibrated peak of the set's own compute dtype, how "
            "near a set runs to its own arithmetic's limit; not comparable across dtypes.")
