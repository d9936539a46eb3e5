"""Registry-wide: every registered technique has test settings and runs two steps on a tiny workload."""

import math

import pytest
import torch

import techniques
from techniques.base import Kind, Phase, Technique, register
from tests.helpers import build_loop
from tests.technique_settings import DISTRIBUTED_SETTINGS, GPU_SETTINGS, TECHNIQUE_SETTINGS


def test_every_technique_has_test_settings():
    assert set(techniques.registry()) == set(TECHNIQUE_SETTINGS) | set(DISTRIBUTED_SETTINGS) | set(GPU_SETTINGS)
    assert not set(TECHNIQUE_SETTINGS) & set(DISTRIBUTED_SETTINGS)
    assert not (set(TECHNIQUE_SETTINGS) | set(DISTRIBUTED_SETTINGS)) & set(GPU_SETTINGS)


@pytest.mark.slow  # one torchrun launch per technique (CI runs -m slow); the settings test above stays
@pytest.mark.distributed
@pytest.mark.parametrize("name", sorted(DISTRIBUTED_SETTINGS))
def test_distributed_technique_runs_two_steps_on_two_ranks(name, tmp_path):
    if name == "deepspeed":
        pytest.importorskip("deepspeed", reason="optional extra trainbench[deepspeed] is not installed")
    from tests.test_distributed import torchrun

    label, workload = DISTRIBUTED_SETTINGS[name]
    torchrun(label, str(tmp_path), workload, "2")
    assert (tmp_path / "params.pt").exists()


@pytest.mark.parametrize("name", sorted(TECHNIQUE_SETTINGS))
def test_technique_runs_two_steps(name):
    if name == "qat":
        pytest.importorskip("torchao", reason="optional extra trainbench[torchao] is not installed")
    label, workload = TECHNIQUE_SETTINGS[name]
    loop, batches, _ = build_loop(workload, label)
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_SETTINGS))
def test_gpu_technique_runs_two_steps_or_says_why_not(name):
    from bench.plan.planner import available_packages

    label, workload = GPU_SETTINGS[name]
    device = torch.device("cuda")
    reason = techniques.get(name)().check(techniques.Context(device=device, workload=workload,
                                                            available_packages=available_packages()))
    if reason:  # an older GPU, or torchao missing
        pytest.skip(reason)
    loop, batches, _ = build_loop(workload, label, device=device)
    assert all(math.isfinite(float(loop.step(next(batches)))) for _ in range(2))


@pytest.mark.parametrize("name", sorted(set(TECHNIQUE_SETTINGS) | set(DISTRIBUTED_SETTINGS) | set(GPU_SETTINGS)))
def test_technique_declares_its_card(name):
    cls = techniques.get(name)
    assert cls.summary and isinstance(cls.kind, Kind) and isinstance(cls.phase, Phase)
    assert cls.__module__ != "techniques.base"
    assert len((__import__(cls.__module__, fromlist=["_"]).__doc__ or "").strip()) > 80, "method card missing"


def test_duplicate_names_are_an_error():
    with pytest.raises(ValueError, match="registered twice"):

        @register
        class Another(Technique):
            name = "bf16"


def test_hooks_default_to_no_ops():
    tech = Technique()
    model = torch.nn.Linear(2, 2)
    ctx = techniques.Context(device=torch.device("cpu"))
    assert tech.transform_model(model, ctx) is model
    assert tech.backward(torch.tensor(1.0), ctx) is False
    assert tech.check(ctx) is None


# ---- each technique carries its own reading -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(techniques.registry()))
def test_a_technique_that_reports_results_reads_them_itself(name):
    """results() without summarize() would show only the result keys in the report: a new technique writes both."""
    cls = techniques.get(name)
    if cls.results is Technique.results:
        return
    assert cls.summarize.__func__ is not Technique.summarize.__func__, f"{name} reports results but has no summarize()"
    assert (cls.summarize.__doc__ or "").strip(), f"{name}.summarize has no docstring (docs/commands.md lists it)"


@pytest.mark.parametrize("name", sorted(techniques.registry()))
def test_a_techniques_advice_is_well_formed(name):
    from techniques.base import Bottleneck, Remedy, ResultCurve

    cls = techniques.get(name)
    assert all(isinstance(r, Remedy) and isinstance(r.bottleneck, Bottleneck) for r in cls.remedies)
    assert all(r.compute_dtype for r in [cls] if any(x.if_dtype_faster for x in cls.remedies))
    for bottleneck, line in cls.explains.items():
        assert isinstance(bottleneck, Bottleneck) and "{share}" in line
        assert line.format(share=42).count("42%") == 1
    assert cls.result_curve is None or isinstance(cls.result_curve, ResultCurve)


def test_the_base_summary_shows_the_result_keys_not_nothing():
    text = Technique.summarize([{"chosen": 1, "curve": [1, 2]}, {"chosen": 2, "extra": None}])
    assert text.startswith("2 result(s) with keys chosen, curve, extra (no summary of its own")
