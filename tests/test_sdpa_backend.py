"""sdpa_backend: the forced kernel is the one that runs (seen by torch.profiler), losses stay close to the
baseline's, and check() refuses kernels this device lacks and workloads without attention."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from bench import workloads
from bench.plan.config import ConfigError, TechniqueSet, WorkloadSpec
from bench.plan.planner import incompatibility
from techniques.base import Context, Kind
from techniques.sdpa_backend import SDPABackend, backend_problem
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("sdpa_backend:backend=math", "gpt")

CPU = torch.device("cpu")
# the ATen op each backend dispatches to on CPU (the names torch.profiler records)
CPU_OPS = {"math": "aten::_scaled_dot_product_attention_math",
           "flash": "aten::_scaled_dot_product_flash_attention_for_cpu"}


def attention_ops(label: str) -> set[str]:
    """The SDPA ops one training step of gpt:tiny under ``label`` runs."""
    loop, batches, _ = build_loop("gpt", label)
    batch = next(batches)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.step(batch)
    return {e.key for e in prof.key_averages() if "scaled_dot_product" in e.key}


@pytest.mark.parametrize("backend", sorted(CPU_OPS))
def test_the_forced_kernel_is_the_one_that_runs(backend):
    ops = attention_ops(f"sdpa_backend:backend={backend}")
    assert CPU_OPS[backend] in ops
    other = next(b for b in CPU_OPS if b != backend)
    assert CPU_OPS[other] not in ops


def test_the_baseline_picks_flash_on_this_cpu():
    # what the card says: without the technique torch's CPU dispatcher already chooses the flash kernel here
    ops = attention_ops("baseline")
    assert CPU_OPS["flash"] in ops and CPU_OPS["math"] not in ops


def test_the_context_allows_only_the_chosen_backend():
    tech = SDPABackend(SDPABackend.parse_options({"backend": "math"}))
    with tech.forward_context(Context(device=CPU)):
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # restored on exit


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_losses_stay_close_to_the_baseline(backend):
    losses = {}
    for label in ("baseline", f"sdpa_backend:backend={backend}"):
        loop, batches, _ = build_loop("gpt", label)
        losses[label] = torch.stack([loop.step(next(batches)) for _ in range(4)])
    # flash is the kernel the baseline picks on this CPU (bit-identical); math measured 7e-7 (2e-7 relative) over
    # 8 steps: the kernels sum in another order
    assert torch.allclose(losses[f"sdpa_backend:backend={backend}"], losses["baseline"], rtol=1e-5, atol=0)


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_check_refuses_cuda_only_kernels_on_cpu_with_the_reason(backend):
    tech = SDPABackend(SDPABackend.parse_options({"backend": backend}))
    reason = tech.check(Context(device=CPU, workload="gpt"))
    assert reason is not None and "CUDA" in reason and "backend=math or backend=flash" in reason
    # the static refusal agrees with what torch does: the probe finds no kernel
    assert backend_problem(backend, "cpu") is not None


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_check_accepts_the_cpu_kernels_on_attention_workloads(backend):
    tech = SDPABackend(SDPABackend.parse_options({"backend": backend}))
    assert tech.check(Context(device=CPU, workload="gpt")) is None
    assert tech.check(Context(device=CPU, workload="hf")) is None


def test_check_and_plan_refuse_workloads_without_attention():
    for workload in ("mlp", "cnn"):  # their descriptions say: no attention
        structure = workloads.get(workload).structure("tiny")
        reason = SDPABackend().check(Context(device=CPU, workload=workload, structure=structure))
        assert reason is not None and "scaled_dot_product_attention" in reason
    reason = incompatibility(TechniqueSet.parse("sdpa_backend"), WorkloadSpec("mlp"), CPU, 1)
    assert reason is not None and reason.startswith("sdpa_backend:") and "without attention" in reason
    assert incompatibility(TechniqueSet.parse("sdpa_backend:backend=math"), WorkloadSpec("gpt"), CPU, 1) is None


@pytest.mark.parametrize("label, words", [
    ("sdpa_backend:backend=xformers", ["backend", "math, flash, efficient, cudnn", "xformers"]),
    ("sdpa_backend:kernel=math", ["no option", "valid options: backend"]),
])
def test_option_errors_are_one_line_naming_what_is_valid(label, words):
    with pytest.raises(ConfigError) as info:
        TechniqueSet.parse(label).specs[0].resolve()
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words)


def test_defaults_to_flash_and_is_numeric():
    assert SDPABackend().options.backend == "flash"
    assert SDPABackend.kind is Kind.NUMERIC
