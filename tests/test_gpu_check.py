"""scripts/gpu_check.sh and the gpu preset, as far as a CPU can check them: the fail-fast exit, the plan on a CUDA
device, the H200 figures the estimates rest on (derived again from the committed first H200 run), the time-budget
arithmetic, where the time went and the output's size. What needs a GPU: ``bash scripts/gpu_check.sh`` itself."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import techniques
import techniques.sdpa_backend as sdpa_backend
from bench import trial
from bench.dev import gpu_check
from bench.plan import gpu, planner
from bench.plan.config import GPU_CHECK, Budget, TechniqueSet, WorkloadSpec, build_config
from bench.records import reader
from techniques.base import Phase
from tests.conftest import fake_cuda, run_cli

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"
H200 = REPO / "reports" / "example-h200-first"
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path taken where torch sees no GPU")


# ---- the script's fail-fast exit -----------------------------------------------------------------------------


def _run_script(tmp_path: Path, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _fake_nvidia_smi(tmp_path: Path, body: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _one_line_and_nothing_run(result: subprocess.CompletedProcess, tmp_path: Path, words: str) -> None:
    assert result.returncode == 3, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpu_check: ") and words in result.stderr and "nothing was run" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_nvidia_smi_the_script_exits_3_with_one_line(tmp_path):
    _one_line_and_nothing_run(_run_script(tmp_path, os.environ["PATH"]), tmp_path, "nvidia-smi not found")


def test_a_failing_nvidia_smi_exits_3_with_one_line(tmp_path):
    path = _fake_nvidia_smi(tmp_path, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    _one_line_and_nothing_run(_run_script(tmp_path, path), tmp_path, "found no usable GPU")


@NO_GPU
def test_a_gpu_that_torch_cannot_use_exits_3_with_one_line(tmp_path):
    path = _fake_nvidia_smi(tmp_path, 'echo "NVIDIA H200, 143771 MiB, 580.159.04"')
    result = _run_script(tmp_path, path)
    _one_line_and_nothing_run(result, tmp_path, "torch.cuda.is_available() is False")
    assert "CUDA build" in result.stderr


STUB_PYTHON = """#!/usr/bin/env bash
# Stands in for the interpreter where a GPU would be needed; the planner and the report helpers run for real.
case "$*" in
  -c*) echo "torch 2.11.0+cu130, CUDA 13.0, NVIDIA H200, compute capability (9, 0)" ;;
  "-m pytest"*) echo "10 passed in 31.73s" ;;
  "-m bench sweep"*) echo "$*" > "$STUB_LOG"; out="${@: -1}"; [ "$out" = --resume ] && out="${@: -2:1}"
                     mkdir -p "$out" && cp "$H200"/results.jsonl "$H200"/env.json "$H200"/sweep.toml "$out"/
                     head -c 3000000 /dev/zero > "$out/cache.bin" ;;
  "-m bench report"*) ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


@pytest.mark.slow  # the whole script end to end (its sweep and tests run on the CPU)
def test_the_scripts_stages_run_in_order_with_stubbed_gpu_tools(tmp_path):
    """The script's plumbing (the plan read from bench.plan.gpu, the sweep's flags, where the time went, the size
    kept, a second run resuming) with the GPU's tools stubbed; what the stubs stand for needs a GPU."""
    path = _fake_nvidia_smi(tmp_path, 'echo "NVIDIA H200, 143771 MiB, 580.159.04"')
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    env = {**os.environ, "PATH": path, "PYTHON": str(stub), "REAL_PYTHON": sys.executable, "H200": str(H200),
           "STUB_LOG": str(tmp_path / "sweep-args"), "GPU_CHECK_LIMIT_MIB": "1", "PYTHONPATH": str(REPO),
           "GPU_CHECK_OUT": str(tmp_path / "example-h200")}
    first = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert first.returncode == 0, first.stdout + first.stderr
    out = tmp_path / "example-h200"
    args = (tmp_path / "sweep-args").read_text()
    assert "--preset gpu --device cuda --workloads gpt:gpt2-124m-b32" in args and "--repeats auto" in args
    assert "--techniques baseline,tf32,bf16,bf16+compile,bf16+compile+fused_adamw --mode speed" in args
    assert "--resume" not in args
    assert "gpu_check: checks " in first.stdout and "13 trials" in first.stdout
    assert (out / "pytest-m-gpu.txt").read_text() == "10 passed in 31.73s\n"
    assert (out / "gpu-check.txt").exists() and not (out / "cache.bin").exists()  # moved: over 1 MiB
    assert (tmp_path / "example-h200.overflow" / "cache.bin").exists()
    second = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300,
                            cwd=REPO)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "--resume" in (tmp_path / "sweep-args").read_text() and "resuming the run in" in second.stdout


