"""``python -m tests.rss_probe OUT.json``: what the trial's memory figures read around a fixed 200 MiB allocation,
in whatever process runs it (a fresh interpreter, or a child of the fork server: tests/test_isolation.py).

It imports what a trial process holds before its first step (the trial module, TorchDynamo), then reads RSS at rest,
allocates and fills a 200 MiB tensor between a reset of the peak and its reading (``PeakRss``, as the timed window
does), and writes the figures and /proc/self/smaps_rollup's split of RSS.
"""

from __future__ import annotations

import json
import sys

import torch
import torch._dynamo  # noqa: F401 (a trial's optimizer imports it: the probe holds what a trial holds)

import bench.trial  # noqa: F401
from bench.measure.memory import PeakRss, trim_heap

MIB = 2**20
ALLOCATION = 200 * MIB


def rollup() -> dict[str, int]:
    """smaps_rollup's fields in bytes (Rss, Pss, Shared_*, Private_*, Anonymous, ...)."""
    out = {}
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def main(path: str) -> None:
    trim_heap()
    rss = PeakRss()
    at_rest = rss.rss_bytes()
    before = rollup()
    rss.reset()
    block = torch.ones(ALLOCATION // 4)  # written: every page resident
    peak = rss.peak_bytes()
    holding = rss.rss_bytes()
    del block
    with open(path, "w") as fh:
        json.dump({"at_rest": at_rest, "peak": peak, "holding": holding, "rollup": before}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
