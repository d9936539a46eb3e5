"""zero3 on one process: its refusal and the facts it declares (its 2-rank runs: tests/test_distributed.py and the
registry-wide test under torchrun)."""

import torch

from techniques.base import Context
from techniques.zero3 import Zero3
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("zero3", "mlp", runs_on="torchrun")


def test_one_process_is_refused_with_the_fix():
    reason = Zero3().check(Context(device=torch.device("cpu"), world_size=1))
    assert reason == "zero3 needs several processes: run the sweep with --nproc 2 or more"
    assert Zero3().check(Context(device=torch.device("cpu"), world_size=2)) is None


def test_it_declares_a_data_parallel_zero_stage():
    assert Zero3.zero_stage == 3 and Zero3.multi_process and Zero3.splits_batch
