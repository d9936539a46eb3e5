"""fp8: the reasons it is skipped (no CUDA 8.9+ device, no torchao), the layer swap checked on CPU through torchao's
float8 emulation, its reading (the note and finding when it runs without compile; its published claim with the
claim's conditions, measured against the same set without fp8), kept so on the first H200 sweep's records
(reports/example-h200-first), and, on a GPU with fp8 tensor cores, real training steps."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bench.plan.planner
import techniques.fp8  # noqa: F401  (registers "fp8")
from bench import workloads
from bench.analyze import analysis, findings
from bench.plan.config import ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import incompatibility
from bench.records.frame import records_frame
from techniques import fp8
from techniques._model import TORCHAO_MISSING
from techniques.base import Context
from techniques.fp8 import FP8, apply_float8, count_float8, float8_targets
from tests.helpers import TechniqueSettings
from tests.records import record
from tests.test_sparse24 import cuda_loop

SETTINGS = TechniqueSettings("bf16+fp8", "gpt", runs_on="gpu", requires="torchao")

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="optional extra trainbench[torchao] is not installed")

CPU = torch.device("cpu")
WITH_TORCHAO = frozenset({"torchao"})
CPU_REASON = "fp8 training needs a CUDA GPU with compute capability 8.9+ (Ada, Hopper); this device is cpu"
H200 = Path(__file__).resolve().parent.parent / "reports" / "example-h200-first"
NO_COMPILE = ("fp8 ran without torch.compile: torchao and torchtitan say float8 training needs compile to fuse its "
              "scaling and casting kernels")


def test_check_on_cpu_names_the_gpu_it_needs():
    assert FP8().check(Context(device=CPU, available_packages=WITH_TORCHAO)) == CPU_REASON
    with pytest.raises(RuntimeError, match="compute capability 8.9"):
        FP8().transform_model(nn.Sequential(nn.Linear(16, 16)), Context(device=CPU))


@needs_torchao
def test_the_planner_names_the_gpu_it_needs():
    assert incompatibility(TechniqueSet.parse("fp8"), WorkloadSpec("gpt"), CPU, 1) == f"fp8: {CPU_REASON}"


def test_torchao_missing_comes_first(monkeypatch):
    assert FP8().check(Context(device=CPU)) == TORCHAO_MISSING
    monkeypatch.setattr(bench.plan.planner, "available_packages", lambda: frozenset())  # as if it were not installed
    assert incompatibility(TechniqueSet.parse("fp8"), WorkloadSpec("gpt"), CPU, 1) == f"fp8: {TORCHAO_MISSING}"


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_swap_takes_the_linears_with_dims_of_16_and_leaves_the_tied_head(recipe):
    """torchao's emulation (fp8 casts around an ordinary matmul) runs the converted GPT on a CPU."""
    built = workloads.get("gpt").build("tiny", 0, CPU)
    model = built.model
    targets, left = apply_float8(model, recipe, emulate=True)
    assert len(targets) == count_float8(model) == 4 * built.params["n_layer"]
    assert left.keys() == {"head"} and "wte" in left["head"]
    assert type(model.head) is nn.Linear and model.head.weight is model.wte.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = built.batches(4, 0)
    for _ in range(2):
        x, y = next(batches)
        loss = built.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert math.isfinite(float(loss.detach()))


@needs_torchao
def test_layers_whose_dims_are_not_multiples_of_16_stay_in_high_precision():
    model = workloads.get("mlp").build("tiny", 0, CPU).model  # 40 -> 256 -> 256 -> 256 -> 10
    targets, left = float8_targets(model, "tensorwise", "dims16")
    assert targets == ["blocks.1.fc", "blocks.2.fc"]
    assert left.keys() == {"blocks.0.fc", "head"} and "multiples of 16" in left["head"]
    big = nn.Sequential(nn.Linear(4096, 2048), nn.Linear(1024, 1024))
    assert float8_targets(big, "tensorwise", "auto")[0] == ["0"]  # torchao's size thresholds (K <= 4096, N <= 1024)
    with pytest.raises(ValueError, match="no nn.Linear layer to convert"):
        apply_float8(workloads.get("gpt").build("tiny", 0, CPU).model, "tensorwise", "auto", emulate=True)


