"""Distillation: the loss against a hand-written formula, the teacher's scaling and cache, and the step it trains."""

import math

import pytest
import torch

import techniques.distill  # noqa: F401  (registers it)
from bench import workloads
from bench.core.structure import ModelStructure
from bench.loop import TrainLoop, build_optimizer, plain_loop
from bench.measure.flops import count_flops
from bench.plan.config import Budget
from techniques._model import n_params
from techniques.base import Context, OptionError, Probe, TrainConfig
from techniques.distill import TEACHER_SEED, Distill, distillation_loss, teacher_params
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("distill:teacher_steps=0.05", "mlp")

CPU = torch.device("cpu")
STRUCT = {name: workloads.get(name).structure("tiny") for name in ("gpt", "cnn", "cnn_aug", "mlp")}


def hand_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> float:
    """Mean over rows of sum_i p_i (log p_i - log q_i), p = softmax(teacher / T), q = softmax(student / T), written
    out with exp and log-sum-exp in float64."""
    s = student.double().reshape(-1, student.shape[-1]) / temperature
    t = teacher.double().reshape(-1, teacher.shape[-1]) / temperature
    log_q = s - torch.log(torch.exp(s).sum(-1, keepdim=True))
    log_p = t - torch.log(torch.exp(t).sum(-1, keepdim=True))
    return float((torch.exp(log_p) * (log_p - log_q)).sum() / s.shape[0])


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 7)], ids=["classifier", "sequence"])
def test_loss_is_the_formula(shape):
    gen = torch.Generator().manual_seed(0)
    s, t = torch.randn(shape, generator=gen) * 3, torch.randn(shape, generator=gen) * 3
    base = torch.tensor(1.7)
    for alpha, temp in [(0.5, 2.0), (0.3, 1.0), (1.0, 4.0)]:
        expected = alpha * temp**2 * hand_kl(s, t, temp) + (1 - alpha) * 1.7
        assert float(distillation_loss(s, t, base, alpha, temp)) == pytest.approx(expected, rel=1e-5)
    assert hand_kl(s, t, 2.0) > 0.01  # a non-trivial KL: the check above can fail
    assert torch.equal(distillation_loss(s, t, base, 0.0, 2.0), base)  # alpha=0: the plain loss, exactly
    assert float(distillation_loss(t, t, base, 1.0, 2.0)) == pytest.approx(0.0, abs=1e-6)  # no gap, no loss
    # the T^2 factor: at alpha=1 the loss is T^2 times the KL of the softened distributions
    assert float(distillation_loss(s, t, base, 1.0, 4.0)) == pytest.approx(16 * hand_kl(s, t, 4.0), rel=1e-5)


def test_t_squared_keeps_the_gradient_size_at_high_temperature():
    """Hinton et al. eq. 3: for zero-mean logits and a high T, d(T^2 KL)/ds -> (s - t) / (C * rows)."""
    gen = torch.Generator().manual_seed(1)
    rows, classes = 4, 10
    s = torch.randn(rows, classes, generator=gen)
    t = torch.randn(rows, classes, generator=gen)
    s, t = s - s.mean(-1, keepdim=True), t - t.mean(-1, keepdim=True)
    grads = {}
    for temp in (250.0, 500.0):
        x = s.clone().requires_grad_(True)
        distillation_loss(x, t, torch.tensor(0.0), 1.0, temp).backward()
        grads[temp] = x.grad
    limit = (s - t) / (classes * rows)
    torch.testing.assert_close(grads[500.0], limit, rtol=1e-2, atol=1e-5)  # the correction is O(|s - t| / T)
    torch.testing.assert_close(grads[250.0], grads[500.0], rtol=2e-2, atol=1e-5)  # unscaled KL: 4x apart


def mlp_probe() -> Probe:
    wl = workloads.get("mlp")
    return Probe(lambda seed=None: wl.build("tiny", 0 if seed is None else seed, CPU), CPU, 0,
                 make_loop=plain_loop)


def tuned(probe: Probe, cache_dir, **options) -> Distill:
    tech = Distill(Distill.Options(**options))
    tech.tune(TrainConfig(batch_size=64), probe, Context(device=CPU, workload="mlp", cache_dir=cache_dir))
    return tech


