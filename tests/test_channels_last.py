"""channels_last: NHWC weights, activations and inputs (training and evaluation), losses against the baseline's,
and refusals of models without convolutions."""

import pytest
import torch
from torch import nn

from bench import workloads
from bench.plan.config import TechniqueSet, WorkloadSpec
from bench.plan.planner import incompatibility
from techniques.base import Context, Kind
from techniques.channels_last import ChannelsLast, apply_channels_last
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("channels_last", "cnn")

CL = torch.channels_last


def conv_inputs(model: nn.Module) -> list[torch.Tensor]:
    """Records the input of every Conv2d call of ``model`` from now on."""
    seen: list[torch.Tensor] = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    return seen


def test_conv_weights_and_every_conv_input_are_channels_last_and_a_step_runs():
    loop, batches, _ = build_loop("cnn", "channels_last")
    convs = [m for m in loop.model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=CL) for c in convs)
    # the NCHW default strides of a weight with more than one input channel are not channels_last: the check bites
    assert any(not c.weight.is_contiguous() for c in convs)
    seen = conv_inputs(loop.model)
    loss = float(loop.step(next(batches)))
    assert torch.isfinite(torch.tensor(loss))
    assert len(seen) == len(convs)
    assert all(x.is_contiguous(memory_format=CL) for x in seen)  # the model's input and every activation after it
    assert all(c.weight.grad.is_contiguous(memory_format=CL) for c in convs)


def test_evaluation_inputs_are_converted_too():
    # evaluation calls the model directly, not through the training batches: the pre-hook still converts
    loop, _, built = build_loop("cnn", "channels_last")
    seen = conv_inputs(loop.model)
    loop.model.eval()
    with torch.no_grad():
        loop.model(torch.randn(4, 1, 28, 28))
    assert seen and seen[0].stride() == (28 * 28, 1, 28, 1)  # channels_last strides of an N x 1 x 28 x 28 input
    assert all(x.is_contiguous(memory_format=CL) for x in seen)


def test_losses_match_the_baseline_within_the_documented_tolerance():
    losses = {}
    for label in ("baseline", "channels_last"):
        loop, batches, _ = build_loop("cnn", label)
        losses[label] = torch.stack([loop.step(next(batches)) for _ in range(4)])
    # NUMERIC on this CPU: the NHWC convolution and BatchNorm kernels sum in another order (logits differ by ~3e-6
    # at the first forward); measured 2.2e-5 relative at step 4, so 1e-3 leaves room for other thread counts
    assert torch.allclose(losses["channels_last"], losses["baseline"], rtol=1e-3, atol=0)


def test_models_without_conv2d_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="no nn.Conv2d"):
        apply_channels_last(nn.Sequential(nn.Linear(4, 4)))
    for workload in ("mlp", "gpt", "hf"):  # their descriptions say: no Conv2d
        structure = workloads.get(workload).structure("tiny")
        reason = ChannelsLast().check(Context(device=torch.device("cpu"), workload=workload, structure=structure))
        assert reason is not None and "without convolutions" in reason
    structure = workloads.get("cnn").structure("tiny")
    assert ChannelsLast().check(Context(device=torch.device("cpu"), workload="cnn", structure=structure)) is None
    assert ChannelsLast().check(Context(device=torch.device("cpu"), workload="my_user_model")) is None


def test_the_plan_skips_it_on_the_gpt_with_the_reason_and_plans_it_on_the_cnn():
    reason = incompatibility(TechniqueSet.parse("channels_last"), WorkloadSpec("gpt"), torch.device("cpu"), 1)
    assert reason is not None and reason.startswith("channels_last:") and "convolutions" in reason
    assert incompatibility(TechniqueSet.parse("channels_last"), WorkloadSpec("cnn"), torch.device("cpu"), 1) is None


def test_non_image_inputs_pass_untouched():
    model = apply_channels_last(nn.Sequential(nn.Conv2d(3, 4, 3)))
    seen = conv_inputs(model)
    x = torch.randn(2, 3, 8, 8)
    model(x)
    assert seen[0].is_contiguous(memory_format=CL)
    hook = next(iter(model._forward_pre_hooks.values()))
    tokens = torch.arange(6).view(2, 3)
    assert hook(model, (tokens, 5)) == (tokens, 5) and hook(model, (tokens,))[0] is tokens


def test_is_numeric_not_exact():
    assert ChannelsLast.kind is Kind.NUMERIC  # measured: not bit-identical to the baseline on this CPU
