"""Input pipelines: a workload's training set as a map-style Dataset plus the key order its batches follow.

A ``Pipeline`` gives the same batches two ways:

- ``batches(batch_size, seed)``: in this process, one batch after the other (what the baseline runs);
- ``loader(batch_size, seed, num_workers, ...)``: through a ``torch.utils.data.DataLoader`` whose ``batch_sampler``
  is the same key order, so worker processes build batches ahead of the training step (the ``loader`` technique).

Both paths fetch a batch with the code torch's own fetcher runs (``dataset.__getitems__(keys)`` when the Dataset
has it, else ``[dataset[k] for k in keys]``), then the pipeline's ``collate``; so the batches are bit-identical
whatever the number of workers, as long as the Dataset is a pure function of the key. Hence the rule for
augmentation: a sample's random draws come from a generator seeded by its key (``sample_seed(seed, position)``,
position = the sample's place in the stream of training samples), never from the global RNG or a worker's state.

The key orders reproduce the workloads' own fast paths draw for draw: ``classifier_order`` is
``mlp_mnist1d.shuffled_batches``'s epochs, ``window_order`` is ``gpt_chars.window_batches``'s random windows, and
``dataloader_order`` is what ``DataLoader(shuffle=True, drop_last=True, generator=...)`` draws (a user's Dataset).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]
Key = tuple[int, int]  # a classifier's sample: (index into the training set, seed of its augmentation draws)
Transform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # (one input, its own generator) -> input

_MASK64 = (1 << 64) - 1


def sample_seed(seed: int, position: int) -> int:
    """A 63-bit seed for the sample at ``position`` of the stream drawn from ``seed`` (splitmix64's finaliser:
    neighbouring positions get unrelated seeds, and no two streams share a prefix)."""
    z = (seed * 0xD1B54A32D192ED03 + position * 0x9E3779B97F4A7C15 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def identity(data: Any) -> Any:
    """The collate of Datasets whose ``__getitems__`` returns the whole batch (module level: workers pickle it)."""
    return data


def collate_pairs(items: Any) -> Batch:
    """torch's default collation of (input, target) items, as a tuple (what a user's DataLoader gives)."""
    return tuple(default_collate(items))  # type: ignore[return-value]


def fetch(dataset: Any, keys: Sequence[Any]) -> Any:
    """What torch's map-style fetcher does before collating (``torch.utils.data._utils.fetch``), so the in-process
    path runs the same code as a DataLoader worker."""
    if hasattr(dataset, "__getitems__") and dataset.__getitems__:
        return dataset.__getitems__(keys)
    return [dataset[k] for k in keys]


class KeyOrder:
    """The ``batch_sampler`` of a pipeline's DataLoader: each ``iter`` starts the key order afresh."""

    def __init__(self, keys: Callable[[int, int], Iterator[list[Any]]], batch_size: int, seed: int) -> None:
        self.keys, self.batch_size, self.seed = keys, batch_size, seed

    def __iter__(self) -> Iterator[list[Any]]:
        return self.keys(self.batch_size, self.seed)


class BatchLoader(Iterator[Batch]):
    """An endless iterator over a DataLoader's batches that can be closed: ``close`` ends the worker processes now.

    DataLoader has no public close: its iterator ends the workers when garbage-collected, and with
    ``persistent_workers`` the DataLoader itself keeps that iterator. ``close`` drops both and calls the shutdown
    torch's own ``__del__`` calls. Workers are daemonic and watch their parent, so they also end with the process.
    """

    def __init__(self, dataloader: DataLoader) -> None:
        self.dataloader = dataloader
        self._it: Iterator[Batch] | None = iter(dataloader)

    def __next__(self) -> Batch:
        if self._it is None:
            raise StopIteration
        return next(self._it)

    def close(self) -> None:
        it, self._it = self._it, None
        self.dataloader._iterator = None  # the persistent-workers reference
        shutdown = getattr(it, "_shutdown_workers", None)  # absent for num_workers=0
        if shutdown is not None:
            shutdown()

    @property
    def workers(self) -> list[Any]:
        """The live worker processes (empty without workers or once closed)."""
        return [w for w in getattr(self._it, "_workers", []) if w.is_alive()]


