import pytest
import torch

from bench.plan.config import build_config
from bench.plan.planner import plan
from tests.conftest import fake_cuda

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


def test_a_model_without_blocks_is_planned_as_such_and_per_block_techniques_never_launch(tmp_path, monkeypatch):
    """The plan asks the workload's description (its ModelStructure), so a model that declares no blocks has its
    per-block techniques skipped with the part named, before any trial starts: the launcher records them without
    starting a process (and nothing builds the model)."""
    from bench.core.structure import ModelStructure
    from bench.run.launcher import TrialLauncher
    from bench.workloads.base import Size, Workload, forget, register

    @register
    class Flat(Workload):  # a model with a head and no repeated blocks
        name = "plan_test_flat"
        sizes = {"tiny": Size()}

        def structure_from(self, params):
            return ModelStructure(head="head", source="declared by the test")

        def build(self, size, seed, device):
            raise AssertionError("a skipped trial builds nothing")

    try:
        cfg = build_config("smoke", {"workloads": "plan_test_flat:tiny", "techniques": "checkpointing,freeze,bf16",
                                     "repeats": 1})
        trials = {t.techniques.label: t for t in plan(cfg, CPU)}
        assert "has no blocks to checkpoint" in trials["checkpointing"].skip_reason
        assert trials["freeze"].skip_reason.startswith("freeze: needs the model's blocks")
        assert trials["bf16"].skip_reason is None and trials["baseline"].skip_reason is None
        launcher = TrialLauncher(cfg, tmp_path, CPU, tmp_path)
        monkeypatch.setattr(TrialLauncher, "_launch", lambda *a: pytest.fail("a skipped trial was launched"))
        record = launcher.run(trials["checkpointing"], {})
        assert record.status == "skipped" and record.reason == trials["checkpointing"].skip_reason
    finally:
        forget("plan_test_flat")


# ---- --nproc against the visible devices ------------------------------------------------------------------------


@pytest.fixture
def one_gpu(monkeypatch):
    """One CUDA device, as the planner's process asks (bench.measure.cuda_caps) and a trial's would (torch.cuda:
    only whether it is there and how many)."""
    fake_cuda(monkeypatch, 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_nproc_beyond_the_visible_gpus_is_one_line_and_exit_2_with_nothing_made(one_gpu, tmp_path, monkeypatch,
                                                                               capsys):
    import subprocess

    from bench.cli import main

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    out = tmp_path / "sweep"
    rc = main(["sweep", "--workloads", "mlp", "--techniques", "ddp", "--device", "cuda", "--nproc", "4",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [
        "error: --nproc 4 needs 4 CUDA devices on each node, but torch sees 1: use --nproc 1 or fewer, or --device "
        "cpu to run the ranks with gloo"]
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no directory, no sweep.toml, no env.json
    assert not torch.cuda.is_initialized()


def test_the_nproc_check_counts_devices_only_where_ranks_take_one(one_gpu, tmp_path, monkeypatch):
    from bench.plan.config import ConfigError
    from bench.plan.planner import check_nproc
    from bench.run.launcher import TrialLauncher
    from bench.run.runner import SweepRunner

    cuda = torch.device("cuda")
    check_nproc(cuda, 1)  # one process: the device count does not matter
    check_nproc(CPU, 8)  # gloo on the CPU: any number of ranks, as before
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ConfigError, match=r"--nproc 2 needs 2 CUDA devices .* torch sees 1 \(CUDA_VISIBLE_DEVICES=3\)"):
        check_nproc(cuda, 2)
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 2})
    with pytest.raises(ConfigError, match="--nproc 2"):  # bench.sweep() and sweep --ab build this runner
        SweepRunner(cfg, tmp_path / "sweep", cuda)
    with pytest.raises(ConfigError, match="--nproc 2"):  # a batch job's setup resolves the device on its node
        TrialLauncher(cfg, tmp_path / "sweep", cuda, tmp_path)
    assert TrialLauncher(cfg, tmp_path / "sweep", None, tmp_path).device is None  # a submitter: decided on the node
    assert not (tmp_path / "sweep").exists()