def test_the_teacher_is_trained_once_and_cached(tmp_path):
    probe = mlp_probe()
    first = tuned(probe, tmp_path, teacher_steps=0.05)
    meta = first.results(Context(device=CPU))
    shared = probe.shared_s
    assert meta["cached"] is False and shared == pytest.approx(meta["teacher_train_s"], abs=1e-3) and shared > 0
    assert meta["teacher_steps_trained"] == math.ceil(0.05 * 150)
    assert meta["teacher_shape"] == {"width": 512, "depth": 3}
    assert meta["teacher_metric"] == "accuracy" and 0 <= meta["teacher_eval"]["accuracy"] <= 1
    assert meta["teacher_n_params"] > meta["student_n_params"] > 0
    assert [p.name for p in tmp_path.iterdir()] == [f"teacher-{meta['key']}.pt"]

    again = tuned(probe, tmp_path, teacher_steps=0.05)
    meta2 = again.results(Context(device=CPU))
    assert meta2["cached"] is True and probe.shared_s == shared  # a cache hit trains nothing
    assert meta2["key"] == meta["key"] and meta2["teacher_train_s"] == meta["teacher_train_s"]
    assert meta2["teacher_eval"] == meta["teacher_eval"]
    a, b = first._teacher.state_dict(), again._teacher.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh = workloads.get("mlp").build_from(teacher_params(STRUCT["mlp"], probe.fresh().params, 2.0, 1), TEACHER_SEED, CPU)
    assert not torch.equal(fresh.model.head.weight, first._teacher.head.weight)  # it was trained

    for changed in ({"teacher_steps": 0.06}, {"width": 1.5}):
        other = tuned(probe, tmp_path, **{"teacher_steps": 0.05, **changed}).results(Context(device=CPU))
        assert other["cached"] is False and other["key"] != meta["key"] and probe.shared_s > shared
        shared = probe.shared_s
    assert len(list(tmp_path.glob("teacher-*.pt"))) == 3


def test_without_a_cache_the_teacher_is_trained_and_not_saved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probe = mlp_probe()
    meta = tuned(probe, None, teacher_steps=0.02).results(Context(device=CPU))
    assert meta["cached"] is False and probe.shared_s > 0 and list(tmp_path.iterdir()) == []


def test_teacher_params_scale_width_and_depth():
    gpt = workloads.get("gpt").size_params("small")  # n_head 4, d_model 256, n_layer 4
    t = teacher_params(STRUCT["gpt"], gpt, 1.3, 2)
    assert (t["d_model"], t["n_layer"], t["n_head"], t["seq_len"]) == (332, 8, 4, 128)  # 332.8 -> 83 heads' worth
    assert {k: v for k, v in t.items() if k not in ("d_model", "n_layer")} == \
        {k: v for k, v in gpt.items() if k not in ("d_model", "n_layer")}
    assert teacher_params(STRUCT["gpt"], workloads.get("gpt").size_params("tiny"), 2.0, 1)["d_model"] == 128
    cnn = teacher_params(STRUCT["cnn"], workloads.get("cnn").size_params("tiny"), 2.0, 2)
    assert (cnn["widths"], cnn["blocks_per_stage"]) == ([16, 32, 64], 2)
    aug = teacher_params(STRUCT["cnn_aug"], workloads.get("cnn_aug").size_params("tiny"), 1.5, 1)
    assert (aug["widths"], aug["blocks_per_stage"], aug["elastic_alpha"]) == \
        ([12, 24, 48], 1, workloads.get("cnn_aug").size_params("tiny")["elastic_alpha"])
    mlp = teacher_params(STRUCT["mlp"], workloads.get("mlp").size_params("tiny"), 2.0, 2)
    assert (mlp["width"], mlp["depth"], mlp["batch_size"]) == (512, 6, 64)
    with pytest.raises(ValueError, match="distill: needs a teacher: return teacher_size from build"):
        teacher_params(ModelStructure(), {}, 2.0, 1)


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt"])
def test_the_teacher_is_larger_than_the_student(name):
    wl = workloads.get(name)
    if (reason := wl.check()) is not None:
        pytest.skip(reason)
    student = wl.build("tiny", 0, CPU)
    teacher = wl.build_from(teacher_params(wl.structure("tiny"), student.params, 2.0, 1), TEACHER_SEED, CPU)
    assert n_params(teacher.model) > 2 * n_params(student.model)  # widths x2: the hidden matmuls x4


def test_steps_train_the_student_on_the_distillation_loss_and_leave_the_teacher_alone():
    loop, batches, built = build_loop("mlp", "distill:teacher_steps=0.02:alpha=0.7:temperature=3",
                                      budget=Budget(train_steps=10))
    tech = next(t for t in loop.techniques if t.name == "distill")
    teacher = tech._teacher
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    in_optimizer = {id(p) for group in loop.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in loop.model.parameters()}
    assert not in_optimizer & {id(p) for p in teacher.parameters()}
    assert not set(teacher.modules()) & set(loop.model.modules())
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = loop.model.head.weight.detach().clone()

    x, y = next(batches)
    with torch.no_grad():
        s = loop.model(x)
        expected = distillation_loss(s, teacher(x), torch.nn.functional.cross_entropy(s, y), 0.7, 3.0)
    assert float(loop.step((x, y))) == pytest.approx(float(expected), rel=1e-6)  # the hook's loss was trained
    for _ in range(3):
        assert torch.isfinite(loop.step(next(batches)))
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not torch.equal(student_before, loop.model.head.weight)