def test_the_script_parses_and_takes_its_plan_from_the_planner():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    text = SCRIPT.read_text()
    assert "-m bench.dev.gpu_plan --left-s" in text and "--repeats auto" in text and "--preset gpu" in text
    assert "pytest -q -m gpu" in text and "gpu_check keep" in text and "gpu_check times" in text


# ---- the plan ----------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_h200(monkeypatch):
    """What the techniques' checks ask of a CUDA device (through bench.measure.cuda_caps), answered as an H200 would:
    nothing runs on it."""
    fake_cuda(monkeypatch, 1, "NVIDIA H200", (9, 0))
    monkeypatch.setattr("torch.backends.cusparselt.is_available", lambda: True)
    monkeypatch.setattr(sdpa_backend, "backend_problem", lambda *a, **k: None)  # its probe runs kernels
    return torch.device("cuda")


def test_the_gpu_preset_plans_every_set_on_its_transformers_and_skips_attention_kernels_on_the_cnn(fake_h200):
    cfg = build_config()  # no preset named, CUDA seen: the gpu preset
    assert cfg.name == "gpu"
    trials = planner.plan(cfg, fake_h200)
    assert len(trials) == 3 * 3 * 13  # repeats x workloads x sets (the baseline among them)
    reasons = {(t.workload.label, t.techniques.label): t.skip_reason for t in trials}
    missing = planner.available_packages().isdisjoint({"torchao"})
    for (workload, label), reason in reasons.items():
        if reason and missing and ("fp8" in label or "sparse24" in label):
            assert "torchao" in reason  # an optional extra not installed here: skipped with its name
        elif workload.startswith("cnn") and "sdpa_backend" in label:
            assert reason and "without attention" in reason
        elif workload.startswith("cnn") and reason:
            assert "Fashion-MNIST not found" in reason  # the dataset is a Debian package
        else:
            assert reason is None, (workload, label, reason)


def test_gpu_check_runs_the_core_sets_in_speed_mode_at_repeats_auto():
    cfg = gpu.check_config()
    assert [w.label for w in cfg.workloads] == GPU_CHECK["workloads"] == ["gpt:gpt2-124m-b32"]
    assert [t.label for t in cfg.techniques] == GPU_CHECK["techniques"]
    assert cfg.mode == "speed" and cfg.sequential and cfg.repeats == 3  # verdicts need 3 pairs at least
    assert cfg.budget == build_config("gpu", {"device": "cuda"}).budget  # the preset's window


def test_gpu_check_fits_its_8_minute_slot_after_the_trial_cost_work_but_not_today():
    plan = gpu.check_plan()
    assert plan.budget_s == 480 and plan.fits and plan.decide_within_s > 60
    e = plan.estimate
    assert e.total_s + plan.tests_s == pytest.approx(480)  # the sequential phase gets exactly what is left
    today = gpu.check_plan(costs=gpu.TODAY)
    assert not today.fits  # docs/gpu.md says so: with today's costs the cap cuts it, and a second run resumes
    assert today.estimate.planned_s > 2 * e.planned_s


def test_the_plan_reaches_the_script_as_shell_assignments():
    values = dict(line.split("=", 1) for line in gpu.shell(gpu.check_plan()).splitlines())
    assert set(values) == {"CHECK_WORKLOADS", "CHECK_TECHNIQUES", "CHECK_MODE", "CHECK_DECIDE_WITHIN"}
    unquoted = {k: shlex.split(v)[0] for k, v in values.items()}
    assert unquoted["CHECK_TECHNIQUES"].split(",") == GPU_CHECK["techniques"]
    assert int(unquoted["CHECK_DECIDE_WITHIN"]) == int(gpu.check_plan().decide_within_s)
    tight = gpu.check_plan(budget_s=100.0, tests_s=0.0)
    assert not tight.fits and "CHECK_DECIDE_WITHIN=0" in gpu.shell(tight)


# ---- the arithmetic ----------------------------------------------------------------------------------------------


