"""Registry-wide: every registered technique has test settings in its own test file, runs two steps on a tiny
workload, and declares what changes its measurement (the FLOPs it runs, tensors the tracker cannot see)."""

import contextlib
import math

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import FlopCounterMode

import techniques
from bench import workloads
from bench.loop import plain_loop
from bench.measure.flops import count_flops
from bench.measure.memory import TensorMemoryTracker
from techniques import base as techniques_base
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
    from tests.torchrun_jobs import OUT, Job, launch

    s = SETTINGS[name]
    needs(s)
    out = launch({name: Job("dist_worker", (s.label, OUT, s.workload, "2"))}, tmp_path)[name]
    assert (out / "params.pt").exists()


@pytest.mark.parametrize("name", runs_on("cpu"))
def test_technique_runs_two_steps(name):
    s = SETTINGS[name]
    needs(s)
    loop, batches, _ = build_loop(s.workload, s.label)
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses)


def gpu_refusal(s: TechniqueSettings, device: torch.device) -> str | None:
    """Why the set ``s`` cannot run on ``device``, asked as the planner asks: the workload first (its own check,
    its data present: the cnn's Fashion-MNIST is a Debian package a GPU machine may lack), then every technique of
    the set with the context the planner gives them (the set's names: sparse24 and fp8 need the bf16 beside them)."""
    from bench.plan.config import TechniqueSet
    from bench.plan.planner import available_packages

    wl = workloads.get(s.workload)
    reason = wl.check()
    if reason:
        return f"workload {s.workload}: {reason}"
    techs = TechniqueSet.parse(s.label)
    ctx = techniques.Context(device=device, workload=s.workload, has_batchnorm=wl.batchnorm("tiny"),
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


def test_the_gpu_check_asks_the_workload_first_so_missing_data_skips_rather_than_fails(monkeypatch):
    """A GPU machine without Fashion-MNIST: cudnn_benchmark's GPU test (on the cnn) is skipped with the workload's
    reason, never failed when its model is built."""
    cnn = workloads.get("cnn")
    monkeypatch.setattr(type(cnn), "check", lambda self: "Fashion-MNIST not found under /nowhere (install the "
                                                         "Debian package dataset-fashion-mnist)")
    reason = gpu_refusal(SETTINGS["cudnn_benchmark"], torch.device("cuda"))  # a device object: nothing runs
    assert reason.startswith("workload cnn: Fashion-MNIST not found")


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


# ---- the facts that change a measurement are declared --------------------------------------------------------


def undeclared_flops(label: str, workload: str) -> str | None:
    """Whether the set ``label`` trains a step of other FLOPs than the workload's model without a technique of it
    declaring ``own_flops`` (the trial then counts the workload's model: bench.trial.window_flops), or None.

    After one step (a technique may change the model there: pruning at step 0), the next batch is counted on the
    set's loop (``TrainLoop.count_flops``: what the trial counts for an ``own_flops`` set) and on a plain loop of a
    fresh workload model. Both are counted under the math attention backend, so attention is counted as its matmuls
    on either side (torch has no FLOP formula for the CPU flash-attention kernel, so the default backend counts none)."""
    loop, batches, _ = build_loop(workload, label)
    loop.step(next(batches))
    batch = next(batches)
    fresh = workloads.get(workload).build("tiny", 0, CPU)
    with sdpa_kernel(SDPBackend.MATH):
        ours, theirs = loop.count_flops(batch), plain_loop(fresh, fresh.lr, CPU).count_flops(batch)
    if ours == theirs:
        return None
    return (f"a step of {label} runs {ours:,} FLOPs against the workload's model's {theirs:,} on the same batch, but "
            f"none of its techniques declares own_flops = True")


def hidden_tensors(label: str, workload: str) -> str | None:
    """Whether the tensor tracker cannot see the step of ``label`` (what ``hides_tensors`` declares), or None.

    The tracker sees what is dispatched through Python (a ``TorchDispatchMode``); a FLOP counter entered inside it
    sees the same ops. So a step whose FLOPs the counter inside the tracker misses (under half of those counted on
    the eager model the loop evaluates, ``TrainLoop.count_flops``), or in which the tracker sees no activations at
    all, ran where the tracker is blind. torch.compile itself is not caught this way: with a dispatch mode active,
    TorchDynamo runs the model eagerly (torch 2.13: a compiled MLP's tracked step gave the eager breakdown to the byte
    and compiled nothing new), so the tracker measures an eager step instead of the compiled one; compile declares
    hides_tensors for that reason."""
    loop, batches, _ = build_loop(workload, label)
    loop.step(next(batches))
    batch = next(batches)
    counted = loop.count_flops(batch) if loop._fb_owner is None else count_flops(lambda: loop.step(batch))
    with TensorMemoryTracker(loop.model, loop.optimizer) as tracker, FlopCounterMode(display=False) as seen:
        loop.step(batch)
    visible, activations = seen.get_total_flops(), tracker.result().activation_peak_bytes
    if visible * 2 >= counted and activations > 0:
        return None
    return (f"the tensor tracker saw {visible:,} of the {counted:,} FLOPs of a step of {label} and "
            f"{activations:,} bytes of activations, but none of its techniques declares hides_tensors = True")


def declares(name: str, fact: str) -> bool:
    return bool(getattr(techniques.get(name), fact))


def owns_the_step(name: str) -> bool:
    return techniques.get(name).forward_backward is not Technique.forward_backward


# What the two checks cover: the techniques that run on a CPU, train (best-of-n's steps train nothing: the report
# gives them no FLOPs, MFU or memory ratio) and do not declare the fact already. A technique that owns the step
# (forward_backward: the preference methods) is not FLOP-checked: its FLOPs cannot be counted on the loop's model, the
# trial counts a supervised step of its batch's shape and the method reports its own estimate (techniques/_preference.py).
FLOP_CHECKED = [n for n in runs_on("cpu")
                if techniques.get(n).trains and not declares(n, "own_flops") and not owns_the_step(n)]
TENSOR_CHECKED = [n for n in runs_on("cpu") if techniques.get(n).trains and not declares(n, "hides_tensors")]


@pytest.mark.slow  # a build and a few counted steps per technique: about a minute on 2 cores (CI runs -m slow)
@pytest.mark.parametrize("name", FLOP_CHECKED)
def test_a_technique_that_changes_the_flops_declares_own_flops(name):
    s = SETTINGS[name]
    needs(s)
    assert undeclared_flops(s.label, s.workload) is None


@pytest.mark.slow  # as above; the planted techniques below prove both checks in every default run
@pytest.mark.parametrize("name", TENSOR_CHECKED)
def test_a_technique_the_tracker_cannot_see_declares_hides_tensors(name):
    s = SETTINGS[name]
    needs(s)
    assert hidden_tensors(s.label, s.workload) is None


@contextlib.contextmanager
def planted(*classes: type[Technique]):
    """Test-only techniques, registered for the duration of a test and removed after."""
    for cls in classes:
        register(cls)
    try:
        yield
    finally:
        for cls in classes:
            techniques_base._REGISTRY.pop(cls.name, None)


class ExtraLayer(Technique):
    """Adds a Linear layer after the model's head: more FLOPs per step, not declared."""

    name = "planted_extra_layer"
    own_flops = False  # wrong on purpose
    hides_tensors = False
    tune_options = ()

    def transform_model(self, model, ctx):
        return nn.Sequential(model, nn.Linear(10, 10))  # mlp:tiny has 10 classes


class _Unseen(torch.autograd.Function):
    """A module's forward and backward run where no dispatch mode sees them, as a compiled graph runs."""

    @staticmethod
    def forward(ctx, x, module, *params):
        with _disable_current_modes(), torch.enable_grad():
            out = module(x)
        ctx.out, ctx.params = out, params
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        with _disable_current_modes():
            grads = torch.autograd.grad(ctx.out, ctx.params, grad)
        return (None, None, *grads)


class Unseen(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return _Unseen.apply(x, self.inner, *self.inner.parameters())


class HiddenSteps(Technique):
    """Runs the model's forward and backward out of the tracker's sight, evaluates the eager model (as compile
    does), and does not declare it."""

    name = "planted_hidden_steps"
    own_flops = False
    hides_tensors = False  # wrong on purpose
    tune_options = ()

    def transform_model(self, model, ctx):
        return Unseen(model)

    def eval_model(self, model, ctx):
        return model.inner


def test_the_flop_check_flags_a_technique_that_adds_a_layer_without_declaring_it():
    with planted(ExtraLayer):
        said = undeclared_flops("planted_extra_layer", "mlp")
        assert said is not None and "none of its techniques declares own_flops = True" in said
        assert hidden_tensors("planted_extra_layer", "mlp") is None  # more FLOPs, all of them seen


def test_the_tensor_check_flags_a_technique_the_tracker_cannot_see_without_declaring_it():
    with planted(HiddenSteps):
        loop, batches, _ = build_loop("mlp", "planted_hidden_steps")
        assert math.isfinite(float(loop.step(next(batches))))  # it trains
        said = hidden_tensors("planted_hidden_steps", "mlp")
        assert said is not None and said.startswith("the tensor tracker saw 0 of the ")
        assert undeclared_flops("planted_hidden_steps", "mlp") is None  # the same model's FLOPs


def test_register_refuses_a_technique_that_does_not_declare_its_facts():
    class Silent(Technique):
        name = "planted_silent"
        own_flops = False

    with pytest.raises(TypeError) as err:
        register(Silent)
    assert str(err.value).startswith("technique 'planted_silent' (tests.test_registry.")
    assert "must declare hides_tensors, tune_options in its class body" in str(err.value)
    assert "planted_silent" not in techniques.registry()

    class Inherits(ExtraLayer):  # a parent's declaration is not the subclass's
        name = "planted_inherits"

    with pytest.raises(TypeError, match="must declare own_flops, hides_tensors, tune_options"):
        register(Inherits)

    class Wrong(Technique):
        name = "planted_wrong"
        own_flops = "yes"
        hides_tensors = False
        tune_options = ""

    with pytest.raises(TypeError, match="own_flops must be a bool, not 'yes'; tune_options must be a tuple"):
        register(Wrong)


def test_duplicate_names_are_an_error():
    with pytest.raises(ValueError, match="registered twice"):

        @register
        class Another(Technique):
            name = "bf16"
            own_flops = hides_tensors = False
            tune_options = ()


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
