"""Pruning: the cubic schedule, exact unstructured counts (global and per layer) with the tied head left alone, and
structured shrinks whose parameter counts, optimizer state and outputs are checked against hand computations."""

import pytest
import torch
from torch import nn

import techniques.prune  # noqa: F401  (registers "prune" before build_loop resolves the label)
from bench import workloads
from bench.core.structure import ModelStructure, describe
from bench.plan.config import Budget
from bench.workloads.cnn_fashion import ResNet
from techniques.base import Context, OptionError
from techniques.prune import (
    Prune,
    channel_groups,
    cubic_sparsity,
    effective_weight,
    prunable_weights,
    shrink,
    sparsity_schedule,
)
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("prune:start=0:end=0", "gpt")  # pruned before the first step (the default starts at 25% of the plan)

CPU = torch.device("cpu")


def zeros_of(targets) -> list[int]:
    return [int((effective_weight(m) == 0).sum()) for _, m, _ in targets]


# ---- the schedule ---------------------------------------------------------------------------------------------


def test_cubic_schedule_values():
    assert cubic_sparsity(10, 10, 50, 0.6) == 0.0 and cubic_sparsity(0, 10, 50, 0.6) == 0.0
    assert cubic_sparsity(50, 10, 50, 0.6) == 0.6 and cubic_sparsity(80, 10, 50, 0.6) == 0.6
    assert cubic_sparsity(30, 10, 50, 0.6) == pytest.approx(0.6 * (1 - 0.5**3))  # half-way: 7/8 of the target
    values = [cubic_sparsity(t, 10, 50, 0.6) for t in range(0, 61)]
    assert values == sorted(values) and values[11] > 0
    assert values[12] - values[11] > values[49] - values[48]  # fast early, slow late (the cubic's point)

    events = sparsity_schedule(100, 0.25, 0.75, 10, 0.6)
    assert len(events) == 10 and events[0][0] == 30 and events[-1] == (75, 0.6)  # exactly the target at `end`
    steps, targets = zip(*events, strict=True)
    assert list(steps) == sorted(steps) and list(targets) == sorted(targets) and targets[0] > 0
    for step, s in events:  # every 5 steps from 30 to 75: on the continuous curve
        assert s == pytest.approx(cubic_sparsity(step, 25, 75, 0.6))
    assert sparsity_schedule(100, 0.5, 0.5, 3, 0.4)[-1] == (50, 0.4)  # start == end: one-shot at start


# ---- unstructured ---------------------------------------------------------------------------------------------


def test_global_unstructured_reaches_exact_counts_and_leaves_the_tied_head_alone():
    """gpt:tiny, 3 events over steps 1..4 of an 8-step plan: after each step the pruned count is exactly
    round(s * N) for the last event due; the head (tied to wte) is left dense and tied; the optimizer keeps stepping
    the same Parameter objects; pruned weights stay zero through later steps."""
    loop, batches, built = build_loop("gpt", "prune:sparsity=0.6:start=0:end=0.5:events=3", budget=Budget(train_steps=8))
    tech, model = loop.techniques[0], loop.model
    assert loop.ctx.total_steps == 8
    schedule = sparsity_schedule(8, 0.0, 0.5, 3, 0.6)
    assert [s for s, _ in schedule] == [1, 3, 4]
    targets, shared = prunable_weights(model)
    assert shared == ["head"] and len(targets) == 8  # qkv, attn.proj, mlp.fc, mlp.proj in 2 blocks
    params = {id(p) for g in loop.optimizer.param_groups for p in g["params"]}
    n = sum(p.numel() for _, _, p in targets)
    for step in range(1, 5):
        loop.step(next(batches))
        due = [s for t, s in schedule if t <= step]
        assert sum(zeros_of(targets)) == round(due[-1] * n)
    assert sum(zeros_of(targets)) == round(0.6 * n)
    for name, m, p in targets:
        assert m.weight_orig is p and id(p) in params, name  # torch's reparametrisation keeps the object
    held = [meth.mask for _, m, _ in targets for hook in m._forward_pre_hooks.values()
            for meth in hook._pruning_methods if isinstance(meth, torch.nn.utils.prune.CustomFromMask)]
    assert len(held) == 3 * len(targets) and all(mask is None for mask in held)  # no per-event copies kept
    assert model.head.weight is model.wte.weight and not hasattr(model.head, "weight_mask")
    assert int((model.wte.weight == 0).sum()) == 0
    masks = {name: m.weight_mask.clone() for name, m, _ in targets}
    for _ in range(2):
        loop.step(next(batches))
    for name, m, _ in targets:
        assert torch.equal(m.weight_mask, masks[name]), name  # no more events after `end`
        assert (effective_weight(m)[masks[name] == 0] == 0).all(), name
    assert sum(zeros_of(targets)) == round(0.6 * n)
    found = tech.results(loop.ctx)
    assert found["events"] == [[1, round(schedule[0][1], 6)], [3, round(schedule[1][1], 6)], [4, 0.6]]
    assert found["sparsity"] == round(round(0.6 * n) / n, 6) and found["weights"] == n
    assert found["nonzero"] == n - round(0.6 * n) and found["left_dense_shared"] == ["head"]