@dataclass(frozen=True)
class Pipeline:
    """A training set as a map-style Dataset (one sample per key) and the endless key order batches follow."""

    dataset: Dataset
    keys: Callable[[int, int], Iterator[list[Any]]]  # (batch_size, seed) -> endless iterator of each batch's keys
    collate: Callable[[Any], Batch] = identity  # what turns ``fetch``'s result into an (inputs, targets) batch

    def batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
        """The batches in this process, one at a time: the reference semantics."""
        for keys in self.keys(batch_size, seed):
            yield self.collate(fetch(self.dataset, keys))

    def loader(self, batch_size: int, seed: int, num_workers: int = 0, pin_memory: bool = False,
               prefetch_factor: int = 2, persistent_workers: bool = False) -> BatchLoader:
        """The same batches through a DataLoader with ``num_workers`` processes (0: in this process)."""
        dataloader = DataLoader(
            self.dataset, batch_sampler=KeyOrder(self.keys, batch_size, seed), collate_fn=self.collate,
            num_workers=num_workers, pin_memory=pin_memory,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            # Each DataLoader iterator draws a base seed for its workers; from the global RNG unless given a
            # generator, which would make the loader's trial consume global random numbers the baseline does not.
            generator=torch.Generator().manual_seed(seed),
        )
        return BatchLoader(dataloader)


# ---- in-memory tensors: a classifier's (inputs, targets) --------------------------------------------------------


class TensorPairs(Dataset):
    """(inputs, targets) tensors keyed by ``(index, sample seed)``; ``transform`` (if any) augments one input with
    a generator seeded by the key. Without a transform a batch is gathered with one tensor index."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform: Transform | None = None) -> None:
        if len(x) != len(y):
            raise ValueError(f"inputs and targets differ in length ({len(x)} and {len(y)})")
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, key: Key) -> Batch:
        index, seed = key
        x = self.x[index]
        if self.transform is not None:
            x = self.transform(x, torch.Generator().manual_seed(seed))
        return x, self.y[index]

    def __getitems__(self, keys: Sequence[Key]) -> Batch:
        idx = torch.tensor([k[0] for k in keys], dtype=torch.long)
        if self.transform is None:
            return self.x[idx], self.y[idx]
        return torch.stack([self[k][0] for k in keys]), self.y[idx]


def classifier_order(n: int, batch_size: int, seed: int) -> Iterator[list[Key]]:
    """Endless epochs over ``n`` samples, each a ``torch.randperm`` drawn from ``seed`` with the last partial batch
    dropped: ``shuffled_batches``'s order, as keys carrying each sample's augmentation seed."""
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in 1..{n} (the training set size), got {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    position = 0
    while True:
        perm = torch.randperm(n, generator=gen).tolist()
        for i in range(0, n - batch_size + 1, batch_size):
            yield [(index, sample_seed(seed, position + j)) for j, index in enumerate(perm[i : i + batch_size])]
            position += batch_size


def classifier_pipeline(x: torch.Tensor, y: torch.Tensor, transform: Transform | None = None) -> Pipeline:
    """A classifier's in-memory training set in ``shuffled_batches``'s order (augmented by ``transform``)."""
    return Pipeline(TensorPairs(x, y, transform), functools.partial(classifier_order, len(x)))


# ---- a token stream: a language model's random windows -----------------------------------------------------------


class Windows(Dataset):
    """Windows of ``seq_len + 1`` tokens of ``data`` keyed by their start: (inputs, next-token targets)."""

    def __init__(self, data: torch.Tensor, seq_len: int) -> None:
        self.data, self.seq_len = data, seq_len
        self.offsets = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        return len(self.data) - self.seq_len

    def __getitem__(self, start: int) -> Batch:
        window = self.data[start : start + self.seq_len + 1]
        return window[:-1], window[1:]

    def __getitems__(self, starts: Sequence[int]) -> Batch:
        windows = self.data[torch.tensor(starts, dtype=torch.long)[:, None] + self.offsets]
        return windows[:, :-1], windows[:, 1:]


def window_order(n_starts: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless batches of window starts in ``[0, n_starts)``, drawn from ``seed`` as ``window_batches`` draws them."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randint(n_starts, (batch_size,), generator=gen).tolist()


def window_pipeline(data: torch.Tensor, seq_len: int) -> Pipeline:
    """A token stream's random training windows in ``window_batches``'s order."""
    return Pipeline(Windows(data, seq_len), functools.partial(window_order, len(data) - seq_len))


# ---- a user's map-style Dataset ----------------------------------------------------------------------------------


def dataloader_order(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """The indices ``DataLoader(dataset, batch_size, shuffle=True, drop_last=True, generator=Generator().
    manual_seed(seed))`` yields, epoch after epoch (re-iterated), draw for draw: each epoch's iterator first draws
    its workers' base seed from the generator, then RandomSampler draws a permutation, and one more for the empty
    remainder of its ``num_samples`` when the epoch runs out."""
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size {batch_size} is larger than the Dataset ({n} items)")
    gen = torch.Generator().manual_seed(seed)
    while True:
        torch.empty((), dtype=torch.int64).random_(generator=gen)
        perm = torch.randperm(n, generator=gen).tolist()
        for i in range(0, n - batch_size + 1, batch_size):
            yield perm[i : i + batch_size]
        torch.randperm(n, generator=gen)


def dataset_pipeline(dataset: Dataset) -> Pipeline:
    """A user's map-style Dataset of (input, target) items, in a shuffling DataLoader's order, default-collated."""
    return Pipeline(dataset, functools.partial(dataloader_order, len(dataset)), collate=collate_pairs)


# ---- decoded datasets, once per sweep ----------------------------------------------------------------------------

CACHE_FORMAT = 1  # the cache file's layout: a file of another format is rebuilt
CACHE_EVENTS: dict[str, str] = {}  # dataset name -> "read" (from the cache) or "decoded", in this process


def digest(*parts: Any) -> str:
    """A cache key: the sha256 of ``parts`` (bytes as they are, anything else as JSON)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


