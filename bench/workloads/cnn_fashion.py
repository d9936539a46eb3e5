"""Small ResNet-style CNN on Fashion-MNIST, read from the files of the Debian package ``dataset-fashion-mnist``.

Fashion-MNIST (Xiao, Rasul and Vollgraf 2017, "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine
Learning Algorithms", arXiv:1708.07747) is 70,000 28x28 grey images of 10 clothing classes in MNIST's IDX format.
Nothing is downloaded: the files come from ``apt-get install dataset-fashion-mnist`` (or any directory named by
``TRAINBENCH_FASHION_MNIST_DIR`` holding ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``).

The model is a ResNet (He et al. 2016, "Deep Residual Learning for Image Recognition", arXiv:1512.03385) cut down
to three stages of basic blocks with BatchNorm; the stages are ``model.blocks``. ``tiny`` trains on the first
6,000 training images and reports accuracy on the first 1,000 test images; ``small`` uses the full sets.
``resnet18`` is the GPU size (the ``gpu`` preset's): ResNet-18's four stages of two basic blocks (widths 64-512,
about 11M parameters) with a 3x3 stem of stride 1, as ResNet-18 is adapted to 32x32 CIFAR images, on the full sets
at batch 512.

Source task (``fashion_classes``, ``BuiltWorkload.source_task``: what transfer learning pretrains on): the images of
classes 0-4 (``SOURCE_CLASSES``) among the training images the size does not train on (index >= ``n_train``;
``tiny`` trains on the first 6000), normalised as the size's, never augmented (``cnn_aug`` keeps this task). ``small``
trains on all 60000, so its source is the classes 0-4 of its own training set and the task's record says
``overlaps_target: true``. The classes are a new label space: the head does not carry over.

Quality budgets and validation targets (``quality_steps`` at ``batch_size``; see docs/methodology.md): each target is
the less demanding of the median over seeds of the baseline's accuracy at the evaluation nearest 70% of the budget
and the worst seed's best evaluation, from ``scripts/calibrate_targets.py`` on the project's 2-core CPU machine.
BatchNorm's running statistics make the eval accuracy jump by several points between neighbouring evaluations
(seed 0: 0.758, 0.726, 0.654, 0.728 over the last four), so a run can cross the target and fall back; the first
crossing counts.

- ``tiny``: 150 steps, 10 evaluations; seeds 0-6 at step 105: 0.758, 0.720, 0.728, 0.757, 0.718, 0.705, 0.715
  (median 0.720); their best evaluations 0.728-0.782. Target 0.72.
- ``small``: 200 steps, 8 evaluations; seeds 0-4 at step 150: 0.783, 0.736, 0.829, 0.771, 0.816 (median 0.7825);
  their best evaluations 0.816-0.848. Target 0.782. (Each evaluation covers all 10,000 test images: on 2 CPU cores
  a seed took 4-7 minutes, most of it evaluation.)
- ``resnet18``: 470 steps (4 epochs of the 60,000 images at batch 512), 8 evaluations; no target yet: calibrating
  it needs a GPU (``scripts/calibrate_targets.py --workloads cnn:resnet18`` there). The budget is meant to take about
  a minute on an H200 in fp32; an estimate from FLOPs (docs/gpu.md) says less, but convolutions over 28x28 images
  run far below a GPU's matmul rate, so that estimate is a lower bound.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.data import cached_arrays, classifier_pipeline, digest
from bench.core.structure import Channels, Cut, ModelStructure, Scaling
from bench.workloads.base import (
    ACCURACY_MARGIN,
    BuiltWorkload,
    Size,
    SourceTask,
    Workload,
    WorkloadError,
    dataset_cache,
    register,
)
from bench.workloads.mlp_mnist1d import classification_metrics, shuffled_batches

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
ENV_VAR = "TRAINBENCH_FASHION_MNIST_DIR"
FILES = {
    "train_x": "train-images-idx3-ubyte.gz",
    "train_y": "train-labels-idx1-ubyte.gz",
    "test_x": "t10k-images-idx3-ubyte.gz",
    "test_y": "t10k-labels-idx1-ubyte.gz",
}
SOURCE_TASK = "fashion_classes"  # the source task the model's description declares (``ModelStructure.source_task``)
SOURCE_CLASSES = (0, 1, 2, 3, 4)  # the classes of the source task
_CODE_SHA = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # in the dataset cache's key: how it decodes


def data_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DIR)


def missing_reason(directory: Path) -> str | None:
    if all((directory / f).is_file() for f in FILES.values()):
        return None
    return (f"Fashion-MNIST not found in {directory}: install it with `apt-get install dataset-fashion-mnist` "
            f"(or set {ENV_VAR})")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip): big-endian header of magic (0, 0, dtype 0x08 = uint8, ndim) and ndim int32 sizes."""
    raw = gzip.decompress(path.read_bytes())
    if raw[:3] != b"\x00\x00\x08":
        raise WorkloadError(f"{path} is not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).copy()  # writable, for torch.from_numpy
    if data.size != int(np.prod(shape)):
        raise WorkloadError(f"{path}: header says {shape} but holds {data.size} bytes")
    return data.reshape(shape)


@lru_cache(maxsize=2)
def files_sha256(directory: Path) -> str:
    """The sha256 of the four files, in ``FILES``' order: the dataset's identity in records and cache keys."""
    reason = missing_reason(directory)
    if reason:
        raise WorkloadError(reason)
    sha = hashlib.sha256()
    for f in FILES.values():
        sha.update((directory / f).read_bytes())
    return sha.hexdigest()


@lru_cache(maxsize=2)
def load_fashion_mnist(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The four arrays (uint8 images (N, 28, 28), uint8 labels (N,)), and the files' sha256 and pixel mean/std."""
    sha = files_sha256(directory)
    arrays = {k: read_idx(directory / f) for k, f in FILES.items()}
    # Normalisation statistics of the full training set (for every size), from exact integer sums: 10x faster
    # than ndarray.std() on 47M bytes.
    train = arrays["train_x"]
    n = train.size
    mean = int(train.sum(dtype=np.int64)) / n
    std = math.sqrt(int(np.square(train, dtype=np.uint16).sum(dtype=np.int64)) / n - mean**2)
    mean, std = mean / 255, std / 255
    return arrays, {"sha256": sha, "mean": mean, "std": std}


@lru_cache(maxsize=4)
def fashion_subset(directory: Path, n_train: int, n_eval: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The first ``n_train`` training and ``n_eval`` test images and labels (uint8) and ``load_fashion_mnist``'s
    info, read from the sweep's dataset cache when a process of the sweep has decoded them (``cached_arrays``: the
    gzip'd files are read and hashed every time, for the key, but not decompressed)."""

    def decode() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, info = load_fashion_mnist(directory)
        cut = {"train_x": n_train, "train_y": n_train, "test_x": n_eval, "test_y": n_eval}
        return {k: np.ascontiguousarray(arrays[k][:n]) for k, n in cut.items()}, info

    key = digest(files_sha256(directory), n_train, n_eval, _CODE_SHA)
    return cached_arrays(dataset_cache(), "fashion-mnist", key, decode)


def fashion_source_task(arrays: dict[str, np.ndarray], n_train: int, mean: float, std: float) -> SourceTask:
    """The source task of a size training on the first ``n_train`` of the training images ``arrays`` (as
    ``load_fashion_mnist`` reads them), normalised by ``mean`` and ``std`` (module docstring)."""
    total = len(arrays["train_x"])
    first = n_train if n_train < total else 0  # a size training on every image leaves none unused: overlap
    labels = arrays["train_y"][first:]
    keep = np.flatnonzero(np.isin(labels, SOURCE_CLASSES)) + first
    x = ((torch.from_numpy(arrays["train_x"][keep]).float() / 255 - mean) / std).unsqueeze(1)
    y = torch.from_numpy(arrays["train_y"][keep].astype(np.int64))
    info = {"task": f"fashion-mnist training images of classes {SOURCE_CLASSES[0]}-{SOURCE_CLASSES[-1]}",
            "index_from": first, "images": len(keep), "first_index": int(keep[0]), "overlaps_target": first == 0}
    return SourceTask(SOURCE_TASK, (x, y), lambda batch_size, seed: shuffled_batches(x, y, batch_size, seed), info,
                      new_head=True)


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers with an identity (or 1x1 conv) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """Conv stem, one stage per width (stride 2 after the first), global average pool, linear head.

    ``stem_stride=2`` halves the resolution up front (28 -> 14): a quarter of the work, for the CPU-sized preset.
    """

    def __init__(self, widths: list[int], blocks_per_stage: int, stem_stride: int = 1, n_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, widths[0], 3, stem_stride, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        stages, c_in = [], widths[0]
        for i, c in enumerate(widths):
            layers = [BasicBlock(c_in if j == 0 else c, c, 2 if (i > 0 and j == 0) else 1) for j in range(blocks_per_stage)]
            stages.append(nn.Sequential(*layers))
            c_in = c
        self.blocks = nn.ModuleList(stages)
        self.head = nn.Linear(widths[-1], n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.blocks:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))

    def trainbench_structure(self) -> ModelStructure:
        return cnn_structure(len(self.blocks), len(self.blocks[0]))


def cnn_structure(stages: int, blocks_per_stage: int) -> ModelStructure:
    """The ResNet's parts: each BasicBlock's inner channels (``conv1`` filters, ``bn1``'s weight, bias and running
    statistics, ``conv2``'s input channels; scored by the conv1 filter) are a group of removable channels, the
    residual width is not; the stages are the blocks, ``head`` the classifier; a teacher scales every stage's
    ``widths`` and ``blocks_per_stage``."""
    channels = []
    for i in range(stages):
        for j in range(blocks_per_stage):
            b = f"blocks.{i}.{j}"
            score = (Cut(f"{b}.conv1.weight", 0), Cut(f"{b}.conv1.bias", 0))
            bn = tuple(Cut(f"{b}.bn1.{t}", 0) for t in ("weight", "bias", "running_mean", "running_var"))
            channels.append(Channels(b, score, (*score, *bn, Cut(f"{b}.conv2.weight", 1))))
    return ModelStructure(blocks="blocks", n_blocks=stages, head="head", channels=tuple(channels),
                          convolutional=True, calls_sdpa=False,
                          scaling=Scaling(width=("widths",), depth=("blocks_per_stage",)),
                          source_task=SOURCE_TASK, source="declared")


@dataclass(frozen=True)
class CnnSize(Size):
    """A ``cnn`` size: the ResNet's shape, the images it trains and is evaluated on, the batch and AdamW's LR, and
    the quality budget and target (docstring)."""

    widths: tuple[int, ...]  # channels of each stage
    blocks_per_stage: int
    stem_stride: int
    batch_size: int
    lr: float
    n_train: int  # the first training images trained on
    n_eval: int  # the first test images evaluated on
    target: float | None  # validation accuracy; None: not calibrated
    quality_steps: int
    eval_points: int


@register
class CNNFashion(Workload):
    name = "cnn"
    summary = "ResNet-style CNN with BatchNorm on Fashion-MNIST (Debian dataset-fashion-mnist), metric accuracy"
    has_batchnorm = True
    sizes = {
        "tiny": CnnSize(widths=(8, 16, 32), blocks_per_stage=1, stem_stride=2, batch_size=32, lr=2e-3, n_train=6000,
                        n_eval=1000, target=0.72, quality_steps=150, eval_points=10),
        "small": CnnSize(widths=(32, 64, 128), blocks_per_stage=2, stem_stride=1, batch_size=128, lr=1e-3,
                         n_train=60000, n_eval=10000, target=0.782, quality_steps=200, eval_points=8),
        "resnet18": CnnSize(widths=(64, 128, 256, 512), blocks_per_stage=2, stem_stride=1, batch_size=512, lr=1e-3,
                            n_train=60000, n_eval=10000, target=None, quality_steps=470, eval_points=8),
    }
    size_type: ClassVar[type[CnnSize]] = CnnSize  # what ``build_from`` checks its parameters against (cnn_aug: its own)

    def check(self) -> str | None:
        return missing_reason(data_dir())

    def load_data(self, size: str) -> None:
        p = self.size_params(size)
        fashion_subset(data_dir(), p["n_train"], p["n_eval"])

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        p = self.size_type.of(params).params()
        directory = data_dir()
        arrays, info = fashion_subset(directory, p["n_train"], p["n_eval"])
        mean, std = info["mean"], info["std"]

        def prepare(images: np.ndarray) -> torch.Tensor:
            return ((torch.from_numpy(images).float() / 255 - mean) / std).unsqueeze(1)  # (N, 1, 28, 28)

        x_train = prepare(arrays["train_x"][: p["n_train"]])
        y_train = torch.from_numpy(arrays["train_y"][: p["n_train"]].astype(np.int64))
        x_eval = prepare(arrays["test_x"][: p["n_eval"]])
        y_eval = torch.from_numpy(arrays["test_y"][: p["n_eval"]].astype(np.int64))

        torch.manual_seed(seed)
        model = ResNet(p["widths"], p["blocks_per_stage"], p["stem_stride"]).to(device)

        return BuiltWorkload(
            model=model,
            batches=lambda batch_size, bseed: shuffled_batches(x_train, y_train, batch_size, bseed),
            loss_fn=F.cross_entropy,
            evaluate=lambda m: classification_metrics(m, x_eval, y_eval, chunk=500),
            metric="accuracy",
            higher_is_better=True,
            batch_size=p["batch_size"],
            lr=p["lr"],
            target=p["target"],
            margin=ACCURACY_MARGIN,
            quality_steps=p["quality_steps"],
            eval_points=p["eval_points"],
            dataset={
                "name": "fashion-mnist",
                "source": f"{directory} (Debian package dataset-fashion-mnist; Xiao et al. 2017, arXiv:1708.07747)",
                "sha256": info["sha256"],
                "n_train": len(x_train),
                "n_eval": len(x_eval),
                "normalize_mean": mean,
                "normalize_std": std,
            },
            params=p,
            train_data=(x_train, y_train),
            pipeline=classifier_pipeline(x_train, y_train),  # the same batches as a Dataset, for ``loader``
            structure=self.structure_from(p),
            source_task=lambda: fashion_source_task(load_fashion_mnist(directory)[0], p["n_train"], mean, std),
        )

    def structure_from(self, params: dict[str, Any]) -> ModelStructure:
        return cnn_structure(len(params["widths"]), params["blocks_per_stage"])
