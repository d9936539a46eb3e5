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


def test_presets_build_and_cli_overrides_win(tmp_path: Path):
    for name in PRESETS:
        assert build_config(name).name == name
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
        ('preset = "huge"', "unknown preset 'huge' (valid presets: smoke, quick, standard)"),
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
        build_config(preset)  # every preset is consistent
