"""ddp on one process: its refusal and the facts it declares (its 2-rank runs: tests/test_distributed.py and the
registry-wide test under torchrun)."""

import torch

from techniques.base import Context
from techniques.ddp import DDP
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("ddp", "mlp", runs_on="torchrun")


def test_one_process_is_refused_with_the_fix():
    reason = DDP().check(Context(device=torch.device("cpu"), world_size=1))
    assert reason == "ddp needs several processes: run the sweep with --nproc 2 or more"
    assert DDP().check(Context(device=torch.device("cpu"), world_size=2)) is None


def test_it_declares_a_data_parallel_zero_stage():
    assert DDP.zero_stage == 0 and DDP.multi_process and DDP.splits_batch