@pytest.mark.parametrize("label,match", [("fp8:recipe=blockwise", "tensorwise, rowwise"),
                                         ("fp8:filter=all", "dims16, auto")])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_declared_traits():
    assert FP8.kind.value == "numeric" and FP8.compute_dtype is None and not FP8.own_flops
    assert {"qat", "sparse24", "prune", "tp"} <= FP8.conflicts and "bf16" not in FP8.conflicts
    (claim,) = FP8.claims
    assert (claim.low, claim.high, claim.needs, claim.params, claim.devices) == (1.10, 1.25, ("bf16", "compile"), 8e9, 8)
    assert claim.over_rest and "FSDP2 + torch.compile" in claim.setting


@needs_torchao
def test_its_results_count_the_layers_torchaos_size_filter_would_skip(monkeypatch):
    monkeypatch.setattr(fp8, "fp8_device_problem", lambda device: None)  # the swap itself runs on a CPU
    tech = FP8()
    tech.transform_model(workloads.get("gpt").build("tiny", 0, CPU).model, Context(device=CPU))
    found = tech.results(Context(device=CPU))
    assert found["float8_layers"] == 8 and found["too_small_to_gain"] == 8  # d_model 64: all far below K, N
    assert "torchao's size filter (filter=auto) would skip 8 of them as too small" in FP8.summarize([found] * 2)
    big = FP8()
    big.transform_model(nn.Sequential(nn.Linear(4096, 2048), nn.Linear(2048, 1024)), Context(device=CPU))
    assert big.results(Context(device=CPU))["too_small_to_gain"] == 1  # K 2048 <= 4096 and N 1024 <= 1024
    assert "size filter" not in FP8.summarize([{**found, "too_small_to_gain": 0}])


def test_without_compile_its_reading_says_it_is_not_what_fp8_costs():
    assert FP8.setting_caveat(("bf16", "fp8")).startswith(NO_COMPILE)
    assert "measure bf16+fp8+compile against bf16+compile" in FP8.setting_caveat(("fp8",))
    assert FP8.setting_caveat(("bf16", "fp8", "compile")) is None


def test_the_claims_check_holds_fp8_against_the_same_set_without_it():
    """bf16+fp8+compile against bf16+compile (not against eager bf16 nor the reference), paired by seed; the note
    and finding only for the set without compile."""
    sets = {"baseline": [100, 101, 99], "bf16": [300, 310, 290], "bf16+compile": [400, 404, 396],
            "bf16+fp8": [60, 62, 58], "bf16+fp8+compile": [380, 390, 370]}
    records = [record(label, seed=s, sps=v, workload="gpt", size="gpt2-124m", n_params=86_000_000)
               for label, values in sets.items() for s, v in enumerate(values)]
    frame = records_frame(records)
    configs = analysis.configurations(frame)
    claims = findings.claims_check(configs, {}, {"fp8": FP8.claims}, frame).set_index("technique")
    compiled, eager = claims.loc["bf16+fp8+compile"], claims.loc["bf16+fp8"]
    assert (compiled["against"], eager["against"]) == ("bf16+compile", "bf16")
    expected = np.exp(np.mean(np.log(np.array(sets["bf16+fp8+compile"]) / sets["bf16+compile"])))
    assert compiled["measured"] == pytest.approx(expected, rel=1e-9) and compiled["verdict"] == "below"
    model, gpus = "a model of 86M parameters, 93x smaller than the claim's 8B", "1 device against the claim's 8 GPUs"
    assert compiled["unmet"] == [model, gpus]
    assert eager["unmet"] == ["no compile in the set (the claim's setting ran with it)", model, gpus]
    caveats = configs.set_index("technique")["caveats"]
    assert caveats["bf16+fp8"][0].startswith(NO_COMPILE) and caveats["bf16+fp8+compile"] == ()
    setting = [f for f in findings.diagnose(configs, None, claims.reset_index()) if f.topic == "setting"]
    assert [(f.technique, f.text.split(": ", 1)[1][:len(NO_COMPILE)]) for f in setting] == [("bf16+fp8", NO_COMPILE)]


