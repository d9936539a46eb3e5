"""Shared fixtures: tiny budgets, a CLI runner, and the GPU marker's skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

# A budget small enough for a trial to take a few seconds on 2 cores: a short timed window, a 20-step quality run.
TINY_BUDGET = {
    "warmup_steps": 2,
    "min_steps": 4,
    "min_seconds": 0.05,
    "max_seconds": 5.0,
    "train_steps": 20,
    "eval_points": 4,
    "max_train_seconds": 60.0,
    "parity_steps": 4,
    "memory": True,
    "timeout_s": 120.0,
}


@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory) -> Path:
    """One cache of parity references for the whole test session (each key is computed once, in its own process)."""
    return tmp_path_factory.mktemp("references")


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's own configure reads the option
def pytest_configure(config: pytest.Config) -> None:
    """The normal run skips the benchmarks (tests/benchmarks/) where pytest-benchmark is installed, as
    ``--benchmark-skip`` would; ``--benchmark-only`` (tox -e bench) still overrides it. Set here rather than in
    pyproject's addopts, where the option would stop pytest on a machine without the plugin."""
    if config.pluginmanager.hasplugin("benchmark"):
        config.option.benchmark_skip = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("benchmark"):  # no plugin, no `benchmark` fixture: skipped, not errors
        no_plugin = pytest.mark.skip(reason="needs pytest-benchmark (pip install 'trainbench[test]')")
        for item in items:
            if "benchmark" in getattr(item, "fixturenames", ()):
                item.add_marker(no_plugin)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is visible to torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int = 1, name: str = "NVIDIA H200",
              capability: tuple[int, int] = (9, 0)) -> None:
    """The planner's process sees ``count`` CUDA devices (``bench.measure.cuda_caps``, which the sweep's parent asks
    instead of torch.cuda); nothing runs on them."""
    from bench.measure import cuda_caps

    devices = tuple(cuda_caps.Device(name, capability) for _ in range(count))
    monkeypatch.setattr(cuda_caps, "_cached", cuda_caps.CudaCaps(devices, "faked by a test",
                                                                 None if count else "no device (faked by a test)"))


@pytest.fixture
def one_rank_group():
    """A one-process gloo group in this process (DDP runs its reducer and hooks as with more ranks)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_cli(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m bench ARGS`` in a subprocess, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def cli():
    return run_cli
