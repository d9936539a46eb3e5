"""TF32: a CUDA-only math mode. On CPU the technique refuses (with the reason) and touches no global state."""

import pytest
import torch

from bench.plan.config import TechniqueSet, WorkloadSpec
from bench.plan.planner import incompatibility
from techniques.base import Context
from techniques.tf32 import TF32, apply_tf32
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("tf32", "gpt")


@pytest.fixture
def restore_tf32():
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def test_check_refuses_cpu_with_the_reason():
    reason = TF32().check(Context(device=torch.device("cpu")))
    assert reason is not None and "tensor cores" in reason and "bit-identical" in reason


def test_cpu_context_leaves_global_switches_alone(restore_tf32):
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())
    loop, batches, _ = build_loop("mlp", "tf32")
    loop.step(next(batches))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision()) == before


def test_cuda_context_switches_on_and_finalize_restores(restore_tf32):
    apply_tf32(False)
    ctx = Context(device=torch.device("cuda"))  # only the device type is read: no GPU needed
    tech = TF32()
    model = torch.nn.Linear(2, 2)
    assert tech.transform_model(model, ctx) is model
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    tech.finalize(model, ctx)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_combines_with_bf16_the_only_objection_on_cpu_is_the_device():
    reason = incompatibility(TechniqueSet.parse("bf16+tf32"), WorkloadSpec("gpt"), torch.device("cpu"), 1)
    assert reason is not None and reason.startswith("tf32:")  # not a slot clash with bf16
    assert TF32.kind.value == "numeric" and TF32.slot is None


@pytest.mark.gpu
def test_tf32_on_gpu_changes_matmuls_and_stays_close(restore_tf32):
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 0):
        pytest.skip("no TF32 tensor cores on this GPU")
    a = torch.randn(1024, 1024, device=device)
    b = torch.randn(1024, 1024, device=device)
    apply_tf32(False)
    full = a @ b
    apply_tf32(True)
    reduced = a @ b
    assert not torch.equal(full, reduced)  # TF32 really ran
    assert torch.allclose(full, reduced, rtol=5e-2, atol=5e-1)