def test_per_layer_unstructured_prunes_each_layer_exactly():
    loop, batches, _ = build_loop("mlp", "prune:scope=layer:sparsity=0.3:start=0:end=0.5:events=2",
                                  budget=Budget(train_steps=4))
    targets, shared = prunable_weights(loop.model)  # before pruning reparametrises them
    for _ in range(3):
        loop.step(next(batches))
    assert shared == [] and [name for name, _, _ in targets] == ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "head"]
    assert zeros_of(targets) == [round(0.3 * p.numel()) for _, _, p in targets]
    layers = loop.techniques[0].results(loop.ctx)["layers"]
    assert layers == {name: round(round(0.3 * p.numel()) / p.numel(), 6) for name, _, p in targets}


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_channels_last_conv_weights_prune_exactly(scope):
    """torch's pruning flattens masks and scores with view(-1), which a channels_last conv weight refuses."""
    model = cnn_tiny().to(memory_format=torch.channels_last)
    tech = Prune(Prune.Options(scope=scope))
    tech.transform_model(model, Context(device=CPU, workload="cnn"))
    targets = tech._targets
    for s in (0.2, 0.5):
        tech.prune_to(s)
        if scope == "global":
            assert sum(zeros_of(targets)) == round(s * sum(p.numel() for _, _, p in targets))
        else:
            assert zeros_of(targets) == [round(s * p.numel()) for _, _, p in targets]
    model(sample_input("cnn").to(memory_format=torch.channels_last)).sum().backward()
    assert all(p.grad[m.weight_mask == 0].abs().sum() == 0 for _, m, p in targets)  # pruned: no gradient


@pytest.mark.parametrize("mode", ["unstructured", "structured"])
def test_a_window_past_the_plan_trains_the_final_state_from_its_first_step(mode):
    """The speed window sets ctx.step past the plan: the first batch drawn brings pruning to its end state."""
    loop, batches, built = build_loop("mlp", f"prune:mode={mode}", budget=Budget(train_steps=40))
    n_params = sum(p.numel() for p in loop.model.parameters())
    loop.ctx.step = loop.ctx.total_steps
    targets, _ = prunable_weights(loop.model)
    batch = next(batches)
    if mode == "unstructured":
        assert sum(zeros_of(targets)) == round(0.5 * sum(p.numel() for _, _, p in targets))
    else:
        assert sum(p.numel() for p in loop.model.parameters()) < n_params
    loop.step(batch)
    assert loop.techniques[0].results(loop.ctx)["events"] == [[40, 0.5]]


# ---- structured -----------------------------------------------------------------------------------------------


def gpt_tiny() -> nn.Module:
    return workloads.get("gpt").build("tiny", 0, CPU).model


def mlp_tiny() -> nn.Module:
    torch.manual_seed(0)
    p = workloads.get("mlp").size_params("tiny")
    from bench.workloads.mlp_mnist1d import MLP
    return MLP(40, p["width"], p["depth"], 10)


def cnn_tiny() -> nn.Module:
    torch.manual_seed(0)
    p = workloads.get("cnn").size_params("tiny")
    return ResNet(p["widths"], p["blocks_per_stage"], p["stem_stride"])


