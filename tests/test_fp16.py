"""fp16 autocast with dynamic loss scaling: the scaler owns backward and the optimizer step."""

import math

import torch

from techniques.base import set_compute_dtype
from techniques.fp16 import FP16
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("fp16", "mlp")


def test_fp16_scales_the_loss_and_steps_through_the_scaler():
    loop, batches, _ = build_loop("mlp", "fp16:init_scale=1024")
    scaler = loop.ctx.state["grad_scaler"]
    before = [p.detach().clone() for p in loop.model.parameters()]
    loss = loop.step(next(batches))
    assert math.isfinite(float(loss))
    assert set_compute_dtype(loop._context_techs) == "float16"
    assert scaler.get_scale() == 1024.0  # finite grads at the first step: no back-off, no growth yet
    assert any(not torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))


def test_fp16_skips_a_step_with_overflowing_gradients():
    loop, batches, _ = build_loop("mlp", "fp16:init_scale=1e38")  # scale so large the grads overflow in fp16
    scaler = loop.ctx.state["grad_scaler"]
    before = [p.detach().clone() for p in loop.model.parameters()]
    loop.step(next(batches))
    assert scaler.get_scale() < 1e38  # backed off
    assert all(torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))


def test_fp16_options_validate():
    assert FP16.parse_options({"growth_interval": "10"}).growth_interval == 10
