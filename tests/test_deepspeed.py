"""deepspeed on one process: its refusals (the optional package, one process) and its stage option (its 2-rank run:
the registry-wide test under torchrun, where the package is installed)."""

import torch

from techniques.base import Context
from techniques.deepspeed import DeepSpeed
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("deepspeed", "mlp", runs_on="torchrun", requires="deepspeed")
CPU = torch.device("cpu")


def test_without_the_package_it_says_which_extra_to_install():
    reason = DeepSpeed().check(Context(device=CPU, world_size=2, available_packages=frozenset()))
    assert reason == "the deepspeed package is not installed (pip install 'trainbench[deepspeed]')"


def test_one_process_is_refused_with_the_fix():
    reason = DeepSpeed().check(Context(device=CPU, world_size=1, available_packages=frozenset({"deepspeed"})))
    assert reason == "deepspeed needs several processes: run the sweep with --nproc 2 or more"


def test_the_stage_option_sets_its_zero_stage():
    assert [DeepSpeed(DeepSpeed.parse_options({"stage": s})).zero_stage for s in ("1", "2", "3")] == [1, 2, 3]