# ---- the first H200 sweep (reports/example-h200-first): bf16+fp8 ran eager ------------------------------------


@pytest.fixture(scope="module")
def h200():
    from bench.report import build, markdown

    result, report = build([H200], with_figures=False)
    return result, report, markdown.render(report)


def test_the_h200_report_says_bf16_fp8_ran_without_compile(h200):
    result, report, text = h200
    (headline,) = report.section("summary").blocks[-2].items
    assert [p for p in headline.children if NO_COMPILE in p] == [f"bf16+fp8: {FP8.setting_caveat(('bf16', 'fp8'))}"]
    (found,) = [f for f in result.findings if f.topic == "setting"]
    assert found.technique == "bf16+fp8" and NO_COMPILE in found.text
    sections = {part.split("\n", 1)[0]: part for part in text.split("\n## ")}
    assert NO_COMPILE in sections["Summary"] and NO_COMPILE in sections["What to try next"]


def test_the_h200_claims_check_shows_fps8s_claim_with_its_conditions(h200):
    """fp8 in bf16+fp8 against bf16 (not fp32), its ratio computed here from the records themselves, two pairs: no
    verdict; and every condition of the claim this eager, one-GPU, 86M-parameter run does not meet."""
    result, _, text = h200
    sps: dict[tuple[str, int], float] = {}
    for line in (H200 / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        sps[(r["technique_label"], r["seed"])] = r["speed"]["samples_per_s"]
    seeds = sorted(s for (label, s) in sps if label == "bf16")
    assert len(seeds) == 2
    expected = np.exp(np.mean([math.log(sps[("bf16+fp8", s)] / sps[("bf16", s)]) for s in seeds]))
    (row,) = result.claims[result.claims["name"] == "fp8"].itertuples()
    assert (row.technique, row.against, row.verdict) == ("bf16+fp8", "bf16", "no verdict")
    assert row.measured == pytest.approx(expected, rel=1e-9) and row.measured < 0.25
    assert row.unmet == ["no compile in the set (the claim's setting ran with it)",
                         "a model of 86M parameters, 93x smaller than the claim's 8B",
                         "1 device against the claim's 8 GPUs"]
    line = next(x for x in text.splitlines() if x.startswith("| fp8 in bf16+fp8 |"))
    assert f"{expected:.2f}x [" in line and "over bf16; not the claim's setting: no compile in the set" in line
    assert "Llama3-8B, 8xH100, FSDP2 + torch.compile" in line


@needs_torchao
@pytest.mark.gpu
@pytest.mark.parametrize("label", ["fp8", "bf16+fp8", "bf16+fp8:recipe=rowwise"])
def test_fp8_trains_on_a_gpu_with_fp8_tensor_cores(label):
    device = torch.device("cuda")
    if torch.cuda.get_device_capability(device) < (8, 9):
        pytest.skip("no fp8 tensor cores on this GPU (needs compute capability 8.9+)")
    assert FP8().check(Context(device=device, available_packages=WITH_TORCHAO)) is None
    loop, batches = cuda_loop("gpt", label)
    assert count_float8(loop.model) == 8
    losses = [float(loop.step(next(batches))) for _ in range(3)]
    assert all(math.isfinite(x) for x in losses)
    tech = next(t for t in loop.techniques if t.name == "fp8")
    assert tech.results(loop.ctx)["float8_layers"] == 8
