"""Registry-wide: every registered technique has test settings in its own test file and runs two steps on a tiny
workload."""

import math

import pytest
import torch

import techniques
from bench import workloads
from techniques.base import Kind, Phase, Technique, register
from tests.helpers import TechniqueSettings, build_loop, settings_of

CPU = torch.device("cpu")
NAMES = sorted(techniques.registry())
FOUND = {name: settings_of(name) for name in NAMES}  # each technique's SETTINGS from tests/test_<name>.py
SETTINGS = {name: s for name, s in FOUND.items() if isinstance(s, TechniqueSettings)}


def runs_on(where: str) -> list[str]:
    return sorted(name for name, s in SETTINGS.items() if s.runs_on == where)


def needs(s: TechniqueSettings) -> None:
    if s.requires:
        pytest.importorskip(s.requires, reason=f"optional package {s.requires} is not installed")


def test_every_technique_has_test_settings_in_its_own_test_file():
    missing = [s for s in FOUND.values() if isinstance(s, str)]
    assert missing == [], "techniques without test settings:\n" + "\n".join(missing)


def test_a_technique_without_a_test_file_or_settings_is_told_what_to_add(tmp_path, monkeypatch):
    import tests

    monkeypatch.setattr(tests, "__path__", [*tests.__path__, str(tmp_path)])  # test files of planted techniques
    said = settings_of("planted_nothing")
    assert isinstance(said, str) and "no test file: add tests/test_planted_nothing.py" in said
    assert 'SETTINGS = TechniqueSettings("planted_nothing", "mlp")' in said
    (tmp_path / "test_planted_bare.py").write_text("def test_it():\n    pass\n")
    said = settings_of("planted_bare")
    assert isinstance(said, str) and said.startswith("planted_bare: tests/test_planted_bare.py declares no settings: add")
    # a test file that skips itself at import (an optional package) still gives the settings declared above the skip
    (tmp_path / "test_planted_extra.py").write_text(
        "import pytest\n\nfrom tests.helpers import TechniqueSettings\n\n"
        "SETTINGS = TechniqueSettings('planted_extra', 'mlp', requires='no_such_package')\n\n"
        "pytest.importorskip('no_such_package')\n")
    assert settings_of("planted_extra") == TechniqueSettings("planted_extra", "mlp", requires="no_such_package")
    with pytest.raises(ValueError, match="runs_on must be cpu, gpu or torchrun"):
        TechniqueSettings("bf16", "gpt", runs_on="tpu")  # type: ignore[arg-type]


@pytest.mark.slow  # one torchrun launch per technique (CI runs -m slow); the settings test above stays
@pytest.mark.distributed
@pytest.mark.parametrize("name", runs_on("torchrun"))
def test_distributed_technique_runs_two_steps_on_two_ranks(name, tmp_path):
    from tests.test_distributed import torchrun

    s = SETTINGS[name]
    needs(s)
    torchrun(s.label, str(tmp_path), s.workload, "2")
    assert (tmp_path / "params.pt").exists()


@pytest.mark.parametrize("name", runs_on("cpu"))
def test_technique_runs_two_steps(name):
    s = SETTINGS[name]
    needs(s)
    loop, batches, _ = build_loop(s.workload, s.label)
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses)


def gpu_refusal(s: TechniqueSettings, device: torch.device) -> str | None:
    """Why a technique of the set ``s`` cannot run on ``device``, asked of every technique of the set with the
    context the planner gives them (the set's names: sparse24 and fp8 need the bf16 beside them)."""
    from bench.plan.config import TechniqueSet
    from bench.plan.planner import available_packages

    wl = workloads.get(s.workload)
    blocks, has_batchnorm = wl.traits("tiny")
    techs = TechniqueSet.parse(s.label)
    ctx = techniques.Context(device=device, workload=s.workload, blocks=blocks, has_batchnorm=has_batchnorm,
                             has_preferences=wl.has_preferences, structure=wl.structure("tiny"),
                             available_packages=available_packages(), technique_names=techs.names)
    for spec in techs.specs:
        reason = spec.resolve().check(ctx)
        if reason:
            return f"{spec.name}: {reason}"
    return None


def test_the_gpu_check_asks_every_technique_of_the_set_with_its_names():
    s = TechniqueSettings("bf16+fp8", "gpt", runs_on="gpu")
    assert gpu_refusal(s, CPU).startswith("fp8: ")  # bf16 runs on a CPU; fp8 refuses it
    assert gpu_refusal(TechniqueSettings("zero3+offload", "mlp"), CPU).startswith("zero3: zero3 needs several")


@pytest.mark.gpu
@pytest.mark.parametrize("name", runs_on("gpu"))
def test_gpu_technique_runs_two_steps_or_says_why_not(name):
    s = SETTINGS[name]
    device = torch.device("cuda")
    reason = gpu_refusal(s, device)
    if reason:  # an older GPU, or an optional package missing
        pytest.skip(reason)
    loop, batches, _ = build_loop(s.workload, s.label, device=device)
    assert all(math.isfinite(float(loop.step(next(batches)))) for _ in range(2))


@pytest.mark.parametrize("name", NAMES)
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
