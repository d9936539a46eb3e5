"""offload on one process: it modifies FSDP sharding, so it is refused without zero2 or zero3 (its 2-rank run with
zero3: the registry-wide test under torchrun)."""

import torch

from techniques.base import Context
from techniques.offload import Offload
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("zero3+offload", "mlp", runs_on="torchrun")


def test_it_needs_an_fsdp_sharding_partner():
    cpu = torch.device("cpu")
    reason = Offload().check(Context(device=cpu, world_size=2, technique_names=("offload",)))
    assert reason == "offload modifies FSDP sharding: combine it with zero2 or zero3 (e.g. zero3+offload)"
    for partner in ("zero2", "zero3"):
        assert Offload().check(Context(device=cpu, world_size=2, technique_names=(partner, "offload"))) is None
