"""A job of tests/torchrun_jobs.py (test_tp): train a model with tensor parallelism, save what to compare. Alone:

    torchrun --standalone --nproc-per-node 2 tests/tp_worker.py TECHNIQUES OUT_DIR [STEPS [MODEL]]
    torchrun --standalone --nproc-per-node 2 tests/tp_worker.py refuse OUT_DIR 0 BUILD[,BUILD...]

MODEL: ``gpt`` (gpt:tiny, the default) or the name of a build in tests/decoders.py (a user's model). ``refuse``:
apply ``tp`` to each named build of tests/decoders.py and write, on every rank R, ``refused{R}.json``: the ValueError
each raised (None when it did not).

Saves (rank 0) ``params.pt``: the full parameters after training (DTensors gathered with ``full_tensor``, the
head-major ``qkv`` put back in the model's ``[q; k; v]`` order, so names and values compare with one process), and
on every rank ``rank{R}.json``: the per-step losses, the per-rank parameter bytes, the technique's results and the
collectives torch's ``CommDebugMode`` saw in one training step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.trial import end_rank
from techniques import get
from techniques._distributed import local_bytes
from techniques.base import Context
from techniques.tp import head_major_rows
from tests import decoders

STEPS = 10
BATCH = 16


class Collectives(TorchDispatchMode):
    """The functional collectives DTensor dispatches (forward and backward), with the bytes of their input."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "_c10d_functional" and not func.__name__.startswith("wait_tensor"):
            t = args[0]
            self.calls.append([func.__name__, t.numel() * t.element_size()])
        return func(*args, **(kwargs or {}))


def load(model: str):
    """(the built workload, its name) of MODEL."""
    if model == "gpt":
        return workloads.get("gpt").build("tiny", 0, torch.device("cpu")), "gpt"
    wl = decoders.workload(model)
    return wl.build("default", 0, torch.device("cpu")), wl.name


def context(built, name: str, names: list[str], rank: int, world: int) -> Context:
    return Context(device=torch.device("cpu"), workload=name, rank=rank, world_size=world,
                   technique_names=tuple(names), structure=built.structure,
                   sequence_length=built.tokens_per_sample)


def refuse(builds: list[str], out: Path, rank: int, world: int) -> None:
    found = {}
    for fn in builds:
        built, name = load(fn)
        tech = get("tp")()
        ctx = context(built, name, ["tp"], rank, world)
        assert tech.check(ctx) is None, tech.check(ctx)  # the description does not show it: the guard must
        try:
            tech.transform_model(built.model, ctx)
            found[fn] = None
        except ValueError as exc:
            found[fn] = str(exc)
    (out / f"refused{rank}.json").write_text(json.dumps(found))


def run(args: list[str]) -> None:
    """TECHNIQUES OUT_DIR [STEPS [MODEL]] or refuse OUT_DIR 0 BUILD[,BUILD...], in this process's group."""
    names, out = args[0].split("+"), Path(args[1])
    steps = int(args[2]) if len(args) > 2 else STEPS
    model_name = args[3] if len(args) > 3 else "gpt"
    rank, world = dist.get_rank(), dist.get_world_size()
    if names == ["refuse"]:
        refuse(model_name.split(","), out, rank, world)
        return
    built, wl_name = load(model_name)
    techs = sorted((get(n)() for n in names), key=lambda t: t.phase)
    ctx = context(built, wl_name, names, rank, world)
    for tech in techs:
        assert tech.check(ctx) is None, tech.check(ctx)
    model = built.model
    for tech in techs:
        model = tech.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, built.lr)
    loop = TrainLoop(model, opt, built.loss_fn, techs, ctx, tokens_per_sample=built.tokens_per_sample)
    data = built.batches(BATCH, 0)
    for tech in techs:
        data = tech.wrap_data(data, ctx)
    losses = [float(loop.step(next(data))) for _ in range(steps - 1)]
    seen = Collectives()
    with seen:
        losses.append(float(loop.step(next(data))))
    with torch.no_grad():
        val_loss = built.evaluate(model)["val_loss"]  # every rank evaluates: the sharded forward has collectives
    tp = next(t for t in techs if t.name == "tp")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "losses": losses, "param_bytes": local_bytes(model.parameters()), "results": tp.results(ctx), "collectives": seen.calls,
        "val_loss": val_loss,
    }))
    full = {}
    for key, p in model.named_parameters():
        tensor = (p.full_tensor() if hasattr(p, "full_tensor") else p.detach()).clone()
        a = built.structure.attention
        fused = [f"{a.qkv}.weight", f"{a.qkv}.bias"] if a is not None and a.projections == "fused" else []
        if any(key.endswith(name) for name in fused):  # back in the model's [q; k; v] order
            restored = torch.empty_like(tensor)
            restored[head_major_rows(a.heads, a.head_dim)] = tensor
            tensor = restored
        full[key] = tensor
    if rank == 0:
        torch.save(full, out / "params.pt")


def main() -> None:
    dist.init_process_group("gloo")
    run(sys.argv[1:])
    end_rank(0)


if __name__ == "__main__":
    main()