def test_a_trial_estimate_adds_fixed_costs_one_off_window_passes_and_quality_run(monkeypatch):
    monkeypatch.setattr(gpu, "step_s", lambda workload, techs, batch_size=None: 0.5)
    w, plain, compiled = WorkloadSpec("gpt", "gpt2-124m-b32"), TechniqueSet(()), TechniqueSet.parse("bf16+compile")
    costs = gpu.TrialCosts("test", fixed_s=3.0, compile_cold_s=20.0, compile_warm_s=4.0)
    budget = Budget(warmup_steps=3, min_steps=10, min_seconds=2.0, max_seconds=10.0, parity_steps=8)
    # speed: 3 fixed + 10 window steps of 0.5 s + (8 warm-up/parity + 10 phase + 4 memory) steps of 0.5 s
    assert gpu.trial_s(w, plain, budget, "speed", costs, cold=True) == pytest.approx(3 + 5 + 11)
    assert gpu.trial_s(w, compiled, budget, "speed", costs, cold=True) == pytest.approx(19 + 20)
    assert gpu.trial_s(w, compiled, budget, "speed", costs, cold=False) == pytest.approx(19 + 4)
    # quality: 120 steps at 0.5 s, 11 evaluations of 32 windows at a third of a 32-sample step each
    q = gpu.trial_s(w, plain, Budget(max_train_seconds=150.0, timeout_s=300.0), "quality", costs, cold=True)
    assert q == pytest.approx(3 + 60 + 11 * 0.5 / 3)
    capped = gpu.trial_s(w, plain, Budget(max_train_seconds=30.0, timeout_s=300.0), "quality", costs, cold=True)
    assert capped == pytest.approx(3 + 30 + 11 * 0.5 / 3)  # the safety cap stops the quality run


def test_rates_follow_the_sets_compute_dtype_and_compile():
    assert gpu.rate(TechniqueSet(())) == gpu.H200_FLOPS[("float32", False)]
    assert gpu.rate(TechniqueSet.parse("bf16+compile+fused_adamw")) == gpu.H200_FLOPS[("bfloat16", True)]
    assert gpu.rate(TechniqueSet.parse("fp16")) == gpu.H200_FLOPS[("bfloat16", False)]  # not measured: as bf16
    assert gpu.rate(TechniqueSet.parse("tf32+compile")) == gpu.H200_FLOPS[("tfloat32", False)]


def test_flops_per_sample_is_the_harness_count_and_near_the_6n_formula():
    n_layer, seq, d = 12, 1024, 768
    counted = gpu.flops_per_sample("gpt", "gpt2-124m")
    n = gpu.n_params("gpt", "gpt2-124m") - seq * d  # the position embedding is a lookup (the tied head is a matmul)
    assert counted == pytest.approx((6 * n + 12 * n_layer * seq * d) * seq, rel=0.02)
    recorded = json.loads((H200 / "results.jsonl").read_text().splitlines()[0])["speed"]["flops_per_step"]
    assert counted * 8 == pytest.approx(recorded, rel=0.05)  # the CUDA trial counts flash's backward recompute
    assert gpu.flops_per_sample("gpt", "gpt2-124m-b32") == counted  # per sample: the batch does not change it


def test_the_h200_figures_are_those_of_the_committed_first_run():
    records = [r for r in reader.read_records(H200 / "results.jsonl") if r.status == "ok"]
    plain = {"baseline", "tf32", "bf16", "bf16+compile"}
    by_key: dict[tuple[str, bool], list[float]] = {}
    for r in records:
        if r.technique_label in plain:
            compiled = any(techniques.get(t["name"]).phase == Phase.COMPILE for t in r.techniques)
            by_key.setdefault((r.speed.compute_dtype, compiled), []).append(r.speed.achieved_flops)
    assert {k: round(statistics.median(v) / 1e12, 1) for k, v in by_key.items()} == \
        {k: round(v / 1e12, 1) for k, v in gpu.H200_FLOPS.items()}
    fixed = [gpu.fixed_cost_s(r) for r in records]
    assert round(statistics.median(fixed), 1) == gpu.H200_FIXED_S and min(fixed) > 10
    one_off = [r.build.one_off_s for r in records if "compile" in r.technique_label]
    assert round(statistics.median(one_off), 1) == gpu.H200_COMPILE_COLD_S
    assert gpu.VOCAB == records[0].workload["params"]["vocab_size"]


