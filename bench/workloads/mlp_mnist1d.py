"""MLP on MNIST-1D: a procedural, CPU-sized classification benchmark generated locally.

MNIST-1D (Greydanus 2020, "Scaling down deep learning", arXiv:2011.14439, https://github.com/greydanus/mnist1d)
turns ten hand-drawn 1-D templates of the digits 0-9 into samples by padding, dilating, scaling, translating,
adding correlated and white noise, shearing and resampling to 40 points. It separates linear models, MLPs, CNNs
and RNNs much better than MNIST does, yet generates in milliseconds. ``make_mnist1d`` follows the reference
``transform`` step by step (same templates and default arguments), vectorised with numpy; it draws its random
numbers differently, so the samples are statistically alike but not bit-identical to the published pickle.

The dataset seed is fixed (``DATASET_SEED``), so every trial sees the same data; the trial seed sets the model's
initialisation and the batch order. The model is a plain MLP whose hidden blocks (Linear + ReLU) are
``model.blocks``; ``large`` (about 50M parameters) exists for the distributed techniques.

Quality budgets and validation targets (``quality_steps`` at ``batch_size``; see docs/methodology.md): each target is
the less demanding of the median over seeds of the baseline's accuracy at the evaluation nearest 70% of the budget
and the worst seed's best evaluation, from ``scripts/calibrate_targets.py`` on the project's 2-core CPU machine.

- ``tiny``: 150 steps, 10 evaluations; seeds 0-6 at step 105: 0.423, 0.436, 0.423, 0.416, 0.442, 0.411, 0.378
  (median 0.423); their best evaluations 0.447-0.493. Target 0.423.
- ``small``: 600 steps, 12 evaluations; seeds 0-4 at step 400: 0.695, 0.698, 0.688, 0.674, 0.706 (median 0.695);
  their best evaluations 0.701-0.712. Target 0.695.
- ``large``: 60 steps, 6 evaluations; seeds 0-4 at step 40: 0.453, 0.407, 0.449, 0.440, 0.471 (median 0.449);
  their best evaluations 0.499-0.523. Target 0.449.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.core.data import cached_arrays, classifier_pipeline, digest
from bench.core.structure import Channels, Cut, ModelStructure, Scaling
from bench.workloads.base import (
    ACCURACY_MARGIN,
    Batch,
    BuiltWorkload,
    Size,
    Workload,
    dataset_cache,
    register,
)

DATASET_SEED = 0
_CODE_SHA = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # in the dataset cache's key: how it generates
N_TRAIN, N_EVAL = 4000, 1000
SEQ_LEN, N_CLASSES = 40, 10

# The reference generator's templates and defaults (mnist1d ``get_templates`` / ``get_dataset_args``).
_TEMPLATES = np.array([
    [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
    [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
    [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
    [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
    [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
    [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
    [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
    [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
    [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
])
_PADDING = (36, 60)
_SCALE_COEFF, _MAX_TRANSLATION = 0.4, 48
_CORR_NOISE, _IID_NOISE, _SHEAR = 0.25, 2e-2, 0.75


def _templates() -> np.ndarray:
    x = _TEMPLATES - _TEMPLATES.mean(1, keepdims=True)
    x /= x.std(1, keepdims=True)
    x -= x[:, :1]  # each signal starts and ends at 0
    return x / 6.0


def _resample(x: np.ndarray, lengths: np.ndarray, n_out: int) -> np.ndarray:
    """Linear interpolation of row i's first ``lengths[i]`` points onto ``n_out`` evenly spaced points."""
    pos = np.linspace(0.0, 1.0, n_out)[None, :] * (lengths[:, None] - 1)
    lo = np.minimum(np.floor(pos).astype(np.int64), lengths[:, None] - 2)
    frac = pos - lo
    rows = np.arange(len(x))[:, None]
    return x[rows, lo] * (1 - frac) + x[rows, lo + 1] * frac


def _gaussian_filter(x: np.ndarray, sigma: float) -> np.ndarray:
    """``scipy.ndimage.gaussian_filter1d(x, sigma, axis=1)`` (mode 'reflect', truncate 4) in numpy."""
    radius = int(4.0 * sigma + 0.5)
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    padded = np.pad(x, ((0, 0), (radius, radius)), mode="symmetric")
    return np.lib.stride_tricks.sliding_window_view(padded, 2 * radius + 1, axis=1) @ (k / k.sum())


def make_mnist1d(n: int = N_TRAIN + N_EVAL, seed: int = DATASET_SEED) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MNIST-1D samples: (x float32 (n, 40), standardised over the set; y int64 (n,), classes balanced)."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % N_CLASSES)
    tmpl = _templates()
    t_len = tmpl.shape[1]
    width = t_len + _PADDING[1]  # the dilated length

    # pad with zeros, then dilate the padded signal to a common length (eps keeps the template nonzero)
    pads = rng.integers(_PADDING[0], _PADDING[1] + 1, size=n)
    padded = np.zeros((n, width + 1))
    padded[:, :t_len] = tmpl[y] + 1e-8
    x = _resample(padded, t_len + pads, width)
    x *= 1 + _SCALE_COEFF * (rng.random((n, 1)) - 0.5)
    shift = rng.integers(0, _MAX_TRANSLATION, size=n)
    x = x[np.arange(n)[:, None], (np.arange(width)[None, :] - shift[:, None]) % width]  # np.roll per row

    # correlated noise where the signal is absent, white noise everywhere, then a random linear shear
    corr = _gaussian_filter(_CORR_NOISE * rng.standard_normal((n, width)), 2.0)
    x = np.where(x != 0, x, corr)
    x = x + _IID_NOISE * rng.standard_normal((n, width))
    x = x - _SHEAR * (rng.random((n, 1)) - 0.5) * np.linspace(-0.5, 0.5, width)[None, :]
    x = _resample(x, np.full(n, width), SEQ_LEN)

    x = (x - x.mean()) / x.std()
    return x.astype(np.float32), y.astype(np.int64)


