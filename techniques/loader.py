"""Loader: build the training batches in DataLoader worker processes, ahead of the step.

Method card
- What: the workload's Dataset behind a ``DataLoader`` with ``workers`` processes prefetching batches, so loading and
  augmentation overlap the step. Batches are bit-identical to the baseline's (the workload's key order, each
  sample's randomness seeded by its key): kind exact. ``pin_memory`` (CUDA only) makes the copy asynchronous.
- When it should pay: the step waits for data (``speed.data_wait_frac``: augmentation in ``cnn_aug``, slow storage)
  and cores are idle, as on a GPU host (not measured on a GPU). Where training threads fill the cores, the workers
  take them: the wait falls and the step slows.
- Refused with ``curriculum``, which draws its own batches.
- Sources: PyTorch docs, ``torch.utils.data``; PyTorch Performance Tuning Guide (async data loading).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-loader (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-bottleneck`: cnn:tiny loader:workers=1 0.74x [0.58, 0.96] inconclusive (the whole interval below 1, not clear of the threshold), memory 1.00x equivalent; cnn:tiny loader:workers=2 0.78x [0.63, 0.96] inconclusive (the whole interval below 1, not clear of the threshold), memory 1.00x equivalent; cnn_aug:tiny loader:workers=2 0.77x [0.70, 0.84] slower, memory 1.00x equivalent; cnn_aug:tiny loader:workers=1 0.76x [0.65, 0.89] slower, memory 1.00x equivalent; gpt:tiny loader:workers=1 0.85x [0.75, 0.95] inconclusive (the whole interval below 1, not clear of the threshold), memory 1.00x equivalent; gpt:tiny loader:workers=2 0.87x [0.72, 1.04] inconclusive, memory 1.00x equivalent.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=2, prefetch_factor=2,
                    persistent_workers=True, pin_memory=device == "cuda")  # batches built in 2 worker processes
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from techniques.base import Bottleneck, Context, Kind, Remedy, Technique, register


@register
class Loader(Technique):
    name = "loader"
    summary = "a DataLoader with worker processes builds the batches ahead of the step (bit-identical batches)"
    kind = Kind.EXACT
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    conflicts = frozenset({"curriculum"})
    remedies = (
        Remedy(Bottleneck.INPUT, say="loader:workers=2", why="a DataLoader with worker processes",
               again="raise loader:workers, or make the per-sample transform cheaper",
               refuted="worker processes did not pay here",
               refuted_why="on a machine with few cores they take the cores the step uses"),
        Remedy(Bottleneck.COPY, say="loader:pin_memory=true", device="cuda"),
    )

    @dataclass(frozen=True)
    class Options:
        workers: int = 2
        pin_memory: bool | None = None  # None: on for CUDA only
        prefetch_factor: int = 2
        persistent_workers: bool = True

        def __post_init__(self) -> None:
            if self.workers < 0:
                raise ValueError(f"workers must be >= 0, got {self.workers}")
            if self.prefetch_factor < 1:
                raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._loader: Any = None

    def check(self, ctx: Context) -> str | None:
        if self.options.pin_memory and not ctx.is_cuda:
            return ("pin_memory=true pins batches for faster host-to-CUDA copies; on a CPU device there is no "
                    "copy to speed up (torch ignores it with a warning): leave pin_memory unset")
        return None

    def batches(self, pipeline: Any, batch_size: int, seed: int, ctx: Context) -> Iterator[Any]:
        if pipeline is None:
            raise ValueError(f"workload {ctx.workload or '(unnamed)'} has no Dataset pipeline; loader needs "
                             "BuiltWorkload.pipeline (a bench.core.data.Pipeline: the training set as a map-style "
                             "Dataset and its key order) to load batches in worker processes")
        reason = self.check(ctx)
        if reason:
            raise ValueError(f"loader: {reason}")
        o = self.options
        pin = ctx.is_cuda if o.pin_memory is None else o.pin_memory
        self._loader = pipeline.loader(batch_size, seed, num_workers=o.workers, pin_memory=pin,
                                       prefetch_factor=o.prefetch_factor, persistent_workers=o.persistent_workers)
        return self._loader

    def finalize(self, model: Any, ctx: Context) -> None:
        self.close()

    def close(self) -> None:
        """End the worker processes now (the trial has finished training)."""
        if self._loader is not None:
            self._loader.close()
            self._loader = None
