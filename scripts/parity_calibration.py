"""How parity's calibrated loss tolerance behaves where the loss spikes: the figures behind ``PARITY_K_TOL``.

    .venv/bin/python scripts/parity_calibration.py            # the k_tol table (a few minutes on 2 cores)
    .venv/bin/python scripts/parity_calibration.py --spikes   # do the built-in CPU sizes spike in their first steps?

The table: gpt:tiny's model at constant learning rates from its own (3e-3) to 0.1, where the loss spikes within 8
steps, seeds 0-4. For each, the parity reference as ``bench.reference.compute`` records it (its TF32-sized jitter of
the initial weights calibrates numeric sets, its 10% learning-rate run is the known bug), and, judged against it
as trials would be: three further harmless jitters (other draws of u, the same scale) and bf16 autocast. For each
k_tol it counts how many harmless jitters and bf16 runs parity answers ok, and for how many references the 10% bug
is caught (mismatch) and by its loss check alone. Everything is deterministic for its seed, so a busy machine gives
the same figures. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import reference, workloads  # noqa: E402
from bench.loop import TrainLoop, default_optimizer, plain_loop  # noqa: E402
from bench.plan.planner import ReferenceKey  # noqa: E402
from bench.records.results import PARITY_HARMLESS, PARITY_TOLERANCES, parity_answer  # noqa: E402
from bench.reference import Trajectory, rel_drift  # noqa: E402
from bench.workloads.gpt_chars import GPTChars  # noqa: E402
from techniques.base import Context  # noqa: E402
from techniques.bf16 import BF16  # noqa: E402

CPU = torch.device("cpu")
STEPS = 8
LRS = (3e-3, 3e-2, 6e-2, 1e-1)
SEEDS = range(5)
OTHER_DRAWS = (1, 2, 3)  # the further harmless jitters' seeds (the reference's own is JITTER_SEED + seed)
KS = (2.0, 3.0, 5.0, 10.0)


def trajectory(size: str, seed: int, draw: int | None = None, bf16: bool = False) -> tuple[list[float], list[float]]:
    """Losses and d_t of gpt:``size`` over STEPS steps: plain, jittered with seed ``draw``, or under bf16."""
    built = workloads.get("gpt").build(size, seed, CPU)
    if draw is not None:
        reference.jitter(built.model, PARITY_HARMLESS["numeric"][1], draw)
    if bf16:
        optimizer = default_optimizer(built.lr)(built.model.parameters())
        loop = TrainLoop(built.model, optimizer, built.loss_fn, [BF16()], Context(device=CPU), 1,
                         built.tokens_per_sample)
    else:
        loop = plain_loop(built, built.lr, CPU)
    batches, track = built.batches(built.batch_size, seed), Trajectory(built.model)
    losses, distances = [], []
    for _ in range(STEPS):
        losses.append(float(loop.step(next(batches))))
        distances.append(track.distance())
    return losses, distances


def answer(run: tuple[list[float], list[float]], ref: reference.ReferenceResult, k: float,
           distance_too: bool = False) -> str:
    """A numeric set's parity answer with ``k`` as k_tol (``bench.reference.judge``'s arithmetic); ``distance_too``:
    the distance tolerance calibrated the same way (k x the harmless run's distance drift, at least the fixed one)."""
    floor, dist_tol = PARITY_TOLERANCES["numeric"]
    harmless, bug = ref.perturbed["numeric"], ref.perturbed[reference.BUG]
    tol = max(floor, k * rel_drift(harmless["losses"], ref.losses))
    if distance_too:
        dist_tol = max(dist_tol, k * rel_drift(harmless["distances"], ref.distances))
    return parity_answer([(rel_drift(run[0], ref.losses), tol, rel_drift(bug["losses"], ref.losses)),
                          (rel_drift(run[1], ref.distances), dist_tol, rel_drift(bug["distances"], ref.distances))])


def table() -> None:
    tiny = GPTChars.sizes["tiny"]
    counts = {(k, d): {"harmless ok": 0, "bf16 ok": 0, "bug caught": 0, "bug caught by the loss": 0}
              for k in KS for d in (False, True)}
    n_ref = 0
    print(f"gpt:tiny's model, {STEPS} steps, AdamW at a constant LR; drifts are parity's max relative loss drift\n")
    print("| lr | seed | losses | harmless (reference's): loss, distance | further harmless: loss/distance | "
          "bf16: loss/distance | 10% LR bug: loss, distance |")
    print("|---|---|---|---|---|---|---|")
    for lr in LRS:
        size = f"lr{lr:g}"
        GPTChars.sizes[size] = dataclasses.replace(tiny, lr=lr)
        for seed in SEEDS:
            ref = reference.compute(ReferenceKey("gpt", size, seed, tiny.batch_size, STEPS), CPU)
            others = [trajectory(size, seed, draw=d) for d in OTHER_DRAWS]
            bf16 = trajectory(size, seed, bf16=True)
            bug = (ref.perturbed[reference.BUG]["losses"], ref.perturbed[reference.BUG]["distances"])
            n_ref += 1
            h = rel_drift(ref.perturbed["numeric"]["losses"], ref.losses)
            h_d = rel_drift(ref.perturbed["numeric"]["distances"], ref.distances)

            def both(r: tuple[list[float], list[float]], ref: reference.ReferenceResult = ref) -> str:
                return f"{rel_drift(r[0], ref.losses):.1e}/{rel_drift(r[1], ref.distances):.1e}"

            print(f"| {lr:g} | {seed} | {' '.join(f'{x:.2f}' for x in ref.losses)} | {h:.1e}, {h_d:.1e} | "
                  f"{', '.join(both(o) for o in others)} | {both(bf16)} | {rel_drift(bug[0], ref.losses):.1e}, "
                  f"{rel_drift(bug[1], ref.distances):.1e} |", flush=True)
            for (k, distance_too), c in counts.items():
                c["harmless ok"] += sum(answer(o, ref, k, distance_too) == "ok" for o in others)
                c["bf16 ok"] += answer(bf16, ref, k, distance_too) == "ok"
                c["bug caught"] += answer(bug, ref, k, distance_too) == "mismatch"
                tol = max(PARITY_TOLERANCES["numeric"][0], k * h)
                c["bug caught by the loss"] += rel_drift(bug[0], ref.losses) > tol
    n_other = n_ref * len(OTHER_DRAWS)
    print("\n| k_tol | distance tolerance | further harmless jitters: ok | bf16: ok | 10% LR bug: mismatch | "
          "... by the loss check |")
    print("|---|---|---|---|---|---|")
    for (k, distance_too), c in counts.items():
        how = "calibrated too" if distance_too else "fixed"
        print(f"| {k:g} | {how} | {c['harmless ok']}/{n_other} | {c['bf16 ok']}/{n_ref} | "
              f"{c['bug caught']}/{n_ref} | {c['bug caught by the loss']}/{n_ref} |")


def spikes() -> None:
    """The first STEPS losses of the built-in CPU sizes, seeds 0-2, and the largest rise from one step to the next."""
    print("| workload size | seed | losses | largest rise |\n|---|---|---|---|")
    for name, size in [("gpt", "tiny"), ("gpt", "small"), ("mlp", "tiny"), ("mlp", "small"), ("mlp", "large"),
                       ("cnn", "tiny"), ("cnn", "small")]:
        wl = workloads.get(name)
        if wl.check():
            print(f"| {name}:{size} | - | not run: {wl.check()} | - |")
            continue
        for seed in range(3):
            built = wl.build(size, seed, CPU)
            loop, batches = plain_loop(built, built.lr, CPU), built.batches(built.batch_size, seed)
            losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
            rise = max(b / a for a, b in zip(losses, losses[1:], strict=False))
            print(f"| {name}:{size} | {seed} | {' '.join(f'{x:.3f}' for x in losses)} | {rise:.3f}x |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spikes", action="store_true", help="the built-in CPU sizes' first losses instead")
    args = parser.parse_args()
    torch.set_num_threads(2)
    spikes() if args.spikes else table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
