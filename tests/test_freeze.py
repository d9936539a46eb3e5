"""Freezing: frozen parameters never change, get no gradient and no optimizer slot; the backward it skips is counted.
Importing techniques.freeze registers it."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench import workloads
from bench.core.structure import ModelStructure
from techniques.base import Context, OptionError
from techniques.freeze import ADAMW_STATE_BYTES, Freeze, apply_freeze, input_modules
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("freeze:blocks=1", "gpt")

FROZEN = {  # workload -> (modules frozen by freeze:blocks=1, parameters frozen through weight tying)
    "gpt": (["wte", "wpe", "blocks.0"], ["head.weight"]),
    "cnn": (["stem", "blocks.0"], []),
}


def forward_flops_by_module(model: torch.nn.Module, x: torch.Tensor) -> dict[str, int]:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return {name.partition(".")[2]: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


@pytest.mark.parametrize("workload", ["gpt", "cnn"])
def test_frozen_parameters_stay_put_and_leave_the_optimizer(workload):
    loop, batches, _ = build_loop(workload, "freeze:blocks=1")
    model = loop.model
    modules, tied = FROZEN[workload]
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    expected = {f"{m}.{n}" for m in modules for n, _ in model.get_submodule(m).named_parameters()} | set(tied)
    assert frozen == expected
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    in_optimizer = {id(p) for g in loop.optimizer.param_groups for p in g["params"]}
    for _ in range(3):
        loop.step(next(batches))
    for name, p in model.named_parameters():
        if name in frozen:
            assert torch.equal(p, before[name]), name
            assert p.grad is None and id(p) not in in_optimizer, name
            assert all(q is not p for q in loop.optimizer.state), name
        else:
            assert not torch.equal(p, before[name]), name  # AdamW moves every trainable weight in 3 steps
            assert id(p) in in_optimizer, name
    found = loop.techniques[0].results(loop.ctx)
    n_frozen = sum(p.numel() for p in {id(p): p for p in model.parameters() if not p.requires_grad}.values())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert found["frozen_modules"] == modules and found["frozen_by_tying"] == tied
    assert found["frozen_params"] == n_frozen > 0 and found["trainable_params"] == n_trainable > 0
    assert n_frozen + n_trainable == sum(p.numel() for p in model.parameters())
    assert found["optimizer_state_bytes_saved"] == ADAMW_STATE_BYTES * n_frozen == 8 * n_frozen
    assert found["grad_bytes_saved"] == 4 * n_frozen
    state_elems = sum(s.numel() for st in loop.optimizer.state.values() for s in st.values() if s.dim() > 0)
    assert state_elems == 2 * n_trainable  # exp_avg and exp_avg_sq of the trainable parameters only


def test_gpt_backward_stops_at_the_first_trainable_block():
    """gpt:tiny, freeze:blocks=1: the step skips block 0's whole backward (its input and weight gradients: twice its
    forward) and the tied head's weight gradient (once the head's forward), and nothing else."""
    base, batches, built = build_loop("gpt", "baseline")
    frozen, _, _ = build_loop("gpt", "freeze:blocks=1")
    batch = next(batches)
    fwd = forward_flops_by_module(built.model, batch[0])
    saved = base.count_flops(batch) - frozen.count_flops(batch)
    assert saved == 2 * fwd["blocks.0"] + fwd["head"] > 0


def test_cnn_backward_skips_the_frozen_part():
    """cnn:tiny: at least the stem's weight gradient and block 0's whole backward are skipped (block 1's first
    convolutions also skip their input gradient), and never more than the whole backward."""
    base, batches, built = build_loop("cnn", "baseline")
    frozen, _, _ = build_loop("cnn", "freeze:blocks=1")
    batch = next(batches)
    fwd = forward_flops_by_module(built.model, batch[0])
    total, cheaper = base.count_flops(batch), frozen.count_flops(batch)
    saved = total - cheaper
    assert 2 * fwd["blocks.0"] + fwd["stem"] <= saved < total - fwd[""]  # "": the whole model's forward


def test_input_layers_are_the_children_registered_before_the_blocks():
    cpu = torch.device("cpu")
    assert [n for n, _ in input_modules(workloads.get("gpt").build("tiny", 0, cpu).model, "blocks")] == \
        ["wte", "wpe", "drop"]
    assert [n for n, _ in input_modules(workloads.get("mlp").build("tiny", 0, cpu).model, "blocks")] == []
    outer = torch.nn.Sequential()
    outer.add_module("emb", torch.nn.Embedding(4, 2))
    outer.add_module("body", torch.nn.Module())
    outer.body.add_module("norm", torch.nn.LayerNorm(2))
    outer.body.add_module("layers", torch.nn.ModuleList([torch.nn.Linear(2, 2)]))
    outer.add_module("head", torch.nn.Linear(2, 2))
    assert [n for n, _ in input_modules(outer, "body.layers")] == ["emb", "body.norm"]  # at every level of the path
    found = apply_freeze(outer, "body.layers", 1)
    assert found["frozen_modules"] == ["emb", "body.norm", "body.layers.0"]
    assert outer.head.weight.requires_grad and not outer.body.layers[0].weight.requires_grad


def test_mlp_freezes_only_blocks():
    loop, _, _ = build_loop("mlp", "freeze:blocks=2")
    model = loop.model
    assert loop.techniques[0].results(loop.ctx)["frozen_modules"] == ["blocks.0", "blocks.1"]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == \
        [n for n, _ in model.named_parameters() if not n.startswith(("blocks.0.", "blocks.1."))]


def test_too_many_blocks_and_bad_options_are_refused():
    model = workloads.get("gpt").build("tiny", 0, torch.device("cpu")).model
    with pytest.raises(ValueError, match="has 2 blocks; use 1..2"):
        Freeze(Freeze.parse_options({"blocks": "3"})).transform_model(model, Context(device=torch.device("cpu")))
    assert all(p.requires_grad for p in model.parameters())  # refused before anything was frozen
    with pytest.raises(OptionError, match="blocks must be >= 1"):
        Freeze.parse_options({"blocks": "0"})
    no_blocks = ModelStructure(source="test: no blocks")
    assert Freeze().check(Context(device=torch.device("cpu"), structure=no_blocks)).startswith("needs the model's blocks")
    assert Freeze().check(Context(device=torch.device("cpu"))) is None


def test_a_later_transform_that_replaces_frozen_parameters_is_refused():
    model = workloads.get("mlp").build("tiny", 0, torch.device("cpu")).model
    tech, ctx = Freeze(), Context(device=torch.device("cpu"))
    tech.transform_model(model, ctx)
    optimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    tech.attach(optimizer, ctx)  # nothing replaced: fine
    model.blocks[0].fc = torch.nn.Linear(model.blocks[0].fc.in_features, model.blocks[0].fc.out_features)
    with pytest.raises(ValueError, match="2 of the 2 frozen parameter tensors were replaced"):
        tech.attach(optimizer, ctx)
