import torch

from bench.plan.config import build_config
from bench.plan.planner import plan

CPU = torch.device("cpu")


def test_plan_interleaves_repeats_and_adds_the_baseline():
    cfg = build_config("smoke", {"workloads": "mlp,gpt", "techniques": "bf16", "repeats": 2})
    trials = plan(cfg, CPU)
    configs = {("mlp", "baseline"), ("mlp", "bf16"), ("gpt", "baseline"), ("gpt", "bf16")}
    for repeat in (0, 1):  # every configuration once per repeat round, the rounds one after the other
        round_ = trials[4 * repeat: 4 * repeat + 4]
        assert {(t.workload.name, t.techniques.label) for t in round_} == configs
        assert {t.repeat for t in round_} == {repeat} and {t.seed for t in round_} == {repeat}
    assert len({t.trial_id for t in trials}) == len(trials)
    assert [t.position for t in trials] == list(range(8))


def test_the_order_within_a_repeat_is_shuffled_reproducibly_from_the_seed():
    cfg = build_config("smoke", {"workloads": "mlp,gpt,cnn", "techniques": "bf16,grad_accum:steps=2",
                                 "repeats": 4})
    order = [(t.workload.name, t.techniques.label) for t in plan(cfg, CPU)]
    again = [(t.workload.name, t.techniques.label) for t in plan(cfg, CPU)]
    assert order == again  # the recorded seed reproduces it
    rounds = [tuple(order[9 * r: 9 * r + 9]) for r in range(4)]
    assert len(set(rounds)) > 1  # not the same order every round ...
    assert {r[0] for r in rounds} != {("mlp", "baseline")}  # ... nor the baseline always first
    other = build_config("smoke", {"workloads": "mlp,gpt,cnn", "techniques": "bf16,grad_accum:steps=2",
                                   "repeats": 4, "seed": 7})
    assert [(t.workload.name, t.techniques.label) for t in plan(other, CPU)] != order


def test_impossible_sets_are_planned_with_a_reason():
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "bf16+fp16,checkpointing", "repeats": 1})
    reasons = {t.techniques.label: t.skip_reason for t in plan(cfg, CPU)}
    assert reasons["baseline"] is None and reasons["checkpointing"] is None
    assert reasons["bf16+fp16"] == "bf16 and fp16 both own the 'precision' slot; use one of them"


def test_missing_dataset_skips_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINBENCH_FASHION_MNIST_DIR", str(tmp_path))
    cfg = build_config("smoke", {"workloads": "cnn", "techniques": "baseline", "repeats": 1})
    (trial,) = plan(cfg, CPU)
    assert "dataset-fashion-mnist" in trial.skip_reason


def test_sets_that_would_fail_in_every_trial_are_skipped_at_plan_time():
    cfg = build_config("smoke", {"workloads": "mlp", "repeats": 1, "nproc": 2,
                                 "techniques": "grad_accum:steps=7,zero1+fused_adamw,ddp+grad_accum:steps=64"})
    reasons = {t.techniques.label: t.skip_reason for t in plan(cfg, CPU)}
    batch = 64  # mlp:tiny's batch
    assert reasons["grad_accum:steps=7"] == f"grad_accum: batch size {batch} is not divisible by steps=7"
    assert reasons["zero1+fused_adamw"] == "zero1 and fused_adamw each build the optimizer; a set can use one of them"
    # 64 samples split into 64 micro-batches, but each of the 2 processes holds 32: not 64 equal micro-batches
    assert reasons["ddp+grad_accum:steps=64"] == ("the per-process batch of 32 samples does not split into 64 equal "
                                                  "micro-batches")
    assert reasons["baseline"] is None
