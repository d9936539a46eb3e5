"""The eager fp32 reference a trial's parity is judged against, computed in its own process and cached.

For a workload size, seed and global batch, the reference trains the plain model (no technique, fp32, one
process, the default AdamW) for ``steps`` optimizer steps on the same batches a trial sees, and records:

- the loss of each step;
- the parameter-distance trajectory d_t = ||theta_t - theta_0|| after each update. Adam's first update moves every
  weight by about the learning rate, so d_t is proportional to it: a 10% learning-rate change moves d_t by 10%
  (measured on the three tiny workloads: 0.100-0.103), where reduced precision moves it by at most 0.4% and exact
  techniques by about 1e-7. The losses of the first few steps move by only ~1e-3 for the same bug.
- the model FLOPs of one optimizer step (``FlopCounterMode``), the same for every technique of the workload;
- the same steps three more times, to calibrate the tolerances and test their power (``perturbed``): from initial
  weights jittered by a harmless amount for each kind (``PARITY_HARMLESS``: about one fp32 ulp for exact sets,
  TF32's rounding unit for numeric ones), and with the learning rate x 1.1, the known bug. ``judge`` turns a
  trial's first steps and these into its parity answer: ok, mismatch or inconclusive.

The reference trains with the workload's LR warm-up (``lr_warmup_steps``), as the trial's loop does.

It runs in a process of its own (``python -m bench.reference CACHE_DIR DEVICE KEY.json ...``), never beside a
trial's model: one process computes every reference a sweep lacks before its first trial, and the results are
cached as ``CACHE_DIR/<key>.json`` (the sweep's ``references/``), so a resumed sweep reuses them; a file of another
``FORMAT`` (one written before calibration) is computed again, never read as this one. Distributed trials compare
against the single-process reference of their global batch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bench import workloads
from bench.core.files import REPO_DIR, write_atomic
from bench.loop import lr_warmup_steps, plain_loop
from bench.measure.flops import count_flops
from bench.plan.planner import ReferenceKey
from bench.records.results import (
    PARITY_BUG_LR_FACTOR,
    PARITY_HARMLESS,
    PARITY_K_TOL,
    PARITY_TOLERANCES,
    ParityResult,
    parity_answer,
)

log = logging.getLogger(__name__)

FORMAT = 2  # 2: with the calibration runs (``perturbed``); 1 (files without the field): losses and distances only
JITTER_SEED = 20_260_412  # the harmless jitter's u is drawn from JITTER_SEED + the reference's seed
BUG = "bug"  # the key of the known bug's run in ``perturbed``


@dataclass(frozen=True)
class ReferenceResult:
    key: str
    losses: list[float]
    distances: list[float]  # d_t after each of the ``steps`` updates
    flops_per_step: int
    torch: str
    seconds: float
    dataset: str | None = None  # the workload's dataset sha256: a reference of other data is refused
    lr_warmup_steps: int = 0  # the warm-up it trained with: a trial warming up otherwise is refused
    # the calibration runs' {"losses", "distances"}: each kind's harmless jitter (by kind) and the bug (``BUG``)
    perturbed: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    format: int = FORMAT


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


@dataclass(frozen=True)
class _Run:
    losses: list[float]
    distances: list[float]
    flops: int | None
    dataset: str | None
    lr_warmup: int


def _train(key: ReferenceKey, device: torch.device, scale: float = 0.0, lr_factor: float = 1.0,
           count: bool = False) -> _Run:
    """The plain fp32 model of ``key`` trained ``key.steps`` steps, from initial weights jittered by ``scale``
    (``jitter``) and at the LR x ``lr_factor``; ``count``: then one step's FLOPs."""
    built = workloads.get(key.workload).build(key.size, key.seed, device)
    if scale:
        jitter(built.model, scale, JITTER_SEED + key.seed)
    warm = lr_warmup_steps(built, key.batch_size)
    loop = plain_loop(built, built.lr * lr_factor, device, lr_warmup=warm)
    batches = built.batches(key.batch_size, key.seed)
    trajectory = Trajectory(built.model)
    losses, distances = [], []
    for _ in range(key.steps):
        losses.append(float(loop.step(next(batches))))
        distances.append(trajectory.distance())
    flops = None
    if count:
        batch = next(batches)
        flops = count_flops(lambda: loop.step(batch))
    return _Run(losses, distances, flops, built.dataset.get("sha256"), warm)