@lru_cache(maxsize=2)
def _dataset(seed: int = DATASET_SEED) -> tuple[np.ndarray, np.ndarray, str]:
    """The generated set and its sha256, read from the sweep's dataset cache when a process of the sweep has
    generated it (``cached_arrays``: keyed by the seed, the size and this module's code)."""

    def generate() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        x, y = make_mnist1d(N_TRAIN + N_EVAL, seed)
        return {"x": x, "y": y}, {"sha256": hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()}

    key = digest(seed, N_TRAIN + N_EVAL, _CODE_SHA)
    arrays, meta = cached_arrays(dataset_cache(), "mnist1d", key, generate)
    return arrays["x"], arrays["y"], meta["sha256"]


class Block(nn.Module):
    """One hidden layer: Linear then ReLU."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class MLP(nn.Module):
    """``depth`` hidden blocks of ``width`` units and a linear classifier head."""

    def __init__(self, d_in: int, width: int, depth: int, n_classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d_in if i == 0 else width, width) for i in range(depth))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def trainbench_structure(self) -> ModelStructure:
        return mlp_structure(len(self.blocks))


def mlp_structure(depth: int) -> ModelStructure:
    """The MLP's parts: each hidden block's units (its ``fc`` rows and bias, and the input columns of the next
    block's ``fc`` or of the head) are a group of removable channels; a teacher scales ``width`` and ``depth``."""
    consumers = [f"blocks.{i + 1}.fc" for i in range(depth - 1)] + ["head"]
    channels = tuple(
        Channels(f"blocks.{i}", (Cut(f"blocks.{i}.fc.weight", 0), Cut(f"blocks.{i}.fc.bias", 0)),
                 (Cut(f"blocks.{i}.fc.weight", 0), Cut(f"blocks.{i}.fc.bias", 0), Cut(f"{nxt}.weight", 1)))
        for i, nxt in enumerate(consumers))
    return ModelStructure(blocks="blocks", n_blocks=depth, head="head", channels=channels, convolutional=False,
                          calls_sdpa=False, scaling=Scaling(width=("width",), depth=("depth",)), source="declared")


def shuffled_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int) -> Iterator[Batch]:
    """Endless epochs over (x, y) in an order drawn from ``seed``; the last partial batch of an epoch is dropped."""
    if not 0 < batch_size <= len(x):
        raise ValueError(f"batch_size must be in 1..{len(x)} (the training set size), got {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x) - batch_size + 1, batch_size):
            idx = perm[i : i + batch_size]
            yield x[idx], y[idx]


def classification_metrics(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on (x, y), ``chunk`` samples at a time, on the model's device."""
    device = next(model.parameters()).device
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        out = model(x[i : i + chunk].to(device)).float()
        target = y[i : i + chunk].to(device)
        correct += int((out.argmax(-1) == target).sum())
        loss += float(F.cross_entropy(out, target, reduction="sum"))
    return {"accuracy": correct / len(x), "val_loss": loss / len(x)}


@dataclass(frozen=True)
class MlpSize(Size):
    """An ``mlp`` size: the MLP's shape, the batch and AdamW's LR, and the quality budget and target (docstring)."""

    width: int  # hidden units of every block
    depth: int  # hidden blocks
    batch_size: int
    lr: float
    target: float | None  # validation accuracy; None: not calibrated
    quality_steps: int
    eval_points: int


@register
class MLPMnist1D(Workload):
    name = "mlp"
    summary = "MLP on MNIST-1D (procedural, Greydanus 2020), metric accuracy"
    sizes = {
        "tiny": MlpSize(width=256, depth=3, batch_size=64, lr=2e-3, target=0.423, quality_steps=150, eval_points=10),
        "small": MlpSize(width=1024, depth=4, batch_size=256, lr=1e-3, target=0.695, quality_steps=600,
                         eval_points=12),
        "large": MlpSize(width=4096, depth=4, batch_size=256, lr=3e-4, target=0.449, quality_steps=60, eval_points=6),
    }

    def load_data(self, size: str) -> None:
        _dataset()

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        p = MlpSize.of(params).params()
        x_np, y_np, sha = _dataset()
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
        x_train, y_train, x_eval, y_eval = x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]

        torch.manual_seed(seed)
        model = MLP(SEQ_LEN, p["width"], p["depth"], N_CLASSES).to(device)

        return BuiltWorkload(
            model=model,
            batches=lambda batch_size, bseed: shuffled_batches(x_train, y_train, batch_size, bseed),
            loss_fn=F.cross_entropy,
            evaluate=lambda m: classification_metrics(m, x_eval, y_eval, chunk=N_EVAL),
            metric="accuracy",
            higher_is_better=True,
            batch_size=p["batch_size"],
            lr=p["lr"],
            target=p["target"],
            margin=ACCURACY_MARGIN,
            quality_steps=p["quality_steps"],
            eval_points=p["eval_points"],
            dataset={
                "name": "mnist1d",
                "source": f"generated: make_mnist1d(seed={DATASET_SEED}) after Greydanus 2020, arXiv:2011.14439",
                "sha256": sha,
                "n_train": N_TRAIN,
                "n_eval": N_EVAL,
            },
            params=p,
            train_data=(x_train, y_train),
            pipeline=classifier_pipeline(x_train, y_train),  # the same batches as a Dataset, for ``loader``
            structure=self.structure_from(p),
        )

    def structure_from(self, params: dict[str, Any]) -> ModelStructure:
        return mlp_structure(params["depth"])
