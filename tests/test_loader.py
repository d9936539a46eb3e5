"""Input pipelines and the ``loader`` technique: the same batches in-process and in DataLoader workers, an exact
trial, a data wait that the slow augmentation raises and the workers lower, and clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
import torch

from bench import workloads
from bench.core.data import classifier_pipeline, dataset_pipeline, sample_seed, window_pipeline
from bench.plan.user_models import _dataset_batches
from bench.trial import TrialSpec, run
from bench.workloads.gpt_chars import window_batches
from bench.workloads.mlp_mnist1d import shuffled_batches
from techniques.base import Context, OptionError
from techniques.loader import Loader
from tests.conftest import REPO, TINY_BUDGET
from tests.helpers import TechniqueSettings

SETTINGS = TechniqueSettings("loader:workers=2", "cnn_aug")

CPU = torch.device("cpu")


def build(name: str, seed: int = 0) -> workloads.BuiltWorkload:
    wl = workloads.get(name)
    if wl.check():
        pytest.skip(wl.check())
    return wl.build("tiny", seed, CPU)


def take(batches: Iterator, n: int) -> list:
    return [next(batches) for _ in range(n)]


def assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for (xg, yg), (xw, yw) in zip(got, want, strict=True):
        assert xg.dtype == xw.dtype and yg.dtype == yw.dtype
        assert torch.equal(xg, xw) and torch.equal(yg, yw)  # bit for bit (no NaNs in these sets)


def loaded(pipeline, batch_size: int, seed: int, n: int, workers: int) -> list:
    loader = pipeline.loader(batch_size, seed, num_workers=workers, persistent_workers=True)
    try:
        return take(loader, n)
    finally:
        loader.close()
        assert loader.workers == []


@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "cnn_aug"])
def test_pipeline_and_loader_give_the_workloads_own_batches(name):
    built = build(name)
    own = take(built.batches(built.batch_size, 3), 5)
    assert_same(take(built.pipeline.batches(built.batch_size, 3), 5), own)
    for workers in (0, 2):
        assert_same(loaded(built.pipeline, built.batch_size, 3, 5, workers), own)


def test_classifier_order_is_shuffled_batches_across_epochs():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    want = take(shuffled_batches(x, y, 3, 5), 10)  # 3 batches an epoch: 3 epochs and a bit, remainders dropped
    pipeline = classifier_pipeline(x, y)
    assert_same(take(pipeline.batches(3, 5), 10), want)
    assert_same(loaded(pipeline, 3, 5, 10, workers=2), want)


def test_window_order_is_window_batches():
    data = torch.arange(500) % 37
    want = take(window_batches(data, 4, 16, 2), 6)
    pipeline = window_pipeline(data, 16)
    assert_same(take(pipeline.batches(4, 2), 6), want)
    assert_same(loaded(pipeline, 4, 2, 6, workers=2), want)


class Items(torch.utils.data.Dataset):
    """A user's Dataset without ``__getitems__``: (tensor, int) items."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return torch.full((3,), float(i)), i % 4


@pytest.mark.parametrize("dataset", [Items(), torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10))],
                         ids=["items", "tensor_dataset"])
def test_a_users_dataset_keeps_its_dataloader_order(dataset):
    # The user's own path re-iterates a shuffling DataLoader each epoch; its draws (a base seed per epoch, one
    # spare permutation at each epoch's end) are reproduced, so the order holds across epochs.
    want = take(_dataset_batches(dataset, 3, 7), 10)
    pipeline = dataset_pipeline(dataset)
    assert_same(take(pipeline.batches(3, 7), 10), want)
    assert_same(loaded(pipeline, 3, 7, 10, workers=2), want)


def test_user_models_get_a_pipeline_for_tensors_and_datasets():
    from bench.plan.user_models import _pipeline_of

    x, y = torch.randn(8, 2), torch.arange(8)
    assert _pipeline_of((x, y)) is not None and _pipeline_of(Items()) is not None
    assert _pipeline_of(lambda batch_size, seed: iter(())) is None  # a batches function: nothing to address


def test_augmentation_is_a_function_of_the_key():
    built = build("cnn_aug")
    data = built.pipeline.dataset
    x_plain = data.x[5]
    a, b = data[(5, sample_seed(0, 0))][0], data[(5, sample_seed(0, 0))][0]
    c = data[(5, sample_seed(0, 1))][0]  # the same image at another position of the stream
    assert a.shape == x_plain.shape and torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, x_plain)
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(data[(5, sample_seed(0, 0))][0], a)
    assert built.train_data is None  # curriculum would draw un-augmented samples
    assert built.dataset["augmentation"].startswith("per sample")


