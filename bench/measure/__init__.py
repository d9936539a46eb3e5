"""Measurement: small separate trackers, each tested against a deterministic proxy.

- ``timing``: ``StepTimer`` (device sync only at the window's edges), ``summarize`` (median/IQR), ``CpuContention``
  (CPU time other processes took during a window);
- ``memory``: ``PeakRss``, ``TensorMemoryTracker`` (params/grads/optimizer/activations/other at the peak),
  ``cuda_peak_reset`` / ``cuda_peak_bytes``;
- ``flops``: ``count_flops`` (FlopCounterMode) and ``mfu``;
- ``energy``: ``EnergyMeter`` (NVML on NVIDIA GPUs, RAPL powercap on Linux CPUs, else a reason).
"""
