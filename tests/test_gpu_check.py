"""scripts/gpu_check.sh and the gpu preset, as far as a CPU can check them: the fail-fast exit, the plan on a CUDA
device, the H200 figures the estimates rest on (derived again from the committed first H200 run), the time-budget
arithmetic, where the time went and the output's size. What needs a GPU: ``bash scripts/gpu_check.sh`` itself."""

from __future__ import annotations

import dataclasses
import json
import os
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
from bench.plan.config import GPU_CHECK, TechniqueSet, build_config
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
  "-m bench sweep"*) echo "$*" > "$STUB_LOG"; cp "$5" "$STUB_LOG.toml"
                     out="${@: -1}"; [ "$out" = --resume ] && out="${@: -2:1}"
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
    assert args.startswith("-m bench sweep --config ") and "--device cuda --decide-within 0 --out " in args
    cfg = build_config(None, {"device": "cuda"}, tmp_path / "sweep-args.toml")  # the sweep the script asked for
    assert cfg.to_toml() == gpu.check_config().to_toml()
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
    assert "-m bench.dev.gpu_plan --left-s" in text and '--config "$CHECK_CONFIG"' in text
    assert "pytest -q -m gpu" in text and "gpu_check keep" in text and "gpu_check times" in text
    assert "gpu_check cut" in text and "gpu_check resumed" in text


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
    assert cfg.order == "priority"
    assert cfg.budget == build_config("gpu", {"device": "cuda"}).budget  # the preset's window


# ---- the arithmetic ----------------------------------------------------------------------------------------------


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
    eager = [r.build.one_off_s for r in records if "compile" not in r.technique_label]
    assert round(statistics.median(eager), 2) == gpu.H200_EAGER_ONE_OFF_S
    assert gpu.VOCAB == records[0].workload["params"]["vocab_size"]
    base = [r.speed.step_time_s.median for r in records if r.technique_label == "baseline"]
    assert round(statistics.median(base), 4) == gpu.H200_FP32_STEP_B8_S
    refs = sorted(json.loads(p.read_text())["seconds"] for p in (H200 / "references").glob("*.json"))
    assert all(json.loads(p.read_text())["key"].endswith(f"-k{gpu.H200_REFERENCE_STEPS}")
               for p in (H200 / "references").glob("*.json"))
    assert round(statistics.median(refs), 1) == gpu.H200_REFERENCE_KEY_S  # 2.69, 2.76 and 12.27 s
    assert round(refs[-1] - statistics.median(refs), 1) == gpu.H200_REFERENCE_FIRST_S  # seed 0: the first use
    assert f"in {gpu.H200_TESTS_S}" in (H200 / "pytest-m-gpu.txt").read_text().splitlines()[-1]


def test_the_pass_steps_are_the_trials():
    assert gpu.PHASE_STEPS == trial.PHASE_STEPS
    assert gpu.MEMORY_STEPS == 1 + trial.CLEAN_RSS_STEPS + 1


def test_the_gpu_sizes_in_docs_are_the_estimates_of_the_code():
    doc = (REPO / "docs" / "gpu.md").read_text()
    for row in gpu.size_rows():
        assert "| " + " | ".join(row) + " |" in doc, row
    assert "| " + " | ".join(gpu.SIZE_COLUMNS) + " |" in doc
    planned, sequential = gpu.preset_s(gpu.H200)
    assert f"about {planned / 60:.0f} minutes" in doc and f"{(planned + sequential) / 60:.0f} minutes" in doc


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


# ---- the interpreter, the wheels, the arguments ------------------------------------------------------------------


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for args, words in ((["--fast"], "unknown argument '--fast' (valid: --rehearse, --wheels DIR, --checks-only"),
                        (["--wheels", str(tmp_path / "none")], "no such directory (bash scripts/gpu_wheels.sh")):
        result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
        assert words in result.stderr


def _script_copy(tmp_path: Path) -> Path:
    """The script alone in a checkout of its own (no .venv beside it), as on a lent machine's copied tree."""
    (tmp_path / "tree" / "scripts").mkdir(parents=True)
    copy = tmp_path / "tree" / "scripts" / "gpu_check.sh"
    shutil.copy(SCRIPT, copy)
    return copy


def test_without_a_venv_the_script_takes_the_first_python_on_path_that_imports_torch(tmp_path):
    bin_dir, torch_dir = tmp_path / "bin", tmp_path / "with-torch"
    bin_dir.mkdir()
    torch_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 1\n")  # an interpreter without torch comes first
    (bin_dir / "python3").chmod(0o755)
    (torch_dir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # this venv's, by another path
    (torch_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{bin_dir}:{torch_dir}:/usr/bin:/bin"
    result = subprocess.run(["bash", str(_script_copy(tmp_path)), "--rehearse", "--checks-only"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert f"gpu_check: interpreter {torch_dir / 'python'} (" in result.stdout, result.stdout + result.stderr
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))  # what the script needs before it looks
    env["PATH"] = str(bin_dir)  # no python3 nor python there that imports torch
    result = subprocess.run(["/bin/bash", str(_script_copy(tmp_path / "again")), "--checks-only"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and result.stderr.startswith("gpu_check: no Python that imports torch")
    assert result.stderr.count("\n") == 1 and "(nothing was run)" in result.stderr


def _wheel(directory: Path, dist: str, version: str) -> Path:
    """A minimal pure-Python wheel: one module and its dist-info."""
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {f"{dist}.py": "WHO = 'a wheel gpu_check.sh installed'\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_wheels_it_lacks_are_installed_without_a_network_into_a_site_of_its_own(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    _wheel(wheels, "gpu_check_probe", "1.0")
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SITE": str(site), "PIP_NO_INDEX": "1"}
    args = ["bash", str(SCRIPT), "--rehearse", "--checks-only", "--wheels", str(wheels)]
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"gpu_check: installed from {wheels} into {site}: gpu_check_probe-1.0" in first.stdout
    assert (site / "gpu_check_probe.py").exists()
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert f"every wheel of {wheels} is installed already" in again.stdout, again.stdout + again.stderr
