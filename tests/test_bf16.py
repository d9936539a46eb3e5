"""bf16 autocast: matmuls run in bfloat16 and the loss stays close to fp32's."""

import torch

from techniques.base import set_compute_dtype
from techniques.bf16 import BF16
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("bf16", "gpt")


def test_bf16_runs_linear_layers_in_bfloat16():
    ctx_dtype = {}
    loop, batches, built = build_loop("mlp", "bf16")
    x, _ = next(batches)
    with loop.forward_context():
        out = loop.model(x)
    ctx_dtype["out"] = out.dtype
    assert ctx_dtype["out"] == torch.bfloat16
    assert set_compute_dtype(loop._context_techs) == "bfloat16"  # the peak MFU is measured against
    assert all(p.dtype == torch.float32 for p in loop.model.parameters())  # master weights stay fp32


def test_bf16_first_loss_is_close_to_fp32():
    ref, rb, _ = build_loop("gpt", "baseline")
    bf, bb, _ = build_loop("gpt", "bf16")
    a, b = float(ref.step(next(rb))), float(bf.step(next(bb)))
    assert a != b  # reduced precision really ran
    assert abs(a - b) / a < 0.05


def test_bf16_kind_is_numeric():
    assert BF16.kind.value == "numeric" and BF16.slot == "precision"