def test_a_step_counts_the_teachers_forward_flops():
    loop, batches, built = build_loop("mlp", "distill:teacher_steps=0.02", budget=Budget(train_steps=10))
    teacher = next(t for t in loop.techniques if t.name == "distill")._teacher
    x, y = next(batches)
    plain = TrainLoop(loop.model, build_optimizer(loop.model, [], loop.ctx, 1e-3), built.loss_fn, [], loop.ctx)
    student_step = plain.count_flops((x, y))
    assert loop.count_flops((x, y)) == student_step + count_flops(lambda: teacher(x)) > student_step
    # the teacher (mlp tiny at 2x width: 40 -> 512 -> 512 -> 512 -> 10) by hand: 2 FLOPs per multiply-add
    assert count_flops(lambda: teacher(x)) == 2 * len(x) * (40 * 512 + 512 * 512 * 2 + 512 * 10)


def test_check_refuses_what_it_cannot_run():
    tech = Distill()
    assert tech.check(Context(device=CPU, workload="mlp")) is None
    assert tech.check(Context(device=CPU, workload="gpt")) is None
    assert tech.check(Context(device=CPU)) is None  # the CLI's device-level listing names no workload
    reason = tech.check(Context(device=CPU, workload="lstm", structure=ModelStructure(source="inferred")))
    assert reason is not None and "teacher_size" in reason and "scaling" in reason and "\n" not in reason
    assert tech.check(Context(device=CPU, structure=workloads.get("hf").structure("llama-tiny"))) is None
    reason = tech.check(Context(device=CPU, workload="mlp", world_size=2))
    assert reason is not None and "one process" in reason
    with pytest.raises(ValueError, match="one process"):
        tech.tune(TrainConfig(batch_size=64), mlp_probe(), Context(device=CPU, workload="mlp", world_size=2))


@pytest.mark.parametrize("raw, match", [
    ({"alpha": "1.5"}, "alpha must be in"), ({"alpha": "-0.1"}, "alpha must be in"),
    ({"temperature": "0"}, "temperature must be"), ({"temperature": "inf"}, "temperature must be"),
    ({"width": "0.5"}, "width must be"), ({"depth": "0"}, "depth must be"), ({"depth": "1.5"}, "wants int"),
    ({"teacher_steps": "0"}, "teacher_steps must be"), ({"teachers": "2"}, "valid options: alpha, depth"),
])
def test_bad_options_are_refused_with_what_is_valid(raw, match):
    with pytest.raises(OptionError, match=match):
        Distill.parse_options(raw)


def test_options_parse_and_plain_construction_validates():
    o = Distill.parse_options({"alpha": "0", "temperature": "4", "width": "1", "depth": "2", "teacher_steps": "0.5"})
    assert (o.alpha, o.temperature, o.width, o.depth, o.teacher_steps) == (0.0, 4.0, 1.0, 2, 0.5)
    with pytest.raises(ValueError, match="depth must be an integer"):
        Distill.Options(depth=2.0)


@pytest.mark.slow
def test_a_trial_with_a_teacher_runs_and_reports_it(tmp_path):
    from bench.trial import TrialSpec, run
    from tests.conftest import TINY_BUDGET

    def spec(trial: str) -> TrialSpec:
        return TrialSpec(sweep_id="t", trial_id=trial, workload="mlp", size="tiny",
                         techniques=["distill:teacher_steps=0.1"], seed=0, repeat=0, device="cpu",
                         budget={**TINY_BUDGET, "memory": False}, reference_dir=str(tmp_path))

    rec = run(spec("a"))
    assert rec.status == "ok", rec.reason
    found = rec.technique_results["distill"]
    assert found["cached"] is False and found["teacher_train_s"] > 0
    assert found["teacher_n_params"] > found["student_n_params"] == rec.build.n_params
    assert rec.kind == "algorithmic"
    assert list(tmp_path.glob("teacher-*.pt"))
    student = workloads.get("mlp").build("tiny", 0, CPU)
    student_step = count_flops(lambda: plain_loop(student, student.lr, CPU).step(next(student.batches(64, 0))))
    assert rec.speed.flops_per_step > student_step  # the teacher's forward is counted on top
    again = run(spec("b"))
    assert again.status == "ok", again.reason
    assert again.technique_results["distill"]["cached"] is True
    assert again.technique_results["distill"]["key"] == found["key"]


def test_the_memory_breakdown_counts_the_teachers_weights():
    """The teacher is not the model: without ``held_parts`` the tracked peak would leave its weights out."""
    from bench.measure.memory import TensorMemoryTracker

    loop, batches, _ = build_loop("mlp", "distill:teacher_steps=0.02", budget=Budget(train_steps=10))
    tech = next(t for t in loop.techniques if t.name == "distill")
    held = tech.held_parts(loop.ctx)
    teacher_bytes = sum(t.numel() * t.element_size() for t in held["teacher"])
    assert teacher_bytes == 4 * n_params(tech._teacher) > 0
    batch = next(batches)
    without = TensorMemoryTracker(loop.model, loop.optimizer)
    with without:
        loop.step(batch)
    with_teacher = TensorMemoryTracker(loop.model, loop.optimizer, held)
    with with_teacher:
        loop.step(batch)
    assert with_teacher.result().peak_bytes >= without.result().peak_bytes + teacher_bytes - 4096  # up to rounding
    assert with_teacher.result().held == {"teacher": teacher_bytes}  # named, with its bytes
    assert without.result().held == {}
