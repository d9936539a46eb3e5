"""What the CUDA devices here can do, asked without creating a CUDA context in this process.

The runner (the parent of every trial) plans the sweep, checks each technique against the device and launches the
trials; the trials train on the GPU in child processes. A CUDA context in the parent would hold memory on the device
for the whole sweep and make the parent something other than a launcher (``torch.cuda.is_bf16_supported()`` and
``get_device_capability()`` initialise CUDA). So the parent's questions (is there a device, how many, which compute
capability, native bf16) are answered here, once per process, by the first of:

1. torch itself, when this process already holds a CUDA context (a trial, a GPU test): asking costs nothing more;
2. the torch build: a CPU-only build sees no device, whatever the machine has;
3. NVML (``pynvml``, the ``nvidia-ml-py`` package): the driver's own view, no CUDA context. Used only where it
   cannot disagree with CUDA's numbering (``CUDA_VISIBLE_DEVICES`` unset or whole numbers, and the visible devices
   alike or ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), and only when the driver's CUDA version runs this torch's;
4. a child process (``python -m bench.measure.cuda_caps``) that asks torch and exits, taking its context with it.

Native bf16 means compute capability 8.0 or newer: ``torch.cuda.is_bf16_supported()`` also answers True where bf16
is only emulated, which is not what a technique's check asks.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bench.core.files import REPO_DIR

log = logging.getLogger(__name__)

CHILD_TIMEOUT_S = 120.0  # a child that imports torch and asks the driver: seconds on a healthy machine
BF16_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Device:
    """One visible CUDA device."""

    name: str
    capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        """Native bf16 tensor cores (Ampere or newer)."""
        return tuple(self.capability) >= BF16_CAPABILITY


@dataclass(frozen=True)
class CudaCaps:
    """The visible CUDA devices, where the answer came from, and why there are none when there are none."""

    devices: tuple[Device, ...] = ()
    source: str = "none"
    reason: str | None = None

    @property
    def available(self) -> bool:
        return bool(self.devices)

    @property
    def count(self) -> int:
        return len(self.devices)

    def device(self, device: torch.device | str | int | None = None) -> Device:
        """The device ``cuda:N`` (index 0 for ``cuda``); a clear error for one that is not visible."""
        index = _index(device)
        if not 0 <= index < len(self.devices):
            raise RuntimeError(f"no CUDA device {index} is visible ({self.count} visible; {self.reason or self.source})")
        return self.devices[index]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CudaCaps:
        data = json.loads(text)
        devices = tuple(Device(d["name"], (int(d["capability"][0]), int(d["capability"][1])))
                        for d in data.get("devices", ()))
        return cls(devices, data.get("source", "none"), data.get("reason"))


def _index(device: torch.device | str | int | None) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


_cached: CudaCaps | None = None


def get() -> CudaCaps:
    """This process's answer, probed once (``reset`` forgets it)."""
    global _cached
    if _cached is None:
        _cached = probe()
        log.info("CUDA devices (%s): %s", _cached.source,
                 ", ".join(f"{d.name} {d.capability[0]}.{d.capability[1]}" for d in _cached.devices) or _cached.reason)
    return _cached


def reset() -> None:
    global _cached
    _cached = None


def available() -> bool:
    return get().available


def device_count() -> int:
    return get().count


def capability(device: torch.device | str | int | None = None) -> tuple[int, int]:
    return get().device(device).capability


def name(device: torch.device | str | int | None = None) -> str:
    return get().device(device).name


def bf16(device: torch.device | str | int | None = None) -> bool:
    return get().device(device).bf16


def probe() -> CudaCaps:
    """The answer, by the first source that can give it (the module's docstring says which and why)."""
    if torch.cuda.is_initialized():
        return from_torch("torch, in this process (it already holds a CUDA context)")
    if not torch.backends.cuda.is_built():
        return CudaCaps(source="torch build", reason=f"torch {torch.__version__} is a CPU-only build")
    found = from_nvml()
    if found is not None:
        return found
    return from_child()


def from_torch(source: str) -> CudaCaps:
    """Ask torch directly (this initialises CUDA: only where a context is wanted or already there)."""
    if not torch.cuda.is_available():
        return CudaCaps(source=source, reason=f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable "
                                              "CUDA device")
    devices = tuple(Device(torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)))
                    for i in range(torch.cuda.device_count()))
    return CudaCaps(devices, source)


def from_nvml() -> CudaCaps | None:
    """NVML's view of the visible devices, or None when NVML cannot answer for CUDA (then a child process asks)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA driver, so no CUDA device
        text = f"{type(exc).__name__}: {exc}"
        if "LibraryNotFound" in text or "DriverNotLoaded" in text or "Library Not Found" in text:
            return CudaCaps(source="nvml", reason=f"no NVIDIA driver ({text})")
        return None
    try:
        return _nvml_devices(pynvml)
    except Exception as exc:  # an NVML too old for a query, a device in a bad state: let CUDA answer instead
        log.info("NVML could not answer (%s: %s); asking a child process", type(exc).__name__, exc)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # shutting down a library we only read from: nothing to do about it
            pass


def _nvml_devices(pynvml: Any) -> CudaCaps | None:
    driver = int(pynvml.nvmlSystemGetCudaDriverVersion())  # e.g. 13000: the newest CUDA the driver runs
    runtime = torch.version.cuda or ""
    if runtime and driver // 1000 < int(runtime.split(".")[0]):
        return CudaCaps(source="nvml", reason=f"the driver runs CUDA up to {driver // 1000}.{driver % 1000 // 10}, "
                                              f"older than this torch's CUDA {runtime}")
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    devices = []
    for handle in handles:
        raw = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        devices.append(Device(raw.decode() if isinstance(raw, bytes) else str(raw), (int(major), int(minor))))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v.strip() for v in visible.split(",")] if visible.strip() else []
        if not all(v.isdigit() for v in items):  # UUIDs, MIG instances, "-1": CUDA's own rules, in a child
            return None
        chosen = []
        for v in items:  # CUDA stops at the first index that does not exist
            if int(v) >= len(devices):
                break
            chosen.append(devices[int(v)])
        devices = chosen
    # NVML numbers devices by PCI bus; CUDA by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID. Alike devices: no matter.
    if len(set(devices)) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None
    if not devices:
        return CudaCaps(source="nvml", reason=f"CUDA_VISIBLE_DEVICES={visible!r} leaves no device visible")
    return CudaCaps(tuple(devices), "nvml")


def from_child(timeout_s: float = CHILD_TIMEOUT_S) -> CudaCaps:
    """A child process's answer (``python -m bench.measure.cuda_caps``): its CUDA context ends with it."""
    cmd = [sys.executable, "-m", "bench.measure.cuda_caps"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_DIR)
    except subprocess.TimeoutExpired:
        return CudaCaps(source="a child process", reason=f"asking torch for the CUDA devices took over {timeout_s:g} s")
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        return CudaCaps(source="a child process", reason=f"the child asking torch failed (exit {proc.returncode}): {tail}")
    return CudaCaps.from_json(lines[-1])


def main() -> int:
    """The child's side: torch's answer as one JSON line on stdout."""
    print(from_torch("a child process").to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
