"""The ``hf`` workload: size parsing (without transformers where possible), check(), and a build + two steps."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from torch import nn

import bench.workloads.hf_causal as hf_causal  # registers "hf" (tests.helpers.build_loop looks it up by name)
from bench.workloads.base import WorkloadError

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NEEDS_TRANSFORMERS = "the transformers extra is not installed"


@pytest.fixture
def wl() -> hf_causal.HFCausalLM:
    return hf_causal.HFCausalLM()


def test_presets_resolve_with_their_training_keys(wl):
    for size, model_type in (("tiny", "gpt2"), ("llama-tiny", "llama")):
        p = wl.size_params(size)
        assert p["model_type"] == model_type
        assert (p["batch_size"], p["lr"], p["seq_len"], p["quality_steps"], p["eval_points"]) == (16, 3e-3, 64, 150, 10)
    assert wl.size_params("tiny")["n_layer"] == 2


def test_one_override_keeps_the_rest_of_the_preset(wl):
    p = wl.size_params("gpt2:n_layer=3")
    assert p == {**wl.size_params("tiny"), "n_layer": 3, "target": None}  # the preset's target is for its model
    assert wl.size_params("gpt2")["target"] == wl.size_params("tiny")["target"] is not None
    p = wl.size_params("llama:lr=1e-3:batch_size=8")
    assert (p["model_type"], p["lr"], p["batch_size"], p["num_hidden_layers"]) == ("llama", 1e-3, 8, 2)


def test_override_types_follow_the_config_defaults(wl):
    pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    p = wl.size_params("gpt2:layer_norm_epsilon=1:activation_function=relu:scale_attn_weights=false")
    assert p["layer_norm_epsilon"] == 1.0 and isinstance(p["layer_norm_epsilon"], float)
    assert (p["activation_function"], p["scale_attn_weights"]) == ("relu", False)
    assert wl.size_params("gpt2:num_hidden_layers=4")["n_layer"] == 4  # an alias of GPT2Config's attribute_map


@pytest.mark.parametrize("size, words", [
    ("bert", ["'bert'", "gpt2", "llama", "tiny"]),
    ("gpt2:n_layer", ["'n_layer'", "KEY=VALUE"]),
    ("gpt2:batch_size=abc", ["batch_size", "an integer", "'abc'"]),
    ("gpt2:lr=0", ["lr", "positive"]),
    ("gpt2:vocab_size=10", ["vocab_size", "set by the workload"]),
    ("gpt2:seq_len=32:seq_len=64", ["seq_len", "twice"]),
])
def test_bad_sizes_say_what_is_wrong_in_one_line(wl, size, words):
    with pytest.raises(WorkloadError) as err:
        wl.size_params(size)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("size, words", [
    ("gpt2:n_layers=2", ["'n_layers'", "GPT2Config has no such attribute", "n_layer"]),
    ("llama:n_layer=2", ["'n_layer'", "LlamaConfig", "num_hidden_layers"]),
    ("gpt2:n_layer=2.5", ["n_layer", "an integer", "'2.5'"]),
    ("llama:tie_word_embeddings=1", ["tie_word_embeddings", "true or false"]),
])
def test_bad_config_keys_are_checked_against_the_config_class(wl, size, words):
    pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    with pytest.raises(WorkloadError) as err:
        wl.size_params(size)
    assert "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_without_transformers_sizes_parse_and_check_says_why(wl, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    assert "transformers" in wl.check() and "\n" not in wl.check()
    assert wl.size_params("gpt2:n_layers=5")["n_layers"] == 5  # not checkable here; the trial is skipped instead
    with pytest.raises(WorkloadError, match="batch_size"):
        wl.size_params("gpt2:batch_size=x")


def test_check_passes_with_transformers(wl):
    pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    assert wl.check() is None


@pytest.mark.parametrize("size, n_layer", [("tiny", 2), ("llama-tiny", 2)])
def test_builds_and_trains_two_steps_through_the_harness_loop(size, n_layer):
    pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    from tests.helpers import build_loop

    loop, batches, built = build_loop("hf", "baseline", size=size)
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)
    blocks = built.model.get_submodule(built.structure.blocks)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == n_layer
    assert not any(p.is_meta for p in built.model.parameters())
    assert built.model.hf.config.vocab_size == built.dataset["vocab_size"]
    with torch.no_grad():  # as the harness evaluates
        assert set(built.evaluate(built.model)) == {"val_loss", "val_bpc"}


def test_the_seed_sets_the_initialisation():
    pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    wl = hf_causal.HFCausalLM()
    a, b, c = (wl.build("tiny", seed, torch.device("cpu")).model.state_dict() for seed in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
