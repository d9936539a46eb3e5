"""Benchmarks (pytest-benchmark): skipped by the normal test run (``--benchmark-skip``, set by tests/conftest.py);
``tox -e bench`` runs them with ``--benchmark-only`` and stores JSON under .benchmarks/ (see README).

``TRAINBENCH_BENCH_THREADS=N`` pins torch's intra-op threads (on a shared 2-core machine one thread is far more
stable than two: two OpenMP threads wait on each other whenever another process takes a core).
"""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _bench_threads():
    threads = int(os.environ.get("TRAINBENCH_BENCH_THREADS", "0") or 0)
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    yield
    torch.set_num_threads(previous)
