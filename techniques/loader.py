"""Loader: build the training batches in DataLoader worker processes, ahead of the step that needs them.

Method card
- What: the workload's training set as a map-style Dataset (``BuiltWorkload.pipeline``, a ``bench.core.data.Pipeline``)
  behind a ``torch.utils.data.DataLoader`` with ``workers`` processes, each keeping ``prefetch_factor`` batches in
  flight, so loading and augmenting batch k+1.. overlaps the forward and backward of batch k. ``pin_memory``
  (default: on for CUDA only) copies each batch into page-locked memory in a thread, so the host-to-device copy can
  be asynchronous (the loop's ``.to(device, non_blocking=True)``). The DataLoader's batch sampler is the workload's
  own key order and every random draw of a sample is seeded by its key, so the batches are bit-identical to the
  baseline's in-process ones: kind ``exact``, the parity check holds it to the baseline's losses.
- When it helps: when the step waits for data (``speed.data_wait_frac`` well above 0): CPU-side decoding or
  augmentation per sample (``cnn_aug``), slow storage. It does nothing for in-memory tensors gathered with one
  index (``mlp``, ``cnn``, ``gpt``: their data wait is already near 0); there the workers' inter-process copies and
  start-up are pure cost. Workers need free cores: on a GPU host the model runs on the device and the CPU cores are
  idle, the usual setting; on a 2-core CPU host they compete with the training step's own threads, so the wait
  falls but the step slows (measured below).
- Workers and the trial: the key order is endless, so one DataLoader iterator serves the whole trial and
  ``persistent_workers`` only matters if the loader is iterated again. ``finalize`` ends the workers; on any other
  way out they are daemonic processes that watch their parent and end with it. Under DDP every rank loads the
  global batch and keeps its shard, as with the workload's own batches.
- On CPU: ``pin_memory=true`` is refused (pinned memory only speeds host-to-CUDA copies; torch warns and ignores it
  without an accelerator). Workers run with one intra-op thread each (torch sets it).
- Measured (``reports/example-cpu-bottleneck/``, AMD EPYC (AVX2 only), 5 repeats, paired 95% t intervals): on a
  2-core host the workers take the cores the step's two threads used, so the technique moves the augmentation's
  cost instead of hiding it; it pays where cores are idle (a GPU host). cnn_aug:tiny
  ``workers=2`` 0.77x [0.70, 0.84] and ``workers=1`` 0.76x [0.65, 0.89] of the baseline's samples/s, both slower,
  the data wait down from 59% to 11-13% of the step; on cnn:tiny and gpt:tiny (data wait about 1%) inconclusive:
  cnn 0.74x [0.58, 0.96] and 0.78x [0.63, 0.96] (whole intervals below 1, not clear of 5%), gpt 0.85x [0.75, 0.95]
  and 0.87x [0.72, 1.04]. Eval curves identical to the baseline's at every evaluation (exact), peak memory 1.00x
  (equivalent).
- Conflicts: ``curriculum`` draws its own batches from the in-memory training set.
- Sources: PyTorch docs, ``torch.utils.data`` ("Single- and Multi-process Data Loading", "Memory Pinning");
  PyTorch Performance Tuning Guide (Szymon Migacz), "Enable async data loading and augmentation"; PyTorch docs,
  ``torch.utils.data.DataLoader`` (``num_workers``, ``prefetch_factor``, ``persistent_workers``, ``pin_memory``).

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
