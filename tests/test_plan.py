import torch

from bench.config import build_config
from bench.plan import plan

CPU = torch.device("cpu")


def test_plan_interleaves_repeats_and_adds_the_baseline():
    cfg = build_config("smoke", {"workloads": "mlp,gpt", "techniques": "bf16", "repeats": 2})
    trials = plan(cfg, CPU)
    labels = [(t.repeat, t.workload.name, t.techniques.label) for t in trials]
    assert labels == [
        (0, "mlp", "baseline"), (0, "mlp", "bf16"), (0, "gpt", "baseline"), (0, "gpt", "bf16"),
        (1, "mlp", "baseline"), (1, "mlp", "bf16"), (1, "gpt", "baseline"), (1, "gpt", "bf16"),
    ]
    assert len({t.trial_id for t in trials}) == len(trials)
    assert [t.seed for t in trials[:4]] == [0] * 4 and [t.seed for t in trials[4:]] == [1] * 4


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