def cached_arrays(directory: Path | None, name: str, key: str,
                  build: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]]
                  ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``build()``'s arrays and JSON meta, read from ``directory`` when a process of the sweep already built them
    under ``key``, else built here and saved there (whole or not at all) for the next.

    ``key`` must change whenever the result would: the dataset's own hash, the parameters it is cut with, and the
    code that decodes it. A file that does not read back exactly (truncated or corrupt: zip's CRC check; another key
    or format in its header) is rebuilt and replaced, never used. Without a directory (a trial outside a sweep) the
    arrays are built in this process. ``CACHE_EVENTS`` says which happened."""
    path = directory / f"{name}-{key[:32]}.npz" if directory is not None else None
    found = _read_cached(path, key) if path is not None and path.is_file() else None
    if found is not None:
        CACHE_EVENTS[name] = "read"
        return found
    arrays, meta = build()
    CACHE_EVENTS[name] = "decoded"
    if path is not None:
        _write_cached(path, key, arrays, meta)
    return arrays, meta


def _read_cached(path: Path, key: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    try:
        with np.load(path, allow_pickle=False) as npz:
            header = json.loads(bytes(npz["__header__"]).decode())
            if header.get("key") != key or header.get("format") != CACHE_FORMAT:
                raise ValueError(f"it holds key {str(header.get('key'))[:12]}, format {header.get('format')}")
            arrays = {k: npz[k] for k in header["arrays"]}  # each member read whole: zip checks its CRC
        return arrays, header["meta"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("the dataset cache %s is unusable (%s): decoding the dataset again", path, exc)
        return None


def _write_cached(path: Path, key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    header = {"key": key, "format": CACHE_FORMAT, "arrays": sorted(arrays), "meta": meta}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:  # uncompressed: reading it back must cost far less than decoding
            np.savez(fh, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
        os.replace(tmp, path)  # whole or not at all: another process may be reading it
    except OSError as exc:  # a full or read-only disk: this process has its arrays; the next decodes again
        tmp.unlink(missing_ok=True)
        log.warning("could not cache the dataset in %s: %s", path, exc)
