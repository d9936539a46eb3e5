"""The machine and software a run used (fingerprint), and the peak FLOP/s that MFU is measured against.

Peaks come two ways. ``calibrate_peaks`` measures the best matmul throughput this machine achieves per dtype (the
honest denominator on CPUs, which have no datasheet figure, and a sanity check on GPUs). ``datasheet_peak`` gives
the vendor's dense peak for known GPUs, the denominator MFU is usually quoted against.

A sweep's env.json is measured in a process of its own (``python -m bench.measure.env``, run by the sweep's
launcher): the fingerprint asks CUDA about its devices and calibration allocates on them, and the sweep's own process
must hold no CUDA context or tensors on a device while trials run there. ``measure_environment`` says what it holds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import torch

from bench.core.files import write_atomic
from bench.measure.timing import CpuContention

log = logging.getLogger(__name__)

CPU_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
PACKAGES = ("numpy", "pandas", "scipy", "matplotlib", "psutil")


# ---- fingerprint -----------------------------------------------------------------------------------------------


def _cpuinfo() -> tuple[str | None, set[str]]:
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
            if model and flags:
                break
    except OSError:
        pass
    return model or platform.processor() or None, flags


def cpu_model() -> str | None:
    """The CPU's model name, as ``fingerprint`` records it (``cpu_model``)."""
    return _cpuinfo()[0]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(repo_dir: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            # --no-optional-locks: a read-only status must not take the index lock another process may need.
            proc = subprocess.run(["git", "--no-optional-locks", "-C", str(repo_dir), *args], capture_output=True,
                                  text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("git unavailable for %s: %s", repo_dir, exc)
            return None
        return proc.stdout if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def fingerprint(repo_dir: Path | None = None) -> dict[str, Any]:
    """Hardware and software of this process, to store next to the numbers it produced.

    ``git`` is the commit and dirty flag of ``repo_dir`` (None when not given, or not a git checkout).
    """
    model, flags = _cpuinfo()
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn,
        "cpu_model": model,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_affinity": affinity,
        "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "cpu_flags": {f: f in flags for f in CPU_FLAGS_OF_INTEREST},
        "gpu": None,
        "packages": {p: _version(p) for p in PACKAGES},
        "git": _git(Path(repo_dir)) if repo_dir is not None else None,
        "timestamp_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        info["gpu"] = {
            "count": len(props),
            "name": props[0].name,
            "memory_bytes": props[0].total_memory,
            "capability": f"{props[0].major}.{props[0].minor}",
            "devices": [{"name": p.name, "memory_bytes": p.total_memory} for p in props],
        }
    return info


# ---- measured peak FLOP/s --------------------------------------------------------------------------------------


def _kernels(device: torch.device, dtype: torch.dtype) -> dict[str, Callable[[int], Callable[[], object]]]:
    """Matmul-shaped kernels, each computing an n x n x n product (2 n^3 FLOPs), by name."""

    def mm(n: int) -> Callable[[], object]:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        return lambda: torch.mm(a, b)

    def conv(channels_last: bool) -> Callable[[int], Callable[[], object]]:
        # A 1x1 convolution over an n-pixel image with n channels in and out is an n x n x n matmul, but runs
        # through oneDNN on CPU, which beat torch.mm by ~50% for fp32 on one 2-core avx512_bf16 probe machine (an
        # estimate from a probe script, 2 threads, n=2048: 313 against 210 GFLOP/s).
        def make(n: int) -> Callable[[], object]:
            x = torch.randn(1, n, n, 1, device=device).to(dtype)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(n, n, 1, 1, device=device).to(dtype)
            return lambda: torch.nn.functional.conv2d(x, w)

        return make

    kernels: dict[str, Callable[[int], Callable[[], object]]] = {}
    if device.type == "cpu":
        kernels["conv1x1"] = conv(False)
        kernels["conv1x1_channels_last"] = conv(True)
    kernels["torch.mm"] = mm  # last: it inherits the time the others left unused
    return kernels


class _Clock:
    """Seconds for one call of an op: wall clock on CPU, CUDA events (after a sync) on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def time(self, op: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            # On the op's device's stream: a bare record() would use the current device's (cuda:0 while calibrating
            # cuda:3) and time nothing of the op.
            stream = torch.cuda.current_stream(self.device)
            start.record(stream)
            op()
            end.record(stream)
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        op()
        return time.perf_counter() - t0


REPEATS = 5  # timed repeats at the final size; the fastest is kept


def measure_peak_flops(device: torch.device | str, dtype: torch.dtype, budget_s: float = 1.0) -> dict[str, Any]:
    """Best achieved matmul FLOP/s for ``dtype`` on ``device`` over a few kernels, within about ``budget_s``.

    Each kernel gets an equal share of the budget (plus what earlier kernels left). Its matrix size starts at 256 and
    doubles (up to 2048 on CPU, 4096 on CUDA) while one op takes less than a tenth of the budget and the next size
    fits in the share, so a dtype without a fast path (fp16 on most CPUs runs at a few GFLOP/s) still finishes in
    time; then the op is repeated a few times and the fastest run is kept. Each size is run once untimed first
    (oneDNN primitive creation, cuBLAS heuristics, page faults). The kernel reported is the best kernel's best size
    (a smaller size can win when the cache favours it).

    Returns ``{"flops", "kernel", "n", "dtype", "device", "threads", "tf32", "seconds", "by_kernel",
    "other_cpu_fraction"}``; ``flops`` is None if no kernel ran. ``other_cpu_fraction`` is the share of the CPUs
    other processes used meanwhile (CPU only): a high value means the peak is understated.
    """
    device = torch.device(device)
    max_n = 4096 if device.type == "cuda" else 2048
    clock = _Clock(device)
    kernels = _kernels(device, dtype)
    contention = CpuContention()  # other processes on the cores make the peak look low: record how much
    contention.start()
    began = time.perf_counter()
    best: dict[str, Any] = {"flops": 0.0, "kernel": None, "n": None}
    by_kernel: dict[str, float | None] = {}
    for i, (name, make) in enumerate(kernels.items()):
        # Deadlines are cumulative, so time a kernel leaves unused (a slow one stops growing early) goes to the next.
        deadline = began + budget_s * (i + 1) / len(kernels)
        n, kernel_best = 256, 0.0
        try:
            while True:
                op = make(n)
                op()  # untimed first call at this size
                t = clock.time(op)
                kernel_best = max(kernel_best, 2 * n**3 / t)
                # Doubling n makes an op 8x longer, and each size costs two ops: stop growing when that won't fit.
                if t >= budget_s / 10 or n * 2 > max_n or time.perf_counter() + 16 * t > deadline:
                    break
                n *= 2
            for _ in range(REPEATS):
                if time.perf_counter() + t > deadline:
                    break
                t = min(t, clock.time(op))
            kernel_best = max(kernel_best, 2 * n**3 / t)
            by_kernel[name] = kernel_best
            if kernel_best > best["flops"]:
                best = {"flops": kernel_best, "kernel": name, "n": n}
        except (RuntimeError, NotImplementedError) as exc:  # a dtype some kernel does not support
            log.info("peak FLOP/s: %s in %s failed: %s", name, dtype, exc)
            by_kernel[name] = None
    if best["kernel"] is None:
        best["flops"] = None
    busy = contention.stop()
    return {
        **best,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else None,
        "seconds": time.perf_counter() - began,
        "by_kernel": by_kernel,
        "other_cpu_fraction": busy.fraction if device.type == "cpu" else None,
    }


def calibrate_peaks(
    device: torch.device | str,
    dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16, torch.float16),
    budget_s: float = 3.0,
    threads: int | None = None,
) -> dict[str, dict[str, Any]]:
    """``measure_peak_flops`` for each dtype, sharing ``budget_s`` seconds, keyed by dtype name ("float32", ...).

    ``threads``: torch's intra-op threads while measuring (a trial's peak depends on the threads it runs with);
    restored afterwards. On CUDA with TF32 tensor cores (compute capability 8.0+), ``tfloat32`` is fp32 matmul with
    ``allow_tf32`` on: the peak a ``tf32`` trial is measured against.
    """
    device = torch.device(device)
    dtypes = list(dtypes)
    tf32 = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8
    share = budget_s / (len(dtypes) + tf32)
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    out = {}
    try:
        for dtype in dtypes:
            result = measure_peak_flops(device, dtype, share)
            out[result["dtype"]] = result
            log.info("peak %s on %s: %s FLOP/s (%s, n=%s)", result["dtype"], device, result["flops"],
                     result["kernel"], result["n"])
        if tf32:
            previous = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                out["tfloat32"] = {**measure_peak_flops(device, torch.float32, share), "dtype": "tfloat32"}
            finally:
                torch.backends.cuda.matmul.allow_tf32 = previous
    finally:
        torch.set_num_threads(previous_threads)
    return out


# ---- a sweep's environment, in a process of its own --------------------------------------------------------------

PEAK_AGREEMENT = 0.20  # devices of one model whose calibrated peaks differ more than this are worth a warning


def measure_environment(device: str, threads: Iterable[int], devices: Iterable[str] = (),
                        repo_dir: Path | None = None, budget_s: float = 3.0) -> dict[str, Any]:
    """What a sweep's env.json holds beside its command: the fingerprint and calibrated peaks.

    - ``peak_flops``: the peaks one-process trials are measured against (their device, at the first thread count);
    - ``peak_flops_by_threads``: by thread count, as trials run on the CPU (one-process trials' count, torchrun's one
      per rank); on CUDA the device's, once (a GPU's matmul peak does not depend on the host's threads);
    - ``peak_flops_by_device`` (CUDA only): each device the trials use, calibrated in full on its own (``devices``:
      ``cuda:0``...; the first is the one-process trials'). Every device is measured rather than the first one
      assumed for all: a throttled, shared or MIG-sliced GPU has a lower peak than its name says, and a multi-GPU
      trial's MFU is its achieved FLOP/s over the sum of its devices' own peaks. A GPU's calibration is short: its
      four dtypes' timed runs took 0.65 s together on the H200 of reports/example-h200-first (the ``seconds`` of its
      env.json's peaks), tensor set-up not counted.
    """
    env = fingerprint(repo_dir)
    devices, threads = list(devices), list(threads)
    if devices:
        by_device = {d: calibrate_peaks(d, budget_s=budget_s) for d in devices}
        env["peak_flops"] = by_device[devices[0]]
        env["peak_flops_by_threads"] = {str(threads[0]): by_device[devices[0]]}
        env["peak_flops_by_device"] = by_device
        for line in peak_disagreements(env):
            log.warning("%s", line)
        return env
    by_threads = {str(n): calibrate_peaks(device, threads=n, budget_s=budget_s) for n in threads}
    env["peak_flops"] = next(iter(by_threads.values()))
    env["peak_flops_by_threads"] = by_threads
    return env


def peak_disagreements(env: dict[str, Any], tolerance: float = PEAK_AGREEMENT) -> list[str]:
    """Devices of one model (by the fingerprint's names) whose calibrated peak for a dtype is more than ``tolerance``
    below the best of them, one line each; an env.json without per-device peaks has none.

    The tolerance is wide because calibrations of one device vary: tf32 334-378 TFLOP/s (12%) over the first H200
    sweep's calibrations (reports/example-h200-first); a gap beyond it points at the device (clocks, power cap, another tenant)."""
    by_device = env.get("peak_flops_by_device") or {}
    names = [d.get("name") for d in ((env.get("gpu") or {}).get("devices") or [])]
    out = []
    groups: dict[tuple[str, str], dict[str, float]] = {}
    for device, peaks in by_device.items():
        index = torch.device(device).index or 0
        name = names[index] if index < len(names) else None
        for dtype, entry in (peaks or {}).items():
            if (entry or {}).get("flops"):
                groups.setdefault((str(name), dtype), {})[device] = entry["flops"]
    for (name, dtype), flops in sorted(groups.items()):
        best_device = max(flops, key=flops.__getitem__)
        for device, value in flops.items():
            if value < (1 - tolerance) * flops[best_device]:
                out.append(f"{device}'s calibrated {dtype} peak, {value / 1e12:.3g} TFLOP/s, is "
                           f"{1 - value / flops[best_device]:.0%} below {best_device}'s {flops[best_device] / 1e12:.3g} "
                           f"on the same model ({name}): a throttled, shared or partitioned device? Its trials' MFU "
                           "is against its own peak")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.measure.env OUT.json --device DEV --threads N[,N] [--devices cuda:0,...] [--repo DIR]``:
    ``measure_environment`` written to OUT.json (whole or not at all)."""
    parser = argparse.ArgumentParser(prog="python -m bench.measure.env", description=main.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", required=True)
    parser.add_argument("--threads", required=True, help="comma-separated intra-op thread counts")
    parser.add_argument("--devices", default="", help="comma-separated CUDA devices to calibrate one by one")
    parser.add_argument("--repo", type=Path, default=None, help="the checkout whose git commit is recorded")
    parser.add_argument("--budget", type=float, default=3.0, help="seconds per calibration")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("TRAINBENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    env = measure_environment(args.device, [int(n) for n in args.threads.split(",")],
                              [d for d in args.devices.split(",") if d], args.repo, args.budget)
    write_atomic(args.out, json.dumps(env, indent=2, sort_keys=True, default=str))
    return 0


# ---- datasheet peaks -------------------------------------------------------------------------------------------

# Dense (no structured sparsity) peak FLOP/s from NVIDIA's datasheets; the datasheets' headline tensor-core numbers
# are "with sparsity" and twice these. Keys: "float32" (non-tensor-core FP32), "tfloat32", "bfloat16", "float16".
# Matched as a whole token in torch.cuda.get_device_name(), first match wins, so specific names come first.
_T = 1e12
DATASHEET_PEAK_FLOPS: dict[str, dict[str, float]] = {
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL column)
    "H200 NVL": {"float32": 60 * _T, "tfloat32": 417.5 * _T, "bfloat16": 835.5 * _T, "float16": 835.5 * _T},
    # https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column; same compute as H100 SXM)
    "H200": {"float32": 67 * _T, "tfloat32": 494.7 * _T, "bfloat16": 989.4 * _T, "float16": 989.4 * _T},
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL column)
    "H100 NVL": {"float32": 60 * _T, "tfloat32": 417.5 * _T, "bfloat16": 835.5 * _T, "float16": 835.5 * _T},
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe column)
    "H100 PCIe": {"float32": 51 * _T, "tfloat32": 378 * _T, "bfloat16": 756 * _T, "float16": 756 * _T},
    # https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM column; "NVIDIA H100 80GB HBM3" is the SXM part)
    "H100": {"float32": 67 * _T, "tfloat32": 494.7 * _T, "bfloat16": 989.4 * _T, "float16": 989.4 * _T},
    # https://www.nvidia.com/en-us/data-center/a100/ (same tensor peaks for PCIe and SXM)
    "A100": {"float32": 19.5 * _T, "tfloat32": 156 * _T, "bfloat16": 312 * _T, "float16": 312 * _T},
    # https://www.nvidia.com/en-us/data-center/l40s/
    "L40S": {"float32": 91.6 * _T, "tfloat32": 183 * _T, "bfloat16": 362.05 * _T, "float16": 362.05 * _T},
    # https://www.nvidia.com/en-us/data-center/l4/
    "L4": {"float32": 30.3 * _T, "tfloat32": 60 * _T, "bfloat16": 121 * _T, "float16": 121 * _T},
    # https://www.nvidia.com/en-us/data-center/products/a10-gpu/
    "A10": {"float32": 31.2 * _T, "tfloat32": 62.5 * _T, "bfloat16": 125 * _T, "float16": 125 * _T},
    # https://www.nvidia.com/en-us/data-center/tesla-t4/ (no bf16 or tf32 tensor cores)
    "T4": {"float32": 8.1 * _T, "float16": 65 * _T},
    # https://www.nvidia.com/en-us/data-center/v100/ (SXM2 column; no bf16 or tf32 tensor cores)
    "V100": {"float32": 15.7 * _T, "float16": 125 * _T},
}

_DTYPE_ALIASES = {"fp32": "float32", "tf32": "tfloat32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                  "float": "float32"}


def datasheet_peak(device_name: str, dtype: torch.dtype | str) -> float | None:
    """The datasheet's dense peak FLOP/s for a GPU name (e.g. "NVIDIA H200") and dtype, or None if unknown.

    ``dtype`` is a torch dtype or a name: "float32" means plain FP32; ask for "tfloat32" ("tf32") explicitly when
    ``torch.backends.cuda.matmul.allow_tf32`` is on.
    """
    key = str(dtype).removeprefix("torch.")
    return (datasheet_peaks(device_name) or {}).get(_DTYPE_ALIASES.get(key, key))


def datasheet_peaks(device_name: str) -> dict[str, float] | None:
    """The datasheet's dense peaks of a GPU name by dtype ("float32", "tfloat32", "bfloat16", "float16"), or None
    for a device the table does not know."""
    for name, peaks in DATASHEET_PEAK_FLOPS.items():
        # Whole-token match, so "A10" does not claim an "A100" or "A10G", nor "L4" an "L40".
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", device_name, re.IGNORECASE):
            return dict(peaks)
    return None


if __name__ == "__main__":
    sys.exit(main())
