from pathlib import Path

import pytest

from bench.plan.config import (
    PRESETS,
    Budget,
    ConfigError,
    TechniqueSet,
    build_config,
    parse_technique_sets,
    parse_workloads,
)
from tests.conftest import fake_cuda


def test_technique_sets_parse_combinations_and_options():
    sets = parse_technique_sets("bf16,grad_accum:steps=4,bf16+compile,baseline")
    assert [s.label for s in sets] == ["bf16", "grad_accum:steps=4", "bf16+compile", "baseline"]
    assert sets[1].specs[0].options == (("steps", "4"),)
    assert sets[1].specs[0].resolve().options.steps == 4
    assert sets[3] == TechniqueSet(())


def test_duplicate_sets_are_dropped_and_order_kept():
    assert [s.label for s in parse_technique_sets("bf16,compile,bf16")] == ["bf16", "compile"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope", "unknown technique 'nope' (known: baseline, batch_size, best_of_n, bf16"),
        ("grad_accum:step=4", "has no option 'step' (valid options: steps)"),
        ("grad_accum:steps=four", "option 'steps' wants int, got 'four'"),
        ("grad_accum:steps", "write options as name:key=value"),
        ("baseline+bf16", "baseline is the empty set"),
        ("bf16+bf16", "names a technique twice"),
        ("compile:mode=fastest", "must be one of default, reduce-overhead"),
    ],
)
def test_bad_technique_specs_say_what_is_valid(text, message):
    with pytest.raises(ConfigError, match=None) as info:
        parse_technique_sets(text)
    assert message in str(info.value)


def test_workloads_parse_sizes_and_reject_unknown():
    specs = parse_workloads("mlp,gpt:small")
    assert [s.label for s in specs] == ["mlp:tiny", "gpt:small"]
    with pytest.raises(ConfigError, match="unknown workload 'resnet' \\(known: .*cnn.*gpt.*hf.*mlp"):
        parse_workloads("resnet")
    with pytest.raises(ConfigError, match="has no size 'huge'"):
        parse_workloads("mlp:huge")


def _on_its_device(name: str) -> dict | None:
    """The gpu preset's own workloads need a CUDA device (config only: nothing runs)."""
    return {"device": "cuda"} if name == "gpu" else None


def test_presets_build_and_cli_overrides_win(tmp_path: Path):
    for name in PRESETS:
        assert build_config(name, _on_its_device(name)).name == name
    toml = tmp_path / "sweep.toml"
    toml.write_text('preset = "smoke"\nrepeats = 2\ntechniques = ["bf16"]\n[budget]\nmin_steps = 7\n')
    cfg = build_config("quick", {"repeats": 5, "budget": {"train_steps": 11}}, toml)
    assert cfg.name == "smoke"
    assert cfg.repeats == 5  # CLI beats file
    assert [t.label for t in cfg.techniques] == ["bf16"]
    assert cfg.budget.min_steps == 7 and cfg.budget.train_steps == 11
    assert cfg.budget.parity_steps == PRESETS["smoke"]["budget"]["parity_steps"]


def test_resolved_config_round_trips_through_toml(tmp_path: Path):
    cfg = build_config("quick", {"techniques": "bf16+grad_accum:steps=2,compile"})
    path = tmp_path / "sweep.toml"
    path.write_text(cfg.to_toml())
    again = build_config("quick", None, path)
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("repeats = [", "malformed TOML"),
        ("repeat = 3", "unknown key(s) in"),
        ("[budget]\nwarmup = 3", "unknown budget key(s) 'warmup'"),
        ('preset = "huge"', "unknown preset 'huge' (valid presets: smoke, quick, gpu, standard)"),
        ("repeats = 0", "repeats must be a whole number of at least 1"),
        ('device = "tpu"', "device must be one of auto, cpu, cuda"),
    ],
)
def test_bad_toml_is_a_config_error(tmp_path: Path, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        build_config("quick", None, path)
    assert message in str(info.value)


def test_budget_validates():
    with pytest.raises(ConfigError, match="min_steps"):
        Budget(min_steps=0)
    with pytest.raises(ConfigError, match="budget.max_seconds must be >= 0"):
        Budget(max_seconds=-1)


def test_mode_is_validated_and_recorded_in_sweep_toml():
    cfg = build_config("quick", {"mode": "quality"})
    assert cfg.mode == "quality" and 'mode = "quality"' in cfg.to_toml()
    with pytest.raises(ConfigError, match="mode must be one of speed, quality, both; got 'fast'"):
        build_config("quick", {"mode": "fast"})
    assert build_config("quick").mode == "both" and build_config("quick").repeats == 3


def test_the_quality_safety_cap_must_come_before_the_trial_timeout():
    with pytest.raises(ConfigError, match=r"budget.max_train_seconds \(300\) must be below budget.timeout_s \(300\)"):
        Budget(max_train_seconds=300.0, timeout_s=300.0)
    for preset in PRESETS:
        build_config(preset, _on_its_device(preset))  # every preset is consistent


def test_without_a_preset_the_device_chooses_gpu_on_cuda_and_quick_elsewhere(monkeypatch, tmp_path: Path):
    fake_cuda(monkeypatch, 0)
    assert build_config().name == "quick" and build_config(None, {"device": "cpu"}).name == "quick"
    assert build_config(None, {"device": "cuda"}).name == "gpu"  # said so: a batch executor's nodes have the GPU
    toml = tmp_path / "sweep.toml"
    toml.write_text('device = "cuda"\n')
    assert build_config(None, None, toml).name == "gpu"
    assert build_config(None, {"device": "cpu"}, toml).name == "quick"  # the flag beats the file
    fake_cuda(monkeypatch, 1)
    cfg = build_config()
    assert cfg.name == "gpu" and [w.label for w in cfg.workloads] == PRESETS["gpu"]["workloads"]
    assert build_config(None, {"device": "cpu"}).name == "quick"
    assert build_config("quick").name == "quick"  # a named preset stays


def test_the_gpu_preset_refuses_its_gpu_sizes_on_a_cpu_and_takes_named_workloads(monkeypatch):
    fake_cuda(monkeypatch, 0)
    for device in ("cpu", None):  # explicit, or auto on a machine without CUDA
        with pytest.raises(ConfigError) as info:
            build_config("gpu", {"device": device})
        text = str(info.value)
        assert "sized for a datacenter GPU" in text and "--device cuda" in text and "--preset quick" in text
        assert "\n" not in text
    cfg = build_config("gpu", {"device": "cpu", "workloads": "gpt:tiny", "repeats": 1})
    assert [w.label for w in cfg.workloads] == ["gpt:tiny"] and len(cfg.techniques) == 13


def test_the_gpu_preset_measures_the_sets_gpu_users_ask_about():
    cfg = build_config("gpu", {"device": "cuda"})
    labels = [t.label for t in cfg.techniques]
    for wanted in ("tf32", "bf16", "fp16", "bf16+compile", "bf16+compile+fused_adamw", "bf16+fp8+compile",
                   "bf16+sparse24", "bf16+checkpointing", "bf16+sdpa_backend:backend=flash"):
        assert wanted in labels
    assert {"flash", "efficient", "cudnn", "math"} == {t.specs[-1].options[0][1] for t in cfg.techniques
                                                       if t.names[-1:] == ("sdpa_backend",)}
    assert cfg.sequential and cfg.repeats == 3  # --repeats auto: verdicts, not one repeat
    assert [w.label for w in cfg.workloads] == ["gpt:gpt2-124m-b32", "llama:180m", "cnn:resnet18"]
