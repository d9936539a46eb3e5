"""zero2 on one process: its refusal and the facts it declares (its 2-rank runs: tests/test_distributed.py and the
registry-wide test under torchrun)."""

import torch

from techniques.base import Context
from techniques.zero2 import Zero2
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("zero2", "mlp", runs_on="torchrun")


def test_one_process_is_refused_with_the_fix():
    reason = Zero2().check(Context(device=torch.device("cpu"), world_size=1))
    assert reason == "zero2 needs several processes: run the sweep with --nproc 2 or more"
    assert Zero2().check(Context(device=torch.device("cpu"), world_size=2)) is None


def test_it_declares_a_data_parallel_zero_stage():
    assert Zero2.zero_stage == 2 and Zero2.multi_process and Zero2.splits_batch
