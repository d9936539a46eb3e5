"""baseline: the empty technique set; its loop is plain fp32 AdamW."""

import torch

from bench.plan.config import TechniqueSet
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("baseline", "mlp")


def test_baseline_is_the_empty_set_and_trains_in_fp32():
    assert TechniqueSet.parse("baseline") == TechniqueSet(())
    loop, batches, _ = build_loop("mlp", "baseline")
    assert isinstance(loop.optimizer, torch.optim.AdamW)
    first = float(loop.step(next(batches)))
    for _ in range(20):
        last = float(loop.step(next(batches)))
    assert last < first
