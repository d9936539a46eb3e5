"""The sweep's own process (the parent of every trial) never initialises CUDA: it asks ``bench.measure.cuda_caps``
(NVML, or a child process) what the devices can do, and the trials, child processes, are the only ones to use them.

Shown on the CPU: every torch.cuda call that answers a capability question or creates a context raises here, and a
sweep on a (faked) CUDA device is planned, run (its trial processes replaced by records of the first H200 run, its
environment and references by what their child processes would return), sequentially extended and reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import reference as reference_mod
from bench.measure import cuda_caps
from bench.plan import gpu, planner
from bench.plan.config import GPU_CHECK, build_config
from bench.records.results import TrialRecord
from bench.run import workflow
from bench.run.launcher import TrialLauncher
from tests.conftest import TINY_BUDGET, fake_cuda

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "reports" / "example-h200-first"
# What answers a capability question or creates a CUDA context (is_bf16_supported and get_device_capability do
# through _lazy_init; the rest ask the driver or the device directly).
CUDA_CALLS = ("is_available", "is_bf16_supported", "get_device_capability", "get_device_name", "get_device_properties",
              "device_count", "current_device", "set_device", "synchronize", "init", "_lazy_init", "mem_get_info")


@pytest.fixture
def cuda_refused(monkeypatch):
    """Every call of CUDA_CALLS raises, and is listed in the returned list (in case something catches it)."""
    calls: list[str] = []

    def refusing(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"torch.cuda.{name} was called in the sweep's own process")
        return call

    for name in CUDA_CALLS:
        monkeypatch.setattr(torch.cuda, name, refusing(name))
    return calls


def test_cuda_caps_answers_without_torch_cuda_where_torch_is_a_cpu_build(cuda_refused, monkeypatch):
    monkeypatch.setattr(cuda_caps, "_cached", None)
    if torch.backends.cuda.is_built():
        pytest.skip("this torch is a CUDA build: its answer comes from NVML or a child process")
    caps = cuda_caps.get()
    assert not caps.available and "CPU-only build" in caps.reason and cuda_refused == []


def test_nvml_answers_for_the_visible_devices_and_defers_to_a_child_where_it_cannot(monkeypatch):
    """NVML's answer (faked pynvml) honours CUDA_VISIBLE_DEVICES; numbering NVML cannot map is left to a child."""
    class Nvml:
        def nvmlInit(self): ...
        def nvmlShutdown(self): ...
        def nvmlSystemGetCudaDriverVersion(self): return 13000
        def nvmlDeviceGetCount(self): return 3
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return b"NVIDIA H200" if h < 2 else "NVIDIA A10"
        def nvmlDeviceGetCudaComputeCapability(self, h): return (9, 0) if h < 2 else (8, 6)

    monkeypatch.setitem(__import__("sys").modules, "pynvml", Nvml())
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    caps = cuda_caps.from_nvml()
    assert caps.source == "nvml" and caps.count == 2 and caps.device(1).name == "NVIDIA H200" and caps.device(0).bf16
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")  # unlike devices: CUDA's order may not be NVML's
    assert cuda_caps.from_nvml() is None
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [d.name for d in cuda_caps.from_nvml().devices] == ["NVIDIA H200", "NVIDIA A10"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e3c")  # a UUID: a child process applies CUDA's rules
    assert cuda_caps.from_nvml() is None
    monkeypatch.setattr(torch.version, "cuda", "14.0")  # a driver too old for this torch: no usable device
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert "older than this torch's CUDA 14.0" in cuda_caps.from_nvml().reason


def test_the_gpu_check_is_planned_on_a_cuda_device_without_a_cuda_call(cuda_refused, monkeypatch):
    fake_cuda(monkeypatch, 1, "NVIDIA H200", (9, 0))
    cfg = build_config("gpu", {**GPU_CHECK, "repeats": "auto"})  # device auto: the gpu preset, CUDA seen
    assert cfg.name == "gpu" and planner.resolve_device(cfg.device) == torch.device("cuda")
    trials = planner.plan(cfg, torch.device("cuda"))
    assert len(trials) == 15 and all(t.skip_reason is None for t in trials)
    gpu.check_plan()
    fake_cuda(monkeypatch, 1, "Tesla V100", (7, 0))  # an older GPU: refused from the capabilities, still no call
    reasons = {t.techniques.label: t.skip_reason for t in planner.plan(cfg, torch.device("cuda"))}
    assert "compute capability 7.0" in reasons["tf32"] and "bf16" in reasons["bf16"]
    assert cuda_refused == []


def _h200_record(launcher: TrialLauncher, trial, env: dict) -> TrialRecord:
    """What a trial process would have returned: the first H200 run's record of the set (compile's for a set it did
    not run), renamed to this trial."""
    by_label = {}
    for line in (H200 / "results.jsonl").read_text().splitlines():
        data = json.loads(line)
        by_label.setdefault(data["technique_label"], data)
    data = dict(by_label.get(trial.techniques.label) or by_label["bf16+compile"])
    bare = launcher.bare_record(trial, "ok", None)
    data.update(sweep_id=bare.sweep_id, trial_id=bare.trial_id, technique_label=bare.technique_label,
                techniques=bare.techniques, seed=bare.seed, repeat=bare.repeat, position=bare.position,
                mode=bare.mode, kind=bare.kind, workload={**data["workload"], **bare.workload})
    record = TrialRecord.from_dict(data)
    record.config_hash, record.added_by, record.wall_s = launcher.config_hash, trial.added_by, data["wall_s"]
    return record


def test_a_cuda_sweeps_parent_plans_runs_extends_and_reports_without_a_cuda_call(cuda_refused, monkeypatch, tmp_path):
    fake_cuda(monkeypatch, 1, "NVIDIA H200", (9, 0))
    env = json.loads((H200 / "env.json").read_text())
    monkeypatch.setattr(TrialLauncher, "_measured_environment", lambda self: dict(env))  # its child's answer
    asked: list[str] = []
    monkeypatch.setattr(reference_mod, "ensure", lambda keys, cache_dir, device, *a, **k: asked.append(device))
    monkeypatch.setattr(TrialLauncher, "run", _h200_record)
    cfg = build_config("gpu", {**GPU_CHECK, "repeats": "auto", "decide_within": 60.0})
    done = workflow.sweep(cfg, tmp_path / "sweep")
    assert asked == ["cuda"]  # the references' child process is told the device; this one never touches it
    assert len(done.records) >= 15 and {r.status for r in done.records} == {"ok"}
    assert (tmp_path / "sweep" / "report.md").exists() and cuda_refused == []


@pytest.mark.slow  # trial processes on the CPU: about half a minute on 2 cores
def test_a_real_cpu_sweeps_parent_makes_no_cuda_call(cuda_refused, tmp_path):
    """The same on the CPU with real trial processes (their torch.cuda is their own): the parent's side of the CPU
    path (device auto, the preset, the plan, the sequential phase) never asks torch.cuda either."""
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline,bf16", "repeats": 1, "mode": "speed",
                                 "budget": {**TINY_BUDGET, "memory": False}})
    done = workflow.sweep(cfg, tmp_path / "sweep")
    assert {r.status for r in done.records} == {"ok"} and cuda_refused == []
