"""cudnn_benchmark: refused on a CPU and on a model without convolutions (with the reasons); on a CUDA context the
switch is set for the trial and restored by finalize (the hooks read only the device type: no GPU needed); the
training itself runs on a GPU only."""

import math

import pytest
import torch
from torch import nn

from bench import workloads
from bench.plan.config import TechniqueSet, WorkloadSpec
from bench.plan.planner import incompatibility
from techniques.base import Bottleneck, Context
from techniques.cudnn_benchmark import CudnnBenchmark, apply_cudnn_benchmark, has_convolution
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("cudnn_benchmark", "cnn", runs_on="gpu")

CUDA = torch.device("cuda")  # a device object only: nothing is allocated on it here


@pytest.fixture
def restore_benchmark():
    previous = torch.backends.cudnn.benchmark
    yield
    torch.backends.cudnn.benchmark = previous


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))


def test_a_cpu_trial_is_refused_with_the_reason():
    reason = incompatibility(TechniqueSet.parse("cudnn_benchmark"), WorkloadSpec("cnn"), torch.device("cpu"), 1)
    assert reason == "cudnn_benchmark: needs a CUDA device with cuDNN; this trial runs on cpu"


def test_a_model_without_convolutions_is_refused_from_its_description():
    for workload in ("gpt", "mlp"):
        structure = workloads.get(workload).structure("tiny")
        reason = CudnnBenchmark().check(Context(device=CUDA, workload=workload, structure=structure))
        assert reason is not None and reason.startswith("the model has no convolution (its description: ")
        assert workload not in reason  # the model's description answers, not the workload's name


def test_a_model_without_convolutions_is_refused_when_transformed(restore_benchmark):
    apply_cudnn_benchmark(False)
    with pytest.raises(ValueError, match=r"the model \(Sequential\) has no convolution layer"):
        CudnnBenchmark().transform_model(nn.Sequential(nn.Linear(4, 4)), Context(device=CUDA))
    assert torch.backends.cudnn.benchmark is False
    assert has_convolution(nn.Sequential(nn.ConvTranspose1d(2, 2, 3))) and has_convolution(cnn())


def test_a_cuda_context_switches_it_on_and_finalize_restores(restore_benchmark):
    apply_cudnn_benchmark(False)
    ctx = Context(device=CUDA)
    tech = CudnnBenchmark()
    model = cnn()
    assert tech.transform_model(model, ctx) is model
    assert torch.backends.cudnn.benchmark is True
    tech.finalize(model, ctx)
    assert torch.backends.cudnn.benchmark is False
    tech.finalize(model, ctx)  # a second finalize (nothing held) changes nothing
    assert torch.backends.cudnn.benchmark is False


def test_a_cpu_context_leaves_the_switch_alone(restore_benchmark):
    apply_cudnn_benchmark(False)
    loop, batches, _ = build_loop("cnn", "cudnn_benchmark")  # check() would refuse it; the hooks still run here
    loop.step(next(batches))
    assert torch.backends.cudnn.benchmark is False


def test_it_offers_the_compute_bottleneck_on_cuda_only():
    remedy = CudnnBenchmark.remedy_for(Bottleneck.COMPUTE)
    assert remedy is not None and remedy.device == "cuda" and "convolutional" in remedy.say
    assert CudnnBenchmark.kind.value == "numeric" and CudnnBenchmark.slot is None


@pytest.mark.gpu
def test_it_trains_two_steps_on_a_gpu_with_the_switch_on(restore_benchmark):
    reason = incompatibility(TechniqueSet.parse("cudnn_benchmark"), WorkloadSpec("cnn"), CUDA, 1)
    if reason:
        pytest.skip(reason)
    apply_cudnn_benchmark(False)
    loop, batches, _ = build_loop("cnn", "cudnn_benchmark", device=CUDA)
    assert torch.backends.cudnn.benchmark is True
    assert all(math.isfinite(float(loop.step(next(batches)))) for _ in range(2))
    for tech in loop.techniques:
        tech.finalize(loop.model, loop.ctx)
    assert torch.backends.cudnn.benchmark is False
