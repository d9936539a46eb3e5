"""One workflow (bench.run.workflow) behind the CLI and the API: the same sweep through ``bench.sweep`` and through
``python -m bench sweep`` writes the same files, with records of the same configuration."""

from __future__ import annotations

import json

import pytest

import bench
from bench.records.results import ResultStore
from tests.conftest import run_cli

# A sweep of one trial in a few seconds: one workload, the baseline, one repeat, a tiny window, no memory passes.
TINY = {"preset": "smoke", "workloads": "mlp", "techniques": "baseline", "repeats": 1, "steps": 4, "eval_points": 1,
        "window_steps": 3, "window_seconds": 0.05, "memory": False}
TINY_FLAGS = ["--preset", "smoke", "--workloads", "mlp", "--techniques", "baseline", "--repeats", "1", "--steps", "4",
              "--eval-points", "1", "--window-steps", "3", "--window-seconds", "0.05", "--no-memory"]
# What a record says about the trial it ran (not what it measured): these must not depend on the entry point.
CONFIGURATION = ("trial_id", "workload", "techniques", "technique_label", "seed", "repeat", "world_size", "device",
                 "kind", "mode", "position", "added_by", "config_hash")


def _files(root):
    """Every file's path under ``root``, caches left out (their files are TorchInductor's and the datasets')."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not {"cache", "references"} & set(p.relative_to(root).parts))


def _configuration(out):
    return [{k: getattr(r, k) for k in CONFIGURATION} for r in ResultStore(out / "results.jsonl").read()]


@pytest.fixture(scope="module")
def api_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "out"
    seen = []
    frame = bench.sweep(**TINY, out=out, on_trial=seen.append)
    return out, frame, seen


@pytest.mark.slow
def test_sweep_returns_the_trials_it_ran(api_sweep):
    out, frame, seen = api_sweep
    assert list(frame.trial_id) == ["mlp:tiny/baseline/seed0/r0"] and list(frame.status) == ["ok"]
    assert frame.attrs["out"] == str(out) and len(seen) == 1 and seen[0].record.status == "ok"
    assert (out / "report.md").is_file() and (out / "summary.md").is_file()
    assert frame.samples_per_s.iloc[0] > 0 and frame.final.notna().iloc[0]  # NaN where missing


@pytest.mark.slow
def test_the_api_and_the_cli_write_the_same_sweep(api_sweep, tmp_path):
    api_out = api_sweep[0]
    cli_out = tmp_path / "cli"
    done = run_cli("sweep", *TINY_FLAGS, "--out", str(cli_out), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _files(api_out) == _files(cli_out)
    assert {"results.jsonl", "env.json", "sweep.toml", "summary.md", "report.md", "report.html"} <= set(_files(cli_out))
    assert _configuration(api_out) == _configuration(cli_out)
    assert (api_out / "sweep.toml").read_text() == (cli_out / "sweep.toml").read_text()
    # Only how it was started differs: the command each recorded in env.json.
    assert json.loads((cli_out / "env.json").read_text())["command"].startswith("python -m bench sweep")
    assert json.loads((api_out / "env.json").read_text())["command"].startswith("bench.sweep(...) from Python")
    assert f"report: {cli_out / 'report.md'}" in done.stdout and "speed vs baseline" in done.stdout


def test_tune_rejects_an_unknown_option_before_running(tmp_path):
    with pytest.raises(bench.ConfigError, match="unknown option.*repeats.*valid:"):
        bench.tune("mlp", repeats=2, out=tmp_path / "out")
    with pytest.raises(bench.ConfigError, match="one model"):
        bench.tune("mlp,gpt", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tune_from_python_writes_what_the_cli_writes(tmp_path):
    out = tmp_path / "t"
    result = bench.tune("mlp:tiny", techniques="fused_adamw", window_steps=4, window_seconds=0.05, max_repeats=3,
                        timeout=180, seed=0, out=out)
    assert result["out"] == str(out) and result["done"] and result["recommended"]
    stored = json.loads((out / "tune.json").read_text())
    assert {k: v for k, v in result.items() if k != "out"} == stored
    for name in ("results.jsonl", "env.json", "sweep.toml", "tune.toml", "tune.md", "summary.md", "report.md",
                 "report.html"):
        assert (out / name).is_file(), name