def test_seeds_of_neighbouring_positions_and_streams_differ():
    seeds = {sample_seed(s, p) for s in range(4) for p in range(1000)}
    assert len(seeds) == 4000 and all(0 <= v < 2**63 for v in seeds)


def test_pin_memory_on_cpu_is_refused_and_options_are_typed():
    ctx = Context(device=CPU, workload="cnn_aug")
    reason = Loader(Loader.Options(pin_memory=True)).check(ctx)
    assert reason and "pin_memory" in reason and "\n" not in reason
    assert Loader().check(ctx) is None and Loader(Loader.Options(pin_memory=False)).check(ctx) is None
    with pytest.raises(ValueError, match="pin_memory"):
        Loader(Loader.Options(pin_memory=True)).batches(build("mlp").pipeline, 8, 0, ctx)
    opts = Loader.parse_options({"workers": "3", "pin_memory": "none", "persistent_workers": "false"})
    assert (opts.workers, opts.pin_memory, opts.persistent_workers) == (3, None, False)
    with pytest.raises(OptionError, match="workers must be >= 0"):
        Loader.parse_options({"workers": "-1"})
    assert "curriculum" in Loader.conflicts


def test_a_workload_without_pipeline_is_a_clear_error():
    with pytest.raises(ValueError, match="workload mine has no Dataset pipeline; loader needs"):
        Loader().batches(None, 8, 0, Context(device=CPU, workload="mine"))


@pytest.fixture
def spec(reference_dir):
    def make(workload: str, techniques=(), mode: str = "both", **budget) -> TrialSpec:
        return TrialSpec(sweep_id="t", trial_id=f"{workload}/{'+'.join(techniques) or 'baseline'}",
                         workload=workload, size="tiny", techniques=list(techniques), seed=0, repeat=0,
                         device="cpu", budget={**TINY_BUDGET, **budget}, peaks={"float32": 1e11},
                         peak_source="test", mode=mode, reference_dir=str(reference_dir))
    return make


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
def test_a_loader_trial_passes_parity_and_leaves_no_workers(spec):
    build("cnn_aug")  # skips without Fashion-MNIST
    before = _children()
    rec = run(spec("cnn_aug", ["loader:workers=2"], train_steps=8, eval_points=2))
    assert rec.status == "ok", rec.reason
    assert rec.kind == "exact" and rec.parity.ok and rec.parity.steps == 4
    assert rec.parity.loss_rel_diff < 1e-6 and rec.parity.distance_rel_diff < 1e-6  # the baseline's own math
    assert _children() <= before  # finalize ended the workers


@pytest.mark.slow
def test_a_trial_process_with_workers_exits_cleanly(tmp_path, reference_dir):
    spec = TrialSpec(sweep_id="t", trial_id="mlp/loader", workload="mlp", size="tiny", techniques=["loader"], seed=0,
                     repeat=0, device="cpu", budget={**TINY_BUDGET, "train_steps": 8, "eval_points": 2},
                     mode="both", reference_dir=str(reference_dir))
    (tmp_path / "spec.json").write_text(spec.to_json())
    proc = subprocess.run([sys.executable, "-m", "bench.trial", str(tmp_path / "spec.json"),
                           str(tmp_path / "record.json")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "leaked" not in proc.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["status"] == "ok", record["reason"]
    assert record["parity"]["ok"]


@pytest.mark.slow
def test_the_data_wait_rises_with_the_augmentation_and_falls_with_workers(spec):
    build("cnn_aug")
    window = {"mode": "speed", "warmup_steps": 4, "min_steps": 40, "min_seconds": 1.5, "max_seconds": 20.0,
              "memory": False, "contention_retries": 0}
    frac = {}
    for key, workload, techniques in [("cnn", "cnn", []), ("aug", "cnn_aug", []),
                                      ("aug+workers", "cnn_aug", ["loader:workers=2"])]:
        rec = run(spec(workload, techniques, **window))
        assert rec.status == "ok", rec.reason
        frac[key] = rec.speed.data_wait_frac
    # Ratios in one process, with generous bounds: the augmentation of a batch costs about as much as the step.
    assert frac["aug"] > 0.2 and frac["aug"] > 3 * frac["cnn"], frac
    assert frac["aug+workers"] < 0.7 * frac["aug"], frac
