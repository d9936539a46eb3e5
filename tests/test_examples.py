"""The example models build the same weights for a seed whether or not they are the first build in a process.

The harness seeds, then calls ``build`` in each trial's fresh process and computes the parity reference of every
seed in one process; a draw from the global RNG that happens only once per process (a cached probe) gives the
first build other weights than every later one, and the baseline then fails its own parity (it did: the LSTM's
bf16 probe drew before the fix)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import registers it (a dataclass looks its module up there)
    spec.loader.exec_module(module)  # a fresh module: its per-process caches are empty, as in a new process
    return module


def _weights(module, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)  # what bench.plan.user_models does before build
    return [p.detach().clone() for p in module.build(size="small", seed=seed)["model"].parameters()]


@pytest.mark.parametrize("name", ["lstm_lm", "small_resnet", "nanogpt_chars"])
def test_the_first_build_in_a_process_is_the_same_as_a_later_one(name):
    fresh = _weights(_load(name), seed=1)
    module = _load(name)
    _weights(module, seed=0)  # another seed first, as the reference process does
    later = _weights(module, seed=1)
    assert len(fresh) == len(later)
    assert all(torch.equal(a, b) for a, b in zip(fresh, later, strict=True))
