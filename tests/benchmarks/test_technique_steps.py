"""One training step per registered technique on each tiny workload (pytest-benchmark, grouped by workload).

Each group's ``baseline`` row is the reference: the ratio of medians is the in-process speedup of the technique's
step (no process isolation, no statistics over seeds: ``bench sweep`` is the measurement of record; this is the
quick regression signal for the step functions themselves). Techniques that refuse this device (``check``) are
skipped with their reason.
"""

from __future__ import annotations

import pytest
import torch

import techniques
from bench import workloads
from bench.plan.config import TechniqueSet
from techniques.base import Context
from tests.helpers import TechniqueSettings, build_loop, settings_of

WORKLOADS = ("mlp", "gpt", "cnn")
WARMUP = 3  # compile pays its compilation here, outside the timed rounds
# each technique's settings from its own test file (tests/test_<name>.py), those that run in one CPU process
SETTINGS = {name: s for name in sorted(techniques.registry())
            if isinstance(s := settings_of(name), TechniqueSettings) and s.runs_on == "cpu"}


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_technique_step(benchmark, name, workload):
    wl = workloads.get(workload)
    if reason := wl.check():
        pytest.skip(f"{workload}: {reason}")
    label = SETTINGS[name].label
    if SETTINGS[name].requires:
        pytest.importorskip(SETTINGS[name].requires)
    ctx = Context(device=torch.device("cpu"), workload=workload, structure=wl.structure("tiny"),
                  has_batchnorm=wl.has_batchnorm)
    for spec in TechniqueSet.parse(label).specs:
        if reason := techniques.get(spec.name)().check(ctx):
            pytest.skip(f"{name}: {reason}")
    loop, batches, _ = build_loop(workload, label)
    batch = next(batches)
    for _ in range(WARMUP):
        loop.step(batch)
    benchmark.group = f"step {workload}:tiny"
    benchmark.extra_info.update(workload=f"{workload}:tiny", techniques=label, threads=torch.get_num_threads())
    benchmark(loop.step, batch)
