"""Energy over a window, where the hardware exposes a counter.

- NVIDIA GPUs: NVML's total-energy counter (millijoules since driver load, Volta and newer) via the optional
  ``pynvml`` package (``pip install nvidia-ml-py``). It covers the GPU board only.
- CPUs on Linux: the powercap RAPL package counters (``/sys/class/powercap/intel-rapl:N/energy_uj``; AMD Zen
  exposes them under the same name). They cover the CPU packages only (and often need root to read).

Where neither is available the result says why instead of guessing (the project's CI VM has neither).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

POWERCAP_ROOT = Path("/sys/class/powercap")
_TOP_ZONE = re.compile(r"^intel-rapl:\d+$")  # packages; intel-rapl:N:M are sub-zones already inside them


@dataclass
class EnergyResult:
    """Joules used during the window, what counted them, or why nothing could."""

    joules: float | None
    source: str | None
    reason: str | None = None


@dataclass
class _Zone:
    name: str
    energy_path: Path
    max_uj: int | None


class RaplReader:
    """Reads the package-level RAPL counters under a powercap root (injectable, for tests with a fake tree).

    Only top-level zones are summed: the core and uncore sub-zones are already included in their package; a dram
    sub-zone is a separate domain that is not added (the energy is the CPU packages', DRAM excluded). A "psys" zone (whole platform) overlaps the packages, so it is used only when there is no package zone.
    """

    def __init__(self, root: Path = POWERCAP_ROOT) -> None:
        self.root = Path(root)
        self.zones: list[_Zone] = []
        self.reason: str | None = None
        self._discover()

    def _discover(self) -> None:
        candidates: list[_Zone] = []
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                if not _TOP_ZONE.match(d.name):
                    continue
                energy = d / "energy_uj"
                try:
                    int(energy.read_text())
                except (OSError, ValueError):
                    continue  # typically permission denied: since 2020 kernels make energy_uj root-only
                try:
                    name = (d / "name").read_text().strip()
                except OSError:
                    name = d.name
                try:
                    max_uj: int | None = int((d / "max_energy_range_uj").read_text())
                except (OSError, ValueError):
                    max_uj = None
                candidates.append(_Zone(name, energy, max_uj))
        packages = [z for z in candidates if z.name != "psys"]
        self.zones = packages or candidates
        if not self.zones:
            self.reason = f"no RAPL powercap counters readable on this machine ({self.root})"

    @property
    def available(self) -> bool:
        return bool(self.zones)

    @property
    def source(self) -> str:
        return "rapl:" + "+".join(z.name for z in self.zones)

    def read(self) -> list[int]:
        """The raw counters, microjoules, one per zone."""
        return [int(z.energy_path.read_text()) for z in self.zones]

    def joules_between(self, start: list[int], end: list[int]) -> float:
        """Energy between two readings; a counter that wrapped around once is corrected with its range."""
        total_uj = 0
        for zone, a, b in zip(self.zones, start, end, strict=True):
            delta = b - a
            if delta < 0:
                if zone.max_uj is None:
                    raise ValueError(f"RAPL counter {zone.name} went backwards and has no max_energy_range_uj")
                delta += zone.max_uj
            total_uj += delta
        return total_uj / 1e6


class _NvmlReader:
    """NVML's total energy counter for one CUDA device (mJ)."""

    def __init__(self, device: torch.device) -> None:
        import pynvml  # optional dependency: ImportError is handled by the caller

        self._nvml = pynvml
        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            # CUDA_VISIBLE_DEVICES renumbers devices for CUDA but not for NVML; torch knows the mapping.
            nvml_index = torch.cuda._get_nvml_device_index(index)
        except (AttributeError, RuntimeError):
            nvml_index = index
        self._handle: Any = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        name = pynvml.nvmlDeviceGetName(self._handle)
        self.source = f"nvml:{name.decode() if isinstance(name, bytes) else name}"  # bytes in old pynvml
        self.read()  # raises NVMLError_NotSupported on GPUs without the counter

    def read(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))


class EnergyMeter:
    """Energy used during a window: ``start()``, then ``stop() -> EnergyResult``.

    On CUDA the window's edges should already be synchronised by the caller (the step timer does it) so queued
    kernels are not billed to the next window. A counter that fails to read at either edge (an NVML error, a RAPL
    file gone) gives no joules and says why (``failed``): energy is auxiliary, it never fails the trial.
    """

    def __init__(self, device: torch.device | str, powercap_root: Path = POWERCAP_ROOT) -> None:
        self.device = torch.device(device)
        self._reader: Any = None
        self._source: str | None = None
        self._reason: str | None = None
        self._start: Any = None
        self.failed: str | None = None  # why a counter that was there could not be read (this window)
        if self.device.type == "cuda":
            try:
                self._reader = _NvmlReader(self.device)
                self._source = self._reader.source
            except ImportError:
                self._reason = "pynvml is not installed (pip install nvidia-ml-py) so NVML energy is unavailable"
            except Exception as exc:  # NVMLError subclasses, e.g. NotSupported on older GPUs
                self._reason = f"NVML energy counter unavailable: {type(exc).__name__}: {exc}"
        else:
            rapl = RaplReader(powercap_root)
            if rapl.available:
                self._reader, self._source = rapl, rapl.source
            else:
                self._reason = rapl.reason
        if self._reason:
            log.info("energy not measured: %s", self._reason)

    @property
    def available(self) -> bool:
        return self._reader is not None

    def _read(self, edge: str) -> Any:
        """The counters now, or None (and ``failed`` says why) when reading them fails."""
        try:
            return self._reader.read()
        except Exception as exc:  # NVMLError, OSError, ValueError: the window's energy is lost, not the trial
            self.failed = (f"reading the {self._source} energy counter at the window's {edge} failed: "
                           f"{type(exc).__name__}: {exc}").splitlines()[0][:300]
            log.warning("energy not measured: %s", self.failed)
            return None

    def start(self) -> None:
        """Read the counters at the start of the window."""
        self.failed = None
        self._start = self._read("start") if self._reader is not None else None

    def stop(self) -> EnergyResult:
        """Joules since ``start()``, or None with the reason."""
        if self._reader is None:
            return EnergyResult(joules=None, source=None, reason=self._reason)
        if self.failed is not None:  # the start could not be read
            return EnergyResult(joules=None, source=self._source, reason=self.failed)
        if self._start is None:
            raise RuntimeError("EnergyMeter.stop() called before start()")
        end = self._read("end")
        start, self._start = self._start, None
        if end is None:
            return EnergyResult(joules=None, source=self._source, reason=self.failed)
        if isinstance(self._reader, RaplReader):
            try:
                joules = self._reader.joules_between(start, end)
            except ValueError as exc:  # an energy reading is auxiliary: it never fails the trial's measurements
                self.failed = str(exc)
                return EnergyResult(joules=None, source=self._source, reason=str(exc))
        else:
            # The NVML counter is 64-bit millijoules: it does not wrap in practice.
            joules = (end - start) / 1000.0
        return EnergyResult(joules=joules, source=self._source, reason=None)
