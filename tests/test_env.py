"""Fingerprint, measured peak FLOP/s and datasheet peaks."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
REPORT = Path(__file__).resolve().parent.parent / "reports" / "example-h200-first"

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


# ---- a sweep's environment and per-device peaks -------------------------------------------------------------------


def test_measure_environment_on_the_cpu_calibrates_each_thread_count_and_no_device():
    from bench.measure.env import measure_environment

    env = measure_environment("cpu", [1, 2], budget_s=0.3)
    assert KEYS <= env.keys()
    assert set(env["peak_flops_by_threads"]) == {"1", "2"}
    assert env["peak_flops"] is env["peak_flops_by_threads"]["1"]  # the one-process trials' count comes first
    assert env["peak_flops"]["float32"]["threads"] == 1 and env["peak_flops_by_threads"]["2"]["float32"]["threads"] == 2
    assert "peak_flops_by_device" not in env  # the CPU is one device, calibrated per thread count


def _device_env(flops_by_device, names):
    """An env.json's GPU part: per-device bf16 peaks in TFLOP/s and the fingerprint's device names."""
    return {"gpu": {"devices": [{"name": n} for n in names]},
            "peak_flops_by_device": {d: {"bfloat16": {"flops": f * 1e12}, "float32": {"flops": None}}
                                     for d, f in flops_by_device.items()}}


def test_devices_of_one_model_whose_peaks_disagree_are_named():
    from bench.measure.env import peak_disagreements

    # The first H200 sweep's bf16 calibration (707 TFLOP/s) beside a device 30% below it, and one within the 20%
    # tolerance (calibrations of one device vary: tf32 334-378 there)
    env = _device_env({"cuda:0": 707, "cuda:1": 495, "cuda:2": 650}, ["NVIDIA H200"] * 3)
    (line,) = peak_disagreements(env)
    assert line.startswith("cuda:1's calibrated bfloat16 peak, 495 TFLOP/s, is 30% below cuda:0's 707 on the same "
                           "model (NVIDIA H200)")
    # Devices of other models are not compared; a dtype that did not run is skipped; old env.json: nothing to say
    assert peak_disagreements(_device_env({"cuda:0": 707, "cuda:1": 300}, ["NVIDIA H200", "NVIDIA L40S"])) == []
    assert peak_disagreements(json.loads((REPORT / "env.json").read_text())) == []


def test_env_json_of_the_first_h200_sweep_still_reads_as_one_device():
    """The H200 sweep's env.json predates per-device peaks: its peaks are the device's, as before."""
    env = json.loads((REPORT / "env.json").read_text())
    assert "peak_flops_by_device" not in env
    assert env["peak_flops"]["bfloat16"]["flops"] == pytest.approx(707.34e12, rel=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_every_visible_device_is_calibrated_on_its_own_stream():
    """Each GPU's peak is under its dense datasheet peak: timed on another device's stream (cuda:0's while
    calibrating cuda:1), a product would seem to take no time and its FLOP/s would exceed any datasheet."""
    from bench.measure.env import measure_environment

    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    env = measure_environment("cuda", [torch.get_num_threads()], devices, budget_s=1.0)
    assert list(env["peak_flops_by_device"]) == devices and env["peak_flops"] is env["peak_flops_by_device"]["cuda:0"]
    for i, device in enumerate(devices):
        flops = env["peak_flops_by_device"][device]["bfloat16"]["flops"]
        sheet = datasheet_peak(torch.cuda.get_device_name(i), torch.bfloat16)
        assert flops > 1e12 and (sheet is None or flops < 1.1 * sheet), (device, flops, sheet)
