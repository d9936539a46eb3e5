"""A job of tests/torchrun_jobs.py (test_pp): train a model with ``pp`` through the real loop, save what to compare.
Alone:

    torchrun --standalone --nproc-per-node 2 tests/pp_worker.py SCHEDULE OUT_DIR [MODEL]

MODEL: ``gpt`` (gpt:tiny, the default) or the name of a build in tests/decoders.py (a user's model).

Each rank writes ``rank{r}.json`` (per-step losses, forward/backward counts from hooks on its stage module, the
order its stage ran the micro-batches, parameter bytes, whether the layers it does not own were freed, the held-out
loss through ``eval_model``) and ``params_rank{r}.pt`` (its parameters under the model's own names; the tied head's copy as ``TIED``); rank 0 also writes
``results.json`` (the technique's ``results``).
"""

from __future__ import annotations

import gc
import json
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.trial import end_rank
from techniques import get
from techniques.base import Context
from techniques.pp import stage_layers
from tests import decoders

STEPS = 8
BATCH = 16
MICROBATCHES = 4


TIED = "tied head copy"


def run(args: list[str]) -> None:
    """SCHEDULE OUT_DIR [MODEL], in the process group this process is in."""
    schedule, out = args[0], Path(args[1])
    model_name = args[2] if len(args) > 2 else "gpt"
    rank, world = dist.get_rank(), dist.get_world_size()
    if model_name == "gpt":
        built, wl_name = workloads.get("gpt").build("tiny", 0, torch.device("cpu")), "gpt"
    else:
        wl = decoders.workload(model_name)
        built, wl_name = wl.build("default", 0, torch.device("cpu")), wl.name
    whole = built.model
    s = built.structure or whole.trainbench_structure()
    blocks = whole.get_submodule(s.blocks)
    layers = stage_layers(len(blocks), world)[rank]
    dropped = [weakref.ref(b) for i, b in enumerate(blocks) if i not in layers]
    ends = (s.embedding, s.position_embedding) if rank else (s.final_norm,)
    dropped += [weakref.ref(whole.get_submodule(path)) for path in ends if path]
    names = {id(p): key for key, p in whole.named_parameters()}  # the stage holds the model's own Parameters
    del blocks

    tech = get("pp")(get("pp").Options(schedule=schedule, microbatches=MICROBATCHES))
    ctx = Context(device=torch.device("cpu"), workload=wl_name, rank=rank, world_size=world, technique_names=("pp",),
                  structure=built.structure, sequence_length=built.tokens_per_sample)
    assert tech.check(ctx) is None, tech.check(ctx)
    model = tech.transform_model(whole, ctx)
    gc.collect()
    opt = build_optimizer(model, [tech], ctx, built.lr)
    loop = TrainLoop(model, opt, built.loss_fn, [tech], ctx)

    counts = {"forward": 0, "backward": 0}

    def count_backward(grad: torch.Tensor) -> None:
        counts["backward"] += 1

    def count_forward(module: torch.nn.Module, args: object, output: torch.Tensor) -> None:
        counts["forward"] += 1
        if output.requires_grad:
            output.register_hook(count_backward)

    model.register_forward_hook(count_forward)
    data = built.batches(BATCH, 0)
    losses, per_step = [], []
    for _ in range(STEPS):
        counts.update(forward=0, backward=0)
        losses.append(float(loop.step(next(data))))
        per_step.append(dict(counts))
    results = tech.results(ctx)

    module = tech.eval_model(model, ctx)
    module.eval()
    with torch.no_grad():
        val_loss = built.evaluate(module)["val_loss"]
    module.train()

    params = {names.get(id(p), TIED): p.detach().clone() for p in model.parameters()}
    torch.save(params, out / f"params_rank{rank}.pt")
    mine = {
        "losses": losses,
        "counts": per_step,
        "trace": tech.last_trace,
        "gpt_param_bytes": sum(p.numel() * p.element_size() for p in whole.parameters()),
        "param_bytes": tech.communication()["param_bytes"],
        "freed": all(ref() is None for ref in dropped),
        "val_loss": val_loss,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(mine))
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results))


def main() -> None:
    dist.init_process_group("gloo")
    run(sys.argv[1:])
    end_rank(0)


if __name__ == "__main__":
    main()
