"""Gradient accumulation: 4 x 16 gives the gradients of 1 x 64 (allclose) on models without BatchNorm."""

import pytest
import torch

from bench import workloads
from bench.loop import TrainLoop
from techniques.base import Context, TrainConfig
from techniques.grad_accum import GradAccum
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("grad_accum:steps=2", "gpt")


def grads_after_one_step(workload: str, micro_batches: int, batch_size: int = 64):
    built = workloads.get(workload).build("tiny", 0, torch.device("cpu"))
    # SGD with lr=0 leaves parameters unchanged, so the gradients of one step are all that differ.
    opt = torch.optim.SGD(built.model.parameters(), lr=0.0)
    ctx = Context(device=torch.device("cpu"))
    loop = TrainLoop(built.model, opt, built.loss_fn, [], ctx, micro_batches=micro_batches)
    batch = next(built.batches(batch_size, 0))
    loss = loop.step(batch)
    return loss, {n: p.grad.clone() for n, p in built.model.named_parameters()}


@pytest.mark.parametrize("workload", ["mlp", "gpt"])
def test_four_micro_batches_of_16_equal_one_batch_of_64(workload):
    loss1, g1 = grads_after_one_step(workload, 1)
    loss4, g4 = grads_after_one_step(workload, 4)
    assert torch.allclose(loss1, loss4, rtol=1e-5, atol=1e-6)
    for name in g1:
        assert torch.allclose(g1[name], g4[name], rtol=1e-4, atol=1e-6), name


def test_batchnorm_makes_accumulation_inexact():
    # Per-micro-batch BatchNorm statistics: the report must say this, and this test pins the effect down.
    _, g1 = grads_after_one_step("cnn", 1)
    _, g4 = grads_after_one_step("cnn", 4)
    assert any(not torch.allclose(g1[n], g4[n], rtol=1e-4, atol=1e-6) for n in g1)


def test_configure_multiplies_micro_batches_and_checks_divisibility():
    cfg = GradAccum(GradAccum.Options(steps=4)).configure(TrainConfig(batch_size=64))
    assert cfg.micro_batches == 4
    with pytest.raises(ValueError, match="not divisible"):
        GradAccum(GradAccum.Options(steps=5)).configure(TrainConfig(batch_size=64))