@torch.no_grad()
def jitter(model: nn.Module, scale: float, seed: int) -> None:
    """Every trainable weight times (1 + scale * u), u uniform in [-1, 1] drawn on the CPU from ``seed`` (the same
    on every device), the product computed in float64 and rounded once to the weight's dtype."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            u = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
            p.copy_(p.double() * (1 + scale * u.to(p.device)))


def compute(key: ReferenceKey, device: torch.device) -> ReferenceResult:
    """Train the plain fp32 model ``key.steps`` steps and count one step's FLOPs; then the calibration runs (each
    kind's harmless jitter, the learning-rate bug), each from a freshly built model."""
    started = time.perf_counter()
    ref = _train(key, device, count=True)
    runs = {kind: _train(key, device, scale=scale) for kind, (_, scale) in PARITY_HARMLESS.items()}
    runs[BUG] = _train(key, device, lr_factor=PARITY_BUG_LR_FACTOR)
    perturbed = {name: {"losses": r.losses, "distances": r.distances} for name, r in runs.items()}
    return ReferenceResult(key.name, ref.losses, ref.distances, ref.flops, torch.__version__,
                           time.perf_counter() - started, ref.dataset, ref.lr_warmup, perturbed)


def rel_drift(values: Sequence[float], reference: Sequence[float]) -> float:
    """max over steps of |value - reference| / |reference|: how parity measures a trajectory's distance."""
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(values, reference, strict=True))


def judge(kind: str, losses: list[float], distances: list[float], ref: ReferenceResult,
          note: str | None = None) -> ParityResult:
    """A trial's first steps against the reference: each tolerance of ``kind`` calibrated on the reference's
    harmless run (``PARITY_K_TOL`` times its drift, never below the kind's fixed value), and each check's power
    from the bug's run (``parity_answer``)."""
    k = len(losses)
    ref_l, ref_d = ref.losses[:k], ref.distances[:k]
    loss_diff, dist_diff = rel_drift(losses, ref_l), rel_drift(distances, ref_d)
    floor, dist_floor = PARITY_TOLERANCES[kind]
    fixed = dict(kind=kind, steps=k, loss_rel_diff=loss_diff, distance_rel_diff=dist_diff, losses=losses,
                 reference_losses=ref_l, distances=distances, reference_distances=ref_d, note=note, reference=ref.key)
    if kind not in ref.perturbed or BUG not in ref.perturbed:  # a reference made without calibration runs (a
        # test's, a user's): the fixed tolerances, and the record says it was not calibrated (``harmless`` None)
        return ParityResult(ok=loss_diff <= floor and dist_diff <= dist_floor, loss_tolerance=floor,
                            distance_tolerance=dist_floor, **fixed)
    harmless, bug = ref.perturbed[kind], ref.perturbed[BUG]
    h_loss, h_dist = rel_drift(harmless["losses"][:k], ref_l), rel_drift(harmless["distances"][:k], ref_d)
    b_loss, b_dist = rel_drift(bug["losses"][:k], ref_l), rel_drift(bug["distances"][:k], ref_d)
    loss_tol, dist_tol = max(floor, PARITY_K_TOL * h_loss), max(dist_floor, PARITY_K_TOL * h_dist)
    name, scale = PARITY_HARMLESS[kind]
    return ParityResult(
        ok=loss_diff <= loss_tol and dist_diff <= dist_tol, loss_tolerance=loss_tol, distance_tolerance=dist_tol,
        **fixed, answer=parity_answer([(loss_diff, loss_tol, b_loss), (dist_diff, dist_tol, b_dist)]),
        harmless=f"initial weights x (1 + 2^{math.log2(scale):.0f} u), u ~ U[-1, 1]: {name}",
        harmless_loss_drift=h_loss, harmless_distance_drift=h_dist, bug_loss_drift=b_loss,
        bug_distance_drift=b_dist, k_tol=PARITY_K_TOL)


def path_of(cache_dir: Path, key: ReferenceKey) -> Path:
    return Path(cache_dir) / f"{key.name}.json"


def save(cache_dir: Path, result: ReferenceResult) -> Path:
    """Write ``result`` to its cache file, whole or not at all."""
    path = Path(cache_dir) / f"{result.key}.json"
    write_atomic(path, json.dumps(asdict(result)) + "\n")
    return path


def load(cache_dir: Path, key: ReferenceKey) -> ReferenceResult | None:
    path = path_of(cache_dir, key)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format", 1) != FORMAT:
            log.info("recomputing %s: written in reference format %s, this code writes %d", path,
                     data.get("format", 1), FORMAT)
            return None
        return ReferenceResult(**data)
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
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
        save(cache_dir, compute(key, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
