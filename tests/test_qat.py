"""QAT: fake quantizers on exactly the targeted Linear layers (the tied head left float and tied), training steps,
the end-of-trial conversion (three metrics, int8 weights smaller than fp32), option errors and the torchao reason."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import bench.plan.planner
import techniques.qat  # noqa: F401  (registers "qat")
from bench.plan.config import ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import incompatibility
from techniques.base import Context
from techniques.qat import QAT, TORCHAO_MISSING, count_fake_quantizers, qat_targets, shared_weights
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("qat", "mlp", requires="torchao")

pytest.importorskip("torchao", reason="optional extra trainbench[torchao] is not installed")

CPU = torch.device("cpu")
WITH_TORCHAO = frozenset({"torchao"})


def _linears(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("workload,expected", [("gpt", 8), ("mlp", 4)])
def test_fake_quantizers_sit_on_the_targeted_linears_and_training_runs(workload, expected):
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    loop, batches, built = build_loop(workload, "qat")
    model = loop.model
    p = built.params
    # gpt: qkv, proj, fc, proj per block (the tied head left out); mlp: one fc per block and the head
    assert expected == (4 * p["n_layer"] if workload == "gpt" else p["depth"] + 1)
    assert count_fake_quantizers(model) == (expected, 2 * expected)  # an activation and a weight quantizer each
    fake = [name for name, m in model.named_modules() if isinstance(m, FakeQuantizedLinear)]
    assert len(fake) == expected
    if workload == "gpt":
        assert type(model.head) is nn.Linear and model.head.weight is model.wte.weight  # float and still tied
        assert set(_linears(model)) - set(fake) == {"head"}
    else:
        assert set(fake) == set(_linears(model))
    before = {name: model.get_submodule(name).weight.detach().clone() for name in fake}
    losses = [float(loop.step(next(batches))) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    assert all(not torch.equal(before[n], model.get_submodule(n).weight) for n in fake)  # straight-through grads


def test_results_evaluate_the_fake_quantized_float_and_int8_models():
    loop, batches, built = build_loop("gpt", "qat")
    for _ in range(3):
        loop.step(next(batches))
    tech = loop.techniques[0]
    model = loop.model
    with torch.no_grad():
        model.eval()
        live = built.evaluate(model)["val_loss"]
        model.train()
    state = {k: v.clone() for k, v in model.state_dict().items()}

    found = tech.results(loop.ctx)

    assert "conversion_error" not in found, found.get("conversion_error")
    assert found["fake_quantized_layers"] == 8 and found["fake_quantizers"] == 16
    assert found["left_float"].keys() == {"head"} and "wte" in found["left_float"]["head"]
    assert found["trained_steps"] == 3 and found["metric"] == "val_loss"
    metrics = found["metrics"]
    assert metrics.keys() == {"fake_quant", "float", "int8"}
    assert all(math.isfinite(m["val_loss"]) for m in metrics.values())
    assert metrics["fake_quant"]["val_loss"] == pytest.approx(live, rel=1e-6)  # what the quality run measures
    # the converted int8 model computes what the fake quantizers simulated; the float model differs from both
    assert metrics["int8"]["val_loss"] == pytest.approx(metrics["fake_quant"]["val_loss"], rel=1e-4)
    assert metrics["float"]["val_loss"] != metrics["fake_quant"]["val_loss"]
    assert found["converted_weight_type"] == "IntxUnpackedToInt8Tensor"
    weights, whole = found["weight_bytes"], found["model_bytes"]
    assert weights["float"] == 4 * sum(model.get_submodule(n).weight.numel() for n in found["layers"])
    assert weights["int8"] < 0.3 * weights["float"]  # 1 byte per weight plus a scale and zero point per row
    assert whole["float"] - whole["int8"] == weights["float"] - weights["int8"]  # only those layers changed
    # the live model is untouched: still fake-quantized, the same weights, still training
    assert count_fake_quantizers(model) == (8, 16) and model.training
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert math.isfinite(float(loop.step(next(batches))))


def test_per_group_leaves_layers_the_group_does_not_divide_float():
    loop, batches, _ = build_loop("mlp", "qat:weight_granularity=per_group:group_size=32")
    loop.step(next(batches))
    found = loop.techniques[0].results(loop.ctx)
    assert found["layers"] == ["blocks.1.fc", "blocks.2.fc", "head"]
    assert found["left_float"].keys() == {"blocks.0.fc"} and "40" in found["left_float"]["blocks.0.fc"]
    assert found["group_size"] == 32 and found["fake_quantized_layers"] == 3
    assert "conversion_error" not in found and found["weight_bytes"]["int8"] < found["weight_bytes"]["float"]
    assert all(math.isfinite(m["accuracy"]) for m in found["metrics"].values())


def test_no_layer_to_quantize_is_an_error():
    model = nn.Sequential(nn.Linear(40, 8))
    targets, left = qat_targets(model, "per_group", 32)
    assert targets == [] and "in_features 40 is not a multiple of group_size 32" in left["0"]
    tech = QAT(QAT.parse_options({"weight_granularity": "per_group"}))
    with pytest.raises(ValueError, match="no nn.Linear layer to fake-quantize"):
        tech.transform_model(model, Context(device=CPU))


def test_shared_weights_finds_the_tie_both_ways():
    loop, _, _ = build_loop("gpt", "baseline")
    assert shared_weights(loop.model) == {"wte": ["head"], "head": ["wte"]}
    assert shared_weights(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))) == {}


def test_a_failed_conversion_is_recorded_not_raised(monkeypatch):
    import torchao.quantization

    def broken(**kwargs):
        raise RuntimeError("no int8 kernel here")

    loop, batches, _ = build_loop("mlp", "qat")
    loop.step(next(batches))
    monkeypatch.setattr(torchao.quantization, "Int8DynamicActivationIntxWeightConfig", broken)
    found = loop.techniques[0].results(loop.ctx)
    assert found["conversion_error"] == "RuntimeError: no int8 kernel here"
    assert found["fake_quantized_layers"] == 4 and "metrics" not in found


@pytest.mark.parametrize("label,match", [
    ("qat:weight_granularity=per_row", "per_channel, per_group"),
    ("qat:weight_granularity=per_group:group_size=0", "group_size must be >= 1"),
    ("qat:group_size=64", "per_group only"),
    ("qat:bits=4", "valid options: group_size, weight_granularity"),
])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_torchao_missing_skips_with_the_install_hint(monkeypatch):
    assert QAT().check(Context(device=CPU)) == TORCHAO_MISSING
    assert TORCHAO_MISSING == "needs torchao (pip install 'trainbench[torchao]')"
    assert QAT().check(Context(device=CPU, available_packages=WITH_TORCHAO)) is None
    assert incompatibility(TechniqueSet.parse("qat"), WorkloadSpec("gpt"), CPU, 1) is None
    monkeypatch.setattr(bench.plan.planner, "available_packages", lambda: frozenset())  # as if it were not installed
    assert incompatibility(TechniqueSet.parse("qat"), WorkloadSpec("gpt"), CPU, 1) == f"qat: {TORCHAO_MISSING}"


def test_refused_with_autocast_other_linear_swaps_and_several_processes():
    for other in ("bf16", "fp16"):
        reason = incompatibility(TechniqueSet.parse(f"{other}+qat"), WorkloadSpec("gpt"), CPU, 1)
        assert reason == f"qat cannot be combined with {other}"
    assert {"fp8", "sparse24", "prune"} <= QAT.conflicts  # the other Linear swaps, and prune's masked weights
    ctx = Context(device=CPU, available_packages=WITH_TORCHAO, world_size=2)
    assert "one process" in QAT().check(ctx)
    assert QAT.kind.value == "algorithmic" and QAT.compute_dtype is None and not QAT.own_flops


@pytest.mark.slow
def test_a_real_trial_records_the_conversion(tmp_path):
    from bench.trial import TrialSpec, run
    from tests.conftest import TINY_BUDGET

    spec = TrialSpec(sweep_id="t", trial_id="t", workload="mlp", size="tiny", techniques=["qat"], seed=0,
                     repeat=0, device="cpu", budget=dict(TINY_BUDGET), reference_dir=str(tmp_path))
    rec = run(spec)
    assert rec.status == "ok", rec.reason
    assert rec.kind == "algorithmic"
    found = rec.technique_results["qat"]
    assert "conversion_error" not in found and found["fake_quantized_layers"] == 4
    assert set(found["metrics"]) == {"fake_quant", "float", "int8"}
    assert found["weight_bytes"]["int8"] < found["weight_bytes"]["float"]
