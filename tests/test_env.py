"""Fingerprint, measured peak FLOP/s and datasheet peaks."""

from __future__ import annotations

import json
import time

import pytest
import torch

from bench.measure.env import (
    DATASHEET_PEAK_FLOPS,
    calibrate_peaks,
    datasheet_peak,
    fingerprint,
    measure_peak_flops,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

KEYS = {
    "hostname", "platform", "python", "torch", "torch_cuda", "cudnn", "cpu_model", "cpu_logical", "cpu_physical",
    "torch_threads", "memory_total_bytes", "cpu_flags", "gpu", "packages", "git", "timestamp_utc",
}


def test_fingerprint_keys(tmp_path):
    info = fingerprint(tmp_path)  # not a git checkout: tolerated
    assert KEYS <= info.keys()
    assert info["torch"] == torch.__version__
    assert info["torch_threads"] == torch.get_num_threads()
    assert info["cpu_logical"] >= 1 and info["memory_total_bytes"] > 0
    assert set(info["cpu_flags"]) >= {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert all(isinstance(v, bool) for v in info["cpu_flags"].values())
    assert info["packages"]["numpy"] is not None and set(info["packages"]) >= {"pandas", "scipy", "matplotlib"}
    assert info["git"] == {"commit": None, "dirty": None}
    assert (info["gpu"] is not None) == torch.cuda.is_available()
    json.dumps(info)  # stored as env.json
    assert fingerprint()["git"] is None


def test_measure_peak_flops_cpu_within_budget():
    t0 = time.perf_counter()
    result = measure_peak_flops(torch.device("cpu"), torch.float32, budget_s=0.5)
    elapsed = time.perf_counter() - t0
    assert result["flops"] > 0
    assert result["kernel"] in result["by_kernel"] and 256 <= result["n"] <= 2048
    assert result["dtype"] == "float32"
    assert elapsed < 0.5 + 1.5  # slack for inputs, the warm-up op and a loaded machine


def test_calibrate_peaks_keys():
    # a tiny budget: this checks the plumbing (slow dtypes stop at the first size), not the numbers
    peaks = calibrate_peaks("cpu", budget_s=0.3)
    assert set(peaks) == {"float32", "bfloat16", "float16"}
    assert all(p["flops"] > 0 for p in peaks.values())


def test_datasheet_peak():
    assert datasheet_peak("NVIDIA H200", torch.bfloat16) == 989.4e12
    assert datasheet_peak("NVIDIA H200", "tf32") == 494.7e12
    assert datasheet_peak("NVIDIA H200 NVL", "bfloat16") == 835.5e12
    assert datasheet_peak("NVIDIA H100 80GB HBM3", torch.float16) == 989.4e12
    assert datasheet_peak("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5e12
    assert datasheet_peak("NVIDIA L40S", "bf16") == 362.05e12
    assert datasheet_peak("Tesla T4", torch.bfloat16) is None  # no bf16 tensor cores
    assert datasheet_peak("NVIDIA A10G", torch.bfloat16) is None  # not "A10": whole-token match
    assert datasheet_peak("AMD EPYC", torch.float32) is None
    assert all(v > 0 for peaks in DATASHEET_PEAK_FLOPS.values() for v in peaks.values())


@pytest.mark.gpu
@needs_cuda
def test_measure_peak_flops_cuda():
    result = measure_peak_flops(torch.device("cuda"), torch.bfloat16, budget_s=1.0)
    assert result["flops"] > 1e12 and result["kernel"] == "torch.mm"
    name = torch.cuda.get_device_name()
    sheet = datasheet_peak(name, torch.bfloat16)
    if sheet is not None:
        assert result["flops"] < 1.1 * sheet  # a dense matmul cannot beat the dense datasheet peak
