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


@pytest.fixture(scope="session")
def dist_runs(tmp_path_factory) -> dict[str, Path]:
    """The output directory of each ``JOBS`` entry of the test files that run tests/dist_worker.py, as
    ``"FILE/NAME"``: all their jobs in one torchrun launch (tests/torchrun_jobs.py)."""
    import importlib

    from tests.torchrun_jobs import DIST_WORKER_FILES, launch

    jobs = {f"{name}/{key}": job for name in DIST_WORKER_FILES
            for key, job in importlib.import_module(f"tests.{name}").JOBS.items()}
    return launch(jobs, tmp_path_factory.mktemp("dist_worker"))


def runs_of(dist_runs: dict[str, Path], file: str) -> dict[str, Path]:
    """One file's jobs of ``dist_runs``, by the names its JOBS gives them."""
    return {key.split("/", 1)[1]: out for key, out in dist_runs.items() if key.startswith(f"{file}/")}


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's own configure reads the option
def pytest_configure(config: pytest.Config) -> None:
    """The normal run skips the benchmarks (tests/benchmarks/) where pytest-benchmark is installed, as
    ``--benchmark-skip`` would; ``--benchmark-only`` (tox -e bench) still overrides it. Set here rather than in
    pyproject's addopts, where the option would stop pytest on a machine without the plugin."""
    if config.pluginmanager.hasplugin("benchmark"):
        config.option.benchmark_skip = True
    if config.pluginmanager.hasplugin("xdist"):  # pytest -n: groups that share an expensive build (its docstring)
        from tests.xdist_groups import Plugin

        config.pluginmanager.register(Plugin(), "trainbench-xdist-groups")
    pin_xdist_worker()


def pin_xdist_worker() -> None:
    """Under pytest-xdist (``-n``), give each worker its own share of the CPUs and as many torch threads.

    Two workers that each run torch with every core's worth of OpenMP threads oversubscribe the machine, and OpenMP's
    spinning threads then take several times longer than running the tests one after another (measured on 2 cores:
    a 12 s test took 69 s). Pinned, each worker and every process it starts (trials, torchrun ranks, the fork server)
    sees only its own CPUs, as in a user's pinned job: torch's thread count and the harness's contention check read
    that affinity."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return
    mine = set(cpus[int(worker.removeprefix("gw")) % count::count])
    os.sched_setaffinity(0, mine)
    os.environ["OMP_NUM_THREADS"] = str(len(mine))  # torch's default in a child counts cores, not the affinity
    torch.set_num_threads(len(mine))


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
