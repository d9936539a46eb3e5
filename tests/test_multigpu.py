"""Multi-GPU guards that need no GPU to check (docs/distributed.md, "Before NCCL has run").

- The sweep's own process measures env.json in a child process: the fingerprint and the calibration would raise
  here if they ran in this process. On a CPU machine that is all it can show; that the runner then holds no CUDA
  context while trials run is checked on a GPU (``test_the_runner_holds_no_cuda_context_on_a_gpu``).
- Peaks are per device: the launcher hands each rank's device's calibrated peaks to a trial on several GPUs, the
  trial's peak is their sum and each device's MFU is against its own; an env.json from before (the first H200 sweep's)
  still gives its peaks.
- A rank whose local rank has no device says so in one line.

The --nproc refusal is in tests/test_plan.py, the window's barrier in tests/test_measure.py, pp's stage clock in
tests/test_pp.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from bench.measure import env as envmod
from bench.plan.config import build_config
from bench.plan.planner import plan
from bench.run.launcher import TrialLauncher
from bench.run.runner import SweepRunner
from bench.trial import TrialSpec, _rank_device, trial_peak
from tests.conftest import REPO, TINY_BUDGET, fake_cuda

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
H200_ENV = REPO / "reports" / "example-h200-first" / "env.json"


def config(**over):
    return build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1,
                                  "budget": {**TINY_BUDGET, "memory": False}, **over})


def refuse(*args, **kwargs):
    raise AssertionError("ran in the sweep's own process")


@pytest.fixture
def two_gpus(monkeypatch):
    """Two CUDA devices, as the runner's process asks (bench.measure.cuda_caps) and a trial's would (torch.cuda:
    only whether they are there and how many)."""
    fake_cuda(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_the_runner_measures_its_environment_in_a_child_process(tmp_path, monkeypatch):
    monkeypatch.setattr(envmod, "calibrate_peaks", refuse)
    monkeypatch.setattr(envmod, "fingerprint", refuse)
    monkeypatch.setattr(envmod, "measure_environment", refuse)
    monkeypatch.setattr(torch.cuda, "_lazy_init", refuse)  # nothing here may initialise CUDA either
    runner = SweepRunner(config(), tmp_path / "sweep", CPU, command="the test's")
    try:
        env = runner.prepare()
    finally:
        runner.close()
    assert env == json.loads((tmp_path / "sweep" / "env.json").read_text())
    assert env["device"] == "cpu" and env["command"] == "the test's" and env["hostname"]
    assert env["git"]["commit"]  # the trials' checkout's commit, read by the child
    assert env["peak_flops"]["float32"]["flops"] > 0 and set(env["peak_flops_by_threads"]) == {
        str(n) for n in runner.launcher.thread_counts()}
    assert not torch.cuda.is_initialized()


def test_a_failed_environment_child_fails_the_sweep_loudly(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # a child that exits 1 and writes nothing
    runner = SweepRunner(config(), tmp_path / "sweep", CPU)
    with pytest.raises(RuntimeError, match=r"^measuring the environment failed \(exit 1\)"):
        runner.prepare()
    assert not (tmp_path / "sweep" / "env.json").exists() and not runner.claimed  # the lock is released


def test_a_trial_on_several_gpus_gets_each_devices_own_peaks(two_gpus, tmp_path):
    cfg = config(techniques="ddp", nproc=2)
    launcher = TrialLauncher(cfg, tmp_path, CUDA, tmp_path)
    assert launcher.calibrated_devices() == ["cuda:0", "cuda:1"]
    assert TrialLauncher(config(nproc=2), tmp_path, CUDA, tmp_path).calibrated_devices() == ["cuda:0"]  # 1 process
    assert TrialLauncher(config(), tmp_path, torch.device("cuda:1"), tmp_path).calibrated_devices() == ["cuda:1"]
    assert TrialLauncher(cfg, tmp_path, CPU, tmp_path).calibrated_devices() == []
    peak = {"cuda:0": 707e12, "cuda:1": 600e12}
    by_device = {d: {"bfloat16": {"flops": f}, "float16": {"flops": None}} for d, f in peak.items()}
    threads = str(launcher.thread_counts()[0])
    env = {"peak_flops": by_device["cuda:0"], "peak_flops_by_threads": {threads: by_device["cuda:0"]},
           "peak_flops_by_device": by_device}
    trials = {t.techniques.label: t for t in plan(cfg, CUDA)}
    ddp = launcher._spec(trials["ddp"], env)
    assert ddp.device_peaks == {"cuda:0": {"bfloat16": 707e12}, "cuda:1": {"bfloat16": 600e12}}
    assert ddp.peak_source == "calibrated on this machine, each device on its own"
    assert TrialSpec.from_json(ddp.to_json()) == ddp
    baseline = launcher._spec(trials["baseline"], env)  # one process: its device's peaks, as before
    assert baseline.peaks == {"bfloat16": 707e12} and baseline.device_peaks == {}
    assert "device_peaks" not in json.loads(baseline.to_json())  # older checkouts (sweep --ab) read it as before


def _spec(**over) -> TrialSpec:
    fields = {"sweep_id": "s", "trial_id": "t", "workload": "gpt", "size": "tiny", "techniques": ["ddp"], "seed": 0,
              "repeat": 0, "device": "cuda", "budget": {},
              "peak_source": "calibrated on this machine, each device on its own"}
    return TrialSpec(**{**fields, **over})


def test_a_trials_peak_is_the_sum_of_its_devices_own(monkeypatch):
    devices = {"cuda:0": {"bfloat16": 707e12}, "cuda:1": {"bfloat16": 600e12}}
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    total, by_device, source = trial_peak(_spec(world_size=2, peaks={"bfloat16": 707e12}, device_peaks=devices),
                                          "bfloat16")
    assert total == 1307e12 and by_device == {"cuda:0": 707e12, "cuda:1": 600e12}
    assert source == "calibrated on this machine, each device on its own (summed over 2 devices)"
    # Two nodes of two: node 0 calibrated its own devices; the other node's are assumed like them, and said so
    total, _, source = trial_peak(_spec(world_size=4, device_peaks=devices), "bfloat16")
    assert total == 2 * 1307e12 and source.endswith("(summed over 2 devices; 1 other node(s) assumed like this one)")
    # A dtype a device did not calibrate, or an env.json from before per-device peaks: the first device's x ranks
    assert trial_peak(_spec(world_size=2, peaks={"float16": 6e14}, device_peaks=devices), "float16")[:2] == (
        12e14, None)
    assert trial_peak(_spec(world_size=2, peaks={"bfloat16": 707e12}), "bfloat16")[:2] == (1414e12, None)
    # One process, or CPU ranks (each calibrated at its one thread): as before
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert trial_peak(_spec(peaks={"bfloat16": 707e12}), "bfloat16")[:2] == (707e12, None)
    assert trial_peak(_spec(world_size=2, device="cpu", peaks={"float32": 5e10}), "float32")[:2] == (1e11, None)
    assert trial_peak(_spec(peaks={}), "bfloat16") == (None, None, None)


def test_the_first_h200_sweeps_env_json_still_gives_its_peaks(two_gpus, tmp_path, monkeypatch):
    """An env.json from before per-device peaks (the H200 sweep's, resumed): read as it is, no child process; a
    one-process trial gets the device's peaks, a two-rank trial the first device's with the source saying so."""
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copy(H200_ENV, out / "env.json")
    cfg = config(techniques="ddp", nproc=2)
    launcher = TrialLauncher(cfg, out, CUDA, tmp_path)
    monkeypatch.setattr(subprocess, "run", refuse)
    env = launcher.environment("resumed", resume=True)
    trials = {t.techniques.label: t for t in plan(cfg, CUDA)}
    baseline = launcher._spec(trials["baseline"], env)
    assert baseline.peaks["bfloat16"] == pytest.approx(707.34e12, rel=1e-4) and baseline.device_peaks == {}
    ddp = launcher._spec(trials["ddp"], env)
    assert ddp.device_peaks == {} and "assumed for every rank's" in ddp.peak_source


def test_a_local_rank_without_a_device_says_so(two_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(RuntimeError, match="^local rank 2 has no CUDA device of its own: torch sees 2 on this node$"):
        _rank_device("cuda")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _rank_device("cuda") == torch.device("cuda", 1)
    assert _rank_device("cpu") == CPU


CONTEXT_CHECK = """
import json, sys, torch
from pathlib import Path
from bench.plan.config import build_config
from bench.run.runner import SweepRunner
cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1})
runner = SweepRunner(cfg, Path(sys.argv[1]), torch.device("cuda"))
env = runner.prepare()
runner.close()
print(json.dumps({"initialized": torch.cuda.is_initialized(), "devices": list(env["peak_flops_by_device"])}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_runner_holds_no_cuda_context_on_a_gpu(tmp_path):
    """In a fresh process (this one may have used CUDA in other tests): after prepare() on CUDA, the runner's
    process has not initialised CUDA, and env.json holds the device's own peaks."""
    proc = subprocess.run([sys.executable, "-c", CONTEXT_CHECK, str(tmp_path / "sweep")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"initialized": False, "devices": ["cuda:0"]}


def test_the_docs_say_nccl_has_not_run_and_name_gpu_tests_that_exist():
    text = (REPO / "docs" / "distributed.md").read_text()
    assert "NCCL across several GPUs has not run yet" in text
    named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 4
    for path, name in named:  # a renamed test leaves the docs pointing at nothing: fail here instead
        source = (REPO / path).read_text()
        assert f"def {name}(" in source, f"{path}::{name}"
        assert "@pytest.mark.gpu" in source.split(f"def {name}(")[0].rsplit("\ndef ", 1)[-1], f"{name} is not marked gpu"
