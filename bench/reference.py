"""The eager fp32 reference a trial's parity is judged against, computed in its own process and cached.

For a workload size, seed and global batch, the reference trains the plain model (no technique, fp32, one
process, the default AdamW) for ``steps`` optimizer steps on the same batches a trial sees, and records:

- the loss of each step;
- the parameter-distance trajectory d_t = ||theta_t - theta_0|| after each update. Adam's first update moves every
  weight by about the learning rate, so d_t is proportional to it: a 10% learning-rate change moves d_t by 10%
  (measured on the three tiny workloads: 0.100-0.103), where reduced precision moves it by at most 0.4% and exact
  techniques by about 1e-7. The losses of the first few steps move by only ~1e-3 for the same bug.
- the model FLOPs of one optimizer step (``FlopCounterMode``), the same for every technique of the workload.

It runs in a process of its own (``python -m bench.reference CACHE_DIR DEVICE KEY.json ...``), never beside a
trial's model: one process computes every reference a sweep lacks before its first trial, and the results are
cached as ``CACHE_DIR/<key>.json`` (the sweep's ``references/``), so a resumed sweep reuses them. Distributed
trials compare against the single-process reference of their global batch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bench import workloads
from bench.core.files import REPO_DIR, write_atomic
from bench.loop import plain_loop
from bench.measure.flops import count_flops
from bench.plan.planner import ReferenceKey

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ReferenceResult:
    key: str
    losses: list[float]
    distances: list[float]  # d_t after each of the ``steps`` updates
    flops_per_step: int
    torch: str
    seconds: float
    dataset: str | None = None  # the workload's dataset sha256: a reference of other data is refused


class Trajectory:
    """d_t = ||theta_t - theta_0|| of a model's parameters, from a snapshot of theta_0.

    Works on the trial's transformed model too: FSDP2 parameters are DTensors sharded across ranks (their local
    squared distances are summed over ranks), DDP and ZeroRedundancyOptimizer keep full replicas (counted once).
    """

    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            self.start = [_local(p).detach().clone() for p in self.params]

    @torch.no_grad()
    def distance(self) -> float:
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        for p, p0 in zip(self.params, self.start, strict=True):
            sq = (_local(p).detach().double() - p0.double()).pow(2).sum().cpu()
            if _is_sharded(p):
                sharded += sq
            else:
                replicated += sq
        if dist.is_available() and dist.is_initialized() and any(_is_sharded(p) for p in self.params):
            dist.all_reduce(sharded)
        return math.sqrt(float(sharded + replicated))

    def close(self) -> None:
        self.start = []


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: a DTensor's local shard (FSDP2), DeepSpeed ZeRO-3's ``ds_tensor`` (the
    parameter itself is an empty placeholder at rest there), or the tensor."""
    if hasattr(t, "ds_tensor"):
        return t.ds_tensor
    return t.to_local() if hasattr(t, "to_local") else t


def _is_sharded(t: torch.Tensor) -> bool:
    """Whether other ranks hold other parts of the model's parameters here: a DTensor shard, a DeepSpeed ZeRO-3
    partition, or a parameter a technique marked ``held_by_one_rank`` (a pipeline stage's)."""
    if hasattr(t, "ds_tensor") or getattr(t, "held_by_one_rank", False):
        return True
    return any(p.is_shard() for p in getattr(t, "placements", ()))  # DTensor placements: Shard, Replicate, ...


def compute(key: ReferenceKey, device: torch.device) -> ReferenceResult:
    """Train the plain fp32 model ``key.steps`` steps and count one step's FLOPs."""
    started = time.perf_counter()
    wl = workloads.get(key.workload)
    built = wl.build(key.size, key.seed, device)
    loop = plain_loop(built, built.lr, device)
    batches = built.batches(key.batch_size, key.seed)
    trajectory = Trajectory(built.model)
    losses, distances = [], []
    for _ in range(key.steps):
        losses.append(float(loop.step(next(batches))))
        distances.append(trajectory.distance())
    batch = next(batches)
    flops = count_flops(lambda: loop.step(batch))
    return ReferenceResult(key.name, losses, distances, flops, torch.__version__, time.perf_counter() - started,
                           built.dataset.get("sha256"))


def path_of(cache_dir: Path, key: ReferenceKey) -> Path:
    return Path(cache_dir) / f"{key.name}.json"


def load(cache_dir: Path, key: ReferenceKey) -> ReferenceResult | None:
    path = path_of(cache_dir, key)
    if not path.is_file():
        return None
    try:
        return ReferenceResult(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        log.warning("ignoring an unreadable reference %s: %s", path, exc)
        return None


def ensure(keys: Iterable[ReferenceKey], cache_dir: Path, device: str, code_dir: Path = REPO_DIR,
           timeout_s: float = 900.0, plugins: list[dict] | None = None) -> None:
    """Compute, in one child process, every reference of ``keys`` that ``cache_dir`` lacks (``plugins``: users'
    models and techniques the process loads first)."""
    missing = list(dict.fromkeys(k for k in keys if load(cache_dir, k) is None))
    if not missing:
        return
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench.reference", str(cache_dir), device,
           *(["--plugins", json.dumps(plugins)] if plugins else []), *(json.dumps(asdict(k)) for k in missing)]
    log.info("computing %d parity reference(s) in a child process", len(missing))
    proc = subprocess.run(cmd, cwd=code_dir, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the reference process failed (exit {proc.returncode}): {tail}"[:800])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print("usage: python -m bench.reference CACHE_DIR DEVICE KEY_JSON [KEY_JSON ...]", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("TRAINBENCH_LOG", "WARNING"), stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from bench.plan import user_models as user

    cache_dir, device, keys = Path(argv[0]), torch.device(argv[1]), argv[2:]
    given = []
    if keys[0] == "--plugins":
        given, keys = json.loads(keys[1]), keys[2:]
    user.load_plugins(given)  # installed plugins always; users' models and techniques when the sweep has some
    workloads.use_artefact_dir(cache_dir)  # what workloads build once per sweep, shared with the trials
    for text in keys:
        key = ReferenceKey(**json.loads(text))
        result = compute(key, device)
        write_atomic(path_of(cache_dir, key), json.dumps(asdict(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