def sample_input(workload: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    if workload == "gpt":
        return torch.randint(0, 50, (4, 64), generator=gen)
    if workload == "mlp":
        return torch.randn(8, 40, generator=gen)
    return torch.randn(8, 1, 28, 28, generator=gen)


def removed_by_hand(workload: str, s: float) -> int:
    """Parameters a structured prune at ``s`` removes from the tiny model, from the sizes alone."""
    if workload == "gpt":  # per block: fc rows + bias (d_model + 1 each) and proj columns (d_model each)
        d = 64
        hidden, keep = 4 * d, round((1 - s) * 4 * d)
        return 2 * (hidden - keep) * (d + 1 + d)
    if workload == "mlp":  # 40 -> 256 -> 256 -> 256 -> 10: each hidden layer cut to k, and the next layer's inputs
        w, k = 256, round((1 - s) * 256)
        before = (40 * w + w) + 2 * (w * w + w) + (w * 10 + 10)
        after = (40 * k + k) + 2 * (k * k + k) + (k * 10 + 10)
        return before - after
    # cnn: blocks (c_in -> c) = (8 -> 8), (8 -> 16), (16 -> 32); the inner channels: conv1 filters (c_in * 9),
    # bn1 weight and bias (2), conv2 input channels (c * 9)
    return sum((c - round((1 - s) * c)) * (c_in * 9 + 2 + c * 9) for c_in, c in ((8, 8), (8, 16), (16, 32)))


MODELS = {"gpt": gpt_tiny, "mlp": mlp_tiny, "cnn": cnn_tiny}


def loss_of(model: nn.Module, workload: str, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out.float().pow(2).mean()


@pytest.mark.parametrize("workload", ["gpt", "cnn", "mlp"])
def test_structured_shrinks_by_the_hand_count_and_keeps_training(workload):
    model = MODELS[workload]()
    x = sample_input(workload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):  # AdamW state to slice
        opt.zero_grad()
        loss_of(model, workload, x).backward()
        opt.step()
    before = sum(p.numel() for p in model.parameters())
    objects = [id(p) for p in model.parameters()]
    tech = Prune(Prune.Options(mode="structured", sparsity=0.5, start=0.5))
    ctx = Context(device=CPU, workload=workload, total_steps=10, step=3)
    tech.transform_model(model, ctx)
    tech.attach(opt, ctx)
    tech.after_step(opt, ctx)  # 4 steps completed: before start (5), nothing happens
    assert sum(p.numel() for p in model.parameters()) == before
    for p in model.parameters():  # state equal to the parameter itself: a wrong slice of either would show
        opt.state[p]["exp_avg"].copy_(p.detach())
        opt.state[p]["exp_avg_sq"].copy_(p.detach() ** 2)  # >= 0: AdamW takes its root
    ctx.step = 4
    tech.after_step(opt, ctx)
    after = sum(p.numel() for p in model.parameters())
    assert before - after == removed_by_hand(workload, 0.5)
    assert [id(p) for p in model.parameters()] == objects  # the same Parameter objects, smaller
    for p in model.parameters():
        state = opt.state[p]
        assert torch.equal(state["exp_avg"], p.detach()) and torch.equal(state["exp_avg_sq"], p.detach() ** 2)
        assert float(state["step"]) == 2
    for _ in range(2):
        opt.zero_grad()
        loss = loss_of(model, workload, x)
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    found = tech.results(ctx)
    assert found["params_before"] == before and found["params_after"] == after and found["events"] == [[5, 0.5]]
    assert found["start_step"] == 5 and found["sparsity"] == 0.5 and set(found["layers"].values()) == {0.5}
    tech.after_step(opt, ctx)  # one shot: nothing more
    assert sum(p.numel() for p in model.parameters()) == after


@pytest.mark.parametrize("workload", ["gpt", "cnn", "mlp"])
def test_removing_only_all_zero_channels_leaves_the_output_unchanged(workload):
    """Zero a quarter of every layer's hidden channels (their incoming weights, bias and, for cnn, bn1's scale and
    shift, so the channel outputs exactly 0): those are the lowest-norm channels, and cutting them must not change
    the model's output. A wrong slice (wrong rows, wrong dim, the state of another layer) would."""
    model = MODELS[workload]().eval()
    groups = channel_groups(model, describe(model, "blocks"))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for g in groups:
            dead = torch.randperm(g.channels, generator=gen)[: g.channels // 4]
            for module, name, dim in g.cuts:
                if dim == 0 and not name.startswith("running"):
                    getattr(module, name)[dead] = 0.0
        x = sample_input(workload)
        before = model(x)
        sizes = shrink(groups, 0.25, None)
        after = model(x)
    assert all(b - a == b // 4 for b, a in sizes.values())
    torch.testing.assert_close(after, before)


def test_an_optimizer_state_it_cannot_slice_is_refused_before_anything_is_cut():
    model = mlp_tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(sample_input("mlp")).sum().backward()
    opt.step()
    opt.state[model.blocks[1].fc.weight]["row_var"] = torch.zeros(256, 1)  # a factored second moment (Adafactor)
    shapes = [p.shape for p in model.parameters()]
    with pytest.raises(ValueError, match=r"cannot slice the optimizer's state 'row_var' of blocks.1.fc.weight \(shape \(256, 1\)"):
        shrink(channel_groups(model, describe(model, "blocks")), 0.5, opt)
    assert [p.shape for p in model.parameters()] == shapes


# ---- check and options ----------------------------------------------------------------------------------------


def test_check_reasons():
    structured = Prune(Prune.parse_options({"mode": "structured"}))
    assert "one process" in Prune().check(Context(device=CPU, workload="mlp", world_size=2))
    bare = Context(device=CPU, structure=ModelStructure(blocks="layers", source="inferred"))  # no MLP, no channels
    reason = structured.check(bare)
    assert "removable hidden channels" in reason and "mode=unstructured" in reason and "\n" not in reason
    for workload in ("gpt", "cnn", "cnn_aug", "mlp", "hf"):  # declared, or derived from the config
        assert structured.check(Context(device=CPU, structure=workloads.get(workload).structure("tiny"))) is None
    assert Prune().check(bare) is None
    assert "compile" in Prune.conflicts and Prune.own_flops


@pytest.mark.parametrize("raw, match", [
    ({"sparsity": "0"}, r"sparsity must be in \(0, 1\)"),
    ({"sparsity": "1"}, r"sparsity must be in \(0, 1\)"),
    ({"mode": "channels"}, "unstructured, structured"),
    ({"scope": "model"}, "global, layer"),
    ({"start": "0.8", "end": "0.5"}, "start <= end"),
    ({"end": "1.5"}, "start <= end"),
    ({"events": "0"}, "events must be >= 1"),
    ({"start": "-0.1"}, r"start must be in \[0, 1\]"),
    ({"mode": "structured", "scope": "layer"}, "apply to mode=unstructured only"),
    ({"mode": "structured", "events": "3"}, "apply to mode=unstructured only"),
    ({"level": "3"}, "valid options: end, events, mode, scope, sparsity, start"),
])
def test_option_errors(raw, match):
    with pytest.raises(OptionError, match=match):
        Prune.parse_options(raw)


def test_options_that_are_valid():
    o = Prune.parse_options({"mode": "structured", "start": "0.9", "sparsity": "0.25"})
    assert (o.mode, o.start, o.sparsity) == ("structured", 0.9, 0.25)
    assert Prune.parse_options({"start": "0", "end": "0", "events": "1"}).end == 0.0


# ---- a real trial ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unstructured", "structured"])
def test_one_trial_through_the_runner(mode, tmp_path):
    from bench.loop import plain_loop
    from bench.measure.flops import count_flops
    from bench.trial import TrialSpec, run
    from tests.conftest import TINY_BUDGET

    spec = TrialSpec(sweep_id="t", trial_id="t", workload="mlp", size="tiny", techniques=[f"prune:mode={mode}"],
                     seed=0, repeat=0, device="cpu", budget={**TINY_BUDGET, "parity_steps": 0},
                     reference_dir=str(tmp_path))
    rec = run(spec)
    assert rec.status == "ok", rec.reason
    found = rec.technique_results["prune"]
    assert found["mode"] == mode and found["events"]
    fresh = workloads.get("mlp").build("tiny", 0, CPU)  # the dense model's step, as the reference counts it
    loop = plain_loop(fresh, fresh.lr, CPU)
    dense = count_flops(lambda: loop.step(next(fresh.batches(fresh.batch_size, 0))))
    if mode == "unstructured":
        assert found["sparsity"] == pytest.approx(0.5, abs=1e-5) and found["nonzero"] < found["weights"]
        assert rec.speed.flops_per_step == dense  # masks run the dense matmuls: counted dense
    else:
        assert found["params_after"] < found["params_before"] == rec.build.n_params
        assert rec.speed.flops_per_step < 0.6 * dense  # half of every hidden layer: about a third of the matmuls
