"""Fused AdamW: the same math as the default AdamW (exact kind), built from the workload's hyperparameters."""

import pytest
import torch

from techniques.base import Context
from techniques.fused_adamw import FusedAdamW, fused_adamw_like, fused_devices
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("fused_adamw", "gpt")


def test_builds_a_fused_adamw_with_the_workloads_hyperparameters():
    loop, _, built = build_loop("gpt", "fused_adamw")
    opt = loop.optimizer
    assert isinstance(opt, torch.optim.AdamW)
    assert all(g["fused"] is True for g in opt.param_groups)
    assert opt.param_groups[0]["lr"] == built.lr
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(loop.model.parameters()))


def test_losses_and_parameters_match_the_default_adamw():
    ref, rb, _ = build_loop("gpt", "baseline")
    fused, fb, _ = build_loop("gpt", "fused_adamw")
    a = torch.stack([ref.step(next(rb)) for _ in range(4)])
    b = torch.stack([fused.step(next(fb)) for _ in range(4)])
    assert torch.allclose(a, b, rtol=1e-5), (a, b)  # parity's exact tolerance is 1e-3
    # Adam divides by sqrt(v): where a gradient is ~0 (the attention key bias) rounding order shows at ~1e-6,
    # against updates of lr=3e-3 per step.
    for p, q in zip(ref.model.parameters(), fused.model.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5)


def test_combines_with_fp16_loss_scaling():
    loop, batches, _ = build_loop("mlp", "fp16+fused_adamw")
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert loop.ctx.state["grad_scaler"].get_scale() > 0


def test_check_says_where_a_fused_kernel_exists():
    assert "cpu" in fused_devices()  # torch >= 2.4 has a CPU kernel
    assert FusedAdamW().check(Context(device=torch.device("cpu"))) is None
    reason = FusedAdamW().check(Context(device=torch.device("meta")))
    assert reason is not None and "not for meta" in reason


def test_only_replaces_adamw():
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(TypeError, match="replaces an AdamW"):
        fused_adamw_like(sgd)


def test_kind_and_slot():
    assert FusedAdamW.kind.value == "exact" and FusedAdamW.slot == "optimizer"
