"""The ``cnn`` workload with a CPU-heavy per-sample augmentation: where the input pipeline is the bottleneck.

Same model, data, sizes and evaluation as ``cnn`` (``cnn_fashion``: a small ResNet on Fashion-MNIST, evaluated on
un-augmented test images); only the training batches differ. Each training image is augmented on its own, as a
torchvision ``transforms.Compose`` in a Dataset's ``__getitem__`` would, in this order:

1. random crop with padding: pad 2 pixels of black on every side, crop 28x28 at a random offset (the CIFAR/ResNet
   recipe of He et al. 2016, "Deep Residual Learning for Image Recognition", arXiv:1512.03385, section 4.2, there
   with 4 pixels on 32x32);
2. horizontal flip with probability 0.5 (clothes stay clothes when mirrored);
3. a small elastic distortion (Simard, Steinkraus and Platt 2003, "Best Practices for Convolutional Neural Networks
   Applied to Visual Document Analysis", ICDAR): a displacement field of uniform noise in [-1, 1] per pixel and
   direction, smoothed by a Gaussian of ``elastic_sigma`` pixels (a dense 2-D kernel truncated at 4 sigma, after
   reflect padding), scaled by ``elastic_alpha`` pixels and applied with bilinear ``F.grid_sample``. Simard used
   sigma 4 and alpha 34 on MNIST; sigma 2.5 and alpha 10 here move a pixel by about 0.74 pixels (standard
   deviation per direction), a mild distortion for clothing. The blur is most of the cost: a 21x21 kernel per
   direction and image, 0.65-0.8 ms of one core per image; sigma 4 (a 33x33 kernel) cost about 1.5 times as much,
   which would push the data wait past the 30-60% of a tiny step this workload aims at.

Every random draw of a sample comes from a generator seeded by its key (``bench.core.data.sample_seed`` of the trial
seed and the sample's position in the stream), so the batches are the same in this process and in any number of
DataLoader workers: the ``loader`` technique is exact here. ``batches`` (the baseline) runs the pipeline in the
training process, one sample after the other, as a naive training script does; the augmentation then takes a large
share of each step on this 2-core CPU: at ``tiny``, 59% of the speed window waited for data (31.6 ms median step)
against 0.9% for ``cnn`` (14.9 ms); ``techniques/loader.py`` has the numbers with workers.

``train_data`` is None: techniques that draw their own samples from the in-memory set (curriculum) would skip the
augmentation.

Quality budgets and validation targets (``quality_steps`` at ``batch_size``, as ``cnn``; see docs/methodology.md): each
target is the less demanding of the median over seeds of the baseline's accuracy at the evaluation nearest 70% of
the budget and the worst seed's best evaluation, from ``scripts/calibrate_targets.py`` on the project's 2-core CPU
machine. The augmented set is harder than ``cnn``'s within the same budget (0.596 against 0.72), and BatchNorm makes
neighbouring evaluations jump here too.

- ``tiny``: 150 steps, 10 evaluations; seeds 0-4 at step 105: 0.607, 0.639, 0.555, 0.596, 0.569 (median 0.596);
  their best evaluations 0.639-0.695. Target 0.596.
- ``small``: not calibrated: ``cnn``'s small took 4-7 minutes a seed on 2 CPU cores, mostly evaluation, and the
  in-process augmentation of 128-image batches adds several more; no target until it is calibrated (run
  ``scripts/calibrate_targets.py --workloads cnn_aug:small``), so its time-to-target is not measured.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bench.core.data import classifier_pipeline
from bench.workloads.base import BuiltWorkload, register
from bench.workloads.cnn_fashion import CNNFashion, CnnSize

AUGMENT = {"crop_pad": 2, "flip_p": 0.5, "elastic_alpha": 10.0, "elastic_sigma": 2.5}


class Augment:
    """Random crop with padding, horizontal flip and elastic distortion of one normalised (1, H, W) image, every
    draw from the generator it is given (module level and plain attributes: DataLoader workers pickle it)."""

    def __init__(self, height: int, width: int, background: float, crop_pad: int, flip_p: float,
                 elastic_alpha: float, elastic_sigma: float) -> None:
        self.background, self.crop_pad, self.flip_p, self.alpha = background, crop_pad, flip_p, elastic_alpha
        radius = int(4 * elastic_sigma)
        if radius >= min(height, width):
            raise ValueError(f"elastic_sigma {elastic_sigma} is too large for {height}x{width} images")
        g = torch.exp(-0.5 * (torch.arange(-radius, radius + 1, dtype=torch.float32) / elastic_sigma) ** 2)
        self.radius = radius
        self.kernel = (g[:, None] * g[None, :] / g.sum() ** 2)[None, None]  # (1, 1, k, k), sums to 1
        # The identity sampling grid (align_corners=False: pixel centres at (2i + 1) / n - 1) and the size of one
        # pixel in grid units, per direction (x first, as grid_sample wants).
        ys = (2 * torch.arange(height, dtype=torch.float32) + 1) / height - 1
        xs = (2 * torch.arange(width, dtype=torch.float32) + 1) / width - 1
        self.grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # (H, W, 2)
        self.pixel = torch.tensor([2.0 / width, 2.0 / height])

    def __call__(self, img: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        _, h, w = img.shape
        p = self.crop_pad
        padded = F.pad(img, (p, p, p, p), value=self.background)
        top, left = torch.randint(0, 2 * p + 1, (2,), generator=gen).tolist()
        img = padded[:, top : top + h, left : left + w]
        if float(torch.rand((), generator=gen)) < self.flip_p:
            img = img.flip(-1)
        noise = torch.rand(2, 1, h, w, generator=gen) * 2 - 1  # (dx, dy) per pixel
        r = self.radius
        field = F.conv2d(F.pad(noise, (r, r, r, r), mode="reflect"), self.kernel)[:, 0]  # (2, H, W)
        grid = self.grid + field.permute(1, 2, 0) * self.alpha * self.pixel
        return F.grid_sample(img[None], grid[None], mode="bilinear", padding_mode="border", align_corners=False)[0]


@dataclass(frozen=True)
class CnnAugSize(CnnSize):
    """A ``cnn_aug`` size: ``cnn``'s, and the augmentation's settings (``AUGMENT``, the module docstring)."""

    may_be_zero = ("crop_pad", "flip_p", "elastic_alpha")

    crop_pad: int  # pixels of padding before the random crop
    flip_p: float  # probability of a horizontal flip
    elastic_alpha: float  # the elastic displacement's scale, in pixels
    elastic_sigma: float  # the Gaussian's standard deviation that smooths the displacement, in pixels

    def problem(self) -> str | None:
        return f"flip_p must be a probability (0 to 1), got {self.flip_p}" if self.flip_p > 1 else None


@register
class CNNAugFashion(CNNFashion):
    name = "cnn_aug"
    summary = ("cnn with per-sample crop, flip and elastic distortion computed on the CPU (an input-bound "
               "workload), metric accuracy")
    sizes = {
        "tiny": CnnAugSize(**{**CNNFashion.sizes["tiny"].params(), **AUGMENT, "target": 0.596}),
        "small": CnnAugSize(**{**CNNFashion.sizes["small"].params(), **AUGMENT, "target": None}),
    }
    size_type = CnnAugSize

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        built = super().build_from(params, seed, device)  # model, data, evaluation and budget of ``cnn`` (checked)
        x_train, y_train = built.train_data
        p: dict[str, Any] = built.params
        mean, std = built.dataset["normalize_mean"], built.dataset["normalize_std"]
        augment = Augment(x_train.shape[-2], x_train.shape[-1], background=(0.0 - mean) / std,
                          **{k: p[k] for k in AUGMENT})
        pipeline = classifier_pipeline(x_train, y_train, augment)
        return dataclasses.replace(
            built,
            batches=pipeline.batches,
            pipeline=pipeline,
            train_data=None,
            dataset={**built.dataset, "augmentation": "per sample, seeded by its key: crop (pad {crop_pad}), "
                     "horizontal flip (p {flip_p}), elastic (alpha {elastic_alpha}, sigma {elastic_sigma}; Simard "
                     "et al. 2003)".format(**p)},
        )