def test_the_pass_steps_are_the_trials():
    assert gpu.PHASE_STEPS == trial.PHASE_STEPS
    assert gpu.MEMORY_STEPS == 1 + trial.CLEAN_RSS_STEPS + 1


def test_the_gpu_sizes_in_docs_are_the_estimates_of_the_code():
    doc = (REPO / "docs" / "gpu.md").read_text()
    for row in gpu.size_rows():
        assert "| " + " | ".join(row) + " |" in doc, row
    assert "| " + " | ".join(gpu.SIZE_COLUMNS) + " |" in doc
    full = gpu.sweep_estimate(build_config("gpu", {"device": "cuda"}), gpu.TARGET)
    assert f"{full.planned_s / 60:.0f} minutes" in doc


def test_the_cli_refuses_the_gpu_preset_on_a_cpu_in_one_line():
    result = run_cli("sweep", "--preset", "gpu", "--device", "cpu", "--out", "/nonexistent/never-written")
    assert result.returncode == 2 and "sized for a datacenter GPU" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ---- where the time went; the output's size ----------------------------------------------------------------------


def test_where_the_time_went_splits_the_first_h200_runs_records():
    records = reader.read_records(H200 / "results.jsonl")
    lines = gpu_check.time_lines(records, {"checks": 3.0, "GPU tests": 40.0})
    assert lines[0] == "gpu_check: checks 3 s, GPU tests 40 s; 43 s in all"
    wall = sum(r.wall_s for r in records)
    assert lines[1] == f"13 trials, {wall:.0f} s of trial wall time (split from the records, which hold no stage times):"
    parts = [float(line.rsplit(": ", 1)[1].split(" s")[0]) for line in lines[2:-1]]
    assert sum(parts) == pytest.approx(wall, abs=len(parts))  # the parts add up to the wall time (rounding)
    assert lines[-1].startswith("by set (trials, wall time): bf16+compile 2, ")


def test_where_the_time_went_sums_recorded_stage_times_where_records_have_them():
    records = reader.read_records(H200 / "results.jsonl")[:2]
    staged = [dataclasses.replace(r, stages={"imports": 2.0, "window": 2.0, "unaccounted": 0.5}) for r in records]
    lines = gpu_check.time_lines(staged)
    assert "stage times recorded by every trial" in lines[0]
    assert lines[1:4] == ["  imports: 4 s (7%)", "  window: 4 s (7%)", "  unaccounted: 1 s (2%)"]
    mixed = gpu_check.time_lines([staged[0], records[1]])
    assert "stage times of 1 trial(s), the others split from their records" in mixed[0]


def test_the_output_is_kept_under_its_limit_and_restored_before_a_resume(tmp_path):
    out = tmp_path / "example-h200"
    (out / "figures").mkdir(parents=True)
    (out / "results.jsonl").write_bytes(b"x" * 1000)
    (out / "figures" / "speedup.png").write_bytes(b"p" * 1000)
    (out / "cache").mkdir()
    (out / "cache" / "corpus.bin").write_bytes(b"c" * 3 * 2**20)
    (out / "trace.json").write_bytes(b"t" * 2**20)
    assert gpu_check.keep_under(out, 8 * 2**20) == []  # under the limit: nothing moves
    lines = gpu_check.keep_under(out, 2 * 2**20)
    assert lines == [f"moved cache (3.0 MiB) to {out}.overflow"]  # the largest first, only as much as needed
    assert sorted(p.name for p in out.iterdir()) == ["figures", "results.jsonl", "trace.json"]
    assert gpu_check.keep_under(out, 1000)[-1].startswith(f"{out} still holds")  # the kept files alone exceed it
    assert (out / "results.jsonl").exists() and (out / "figures").exists()
    assert gpu_check.restore(out) == [f"moved cache back into {out}", f"moved trace.json back into {out}"]
    assert (out / "cache" / "corpus.bin").stat().st_size == 3 * 2**20 and not Path(f"{out}.overflow").exists()


def test_bench_list_gives_each_gpu_size_its_parameters_batch_and_estimated_step_time():
    result = run_cli("list", "--device", "cpu", env={"COLUMNS": "250"})
    assert result.returncode == 0, result.stderr
    assert "GPU sizes" in result.stdout and "estimates, not measured" in result.stdout
    for row in gpu.size_rows():
        assert all(cell in result.stdout for cell in row), row
