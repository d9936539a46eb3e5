"""A job of tests/torchrun_jobs.py (test_distributed, test_local_sgd, test_fedavg): train with one data-parallel
technique on 2 gloo ranks, save what to compare. Alone:

    torchrun --standalone --nproc-per-node 2 tests/dist_worker.py TECHNIQUES OUT_DIR [balanced|mlp|gpt [STEPS [sgd]]]

TECHNIQUES is a set like ``zero3+offload`` or ``local_sgd:period=4:warmup=0``; ``sgd`` trains with plain SGD
instead of the workload's AdamW (local SGD equals DDP only then). Each rank's ``technique_results`` are saved too,
and, when a technique evaluates another module than the one it trains (local SGD's average, fedavg's server), each
rank's own trained parameters. ``TRAINBENCH_TEST_START_STEP`` starts the step count there (a speed window starts
past the quality run's plan).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import TechniqueSet
from bench.trial import end_rank
from techniques._distributed import model_state_bytes
from techniques.base import Context, Probe, TrainConfig

STEPS = 10
BATCH = 64


class Balanced(nn.Module):
    """Four equal bias-free layers: every sharding scheme splits it evenly, so per-rank bytes are exact."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(64, 64, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def build_workload(name: str = "mlp"):
    return workloads.get(name).build("tiny", 0, torch.device("cpu"))


def build(kind: str):
    if kind == "balanced":
        torch.manual_seed(0)
        model = Balanced()
        gen = torch.Generator().manual_seed(0)

        def batches(batch_size, seed):
            while True:
                yield torch.randn(batch_size, 64, generator=gen), torch.randn(batch_size, 64, generator=gen)

        return model, batches, nn.functional.mse_loss, 1e-3
    built = build_workload(kind)
    return built.model, built.batches, built.loss_fn, built.lr


def sgd(model: nn.Module, techs: list, ctx: Context, lr: float) -> torch.optim.Optimizer:
    """Plain SGD as the default optimizer, wrapped by a technique that builds its own (local SGD's averager)."""
    def default(params):
        return torch.optim.SGD(params, lr=lr)

    built = [opt for t in techs if (opt := t.build_optimizer(model.parameters(), default, ctx)) is not None]
    return built[0] if built else default(model.parameters())


def run(args: list[str]) -> None:
    """TECHNIQUES OUT_DIR [balanced|mlp|gpt [STEPS [sgd]]], in the process group this process is in."""
    name, out = args[0], Path(args[1])
    kind = args[2] if len(args) > 2 else "mlp"
    balanced = kind == "balanced"
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn, lr = build(kind)
    steps = int(args[3]) if len(args) > 3 else STEPS
    technique_set = TechniqueSet.parse(name)
    techs = [spec.resolve() for spec in technique_set.specs]
    cpu = torch.device("cpu")
    ctx = Context(device=cpu, workload="" if balanced else kind, rank=rank, world_size=world,
                  technique_names=technique_set.names, total_steps=steps)
    ctx.step = int(os.environ.get("TRAINBENCH_TEST_START_STEP", "0"))
    for tech in techs:  # techniques that set themselves up on a fresh copy of the workload (fedavg's clients)
        tech.tune(TrainConfig(batch_size=BATCH, lr=lr), Probe(fresh=lambda seed=0: build_workload(kind), device=cpu), ctx)
    for tech in techs:
        model = tech.transform_model(model, ctx)
    if len(args) > 4 and args[4] == "sgd":
        opt = sgd(model, techs, ctx, lr)
    else:
        opt = build_optimizer(model, techs, ctx, lr)
    loop = TrainLoop(model, opt, loss_fn, techs, ctx)
    data = batches(BATCH, 0)
    for tech in techs:
        data = tech.wrap_data(data, ctx)
    for _ in range(steps if not balanced else 1):
        loop.step(next(data))
    (out / f"state_rank{rank}.json").write_text(json.dumps(model_state_bytes(model, opt)))
    found = {t.name: r for t in techs if (r := t.results(ctx))}
    (out / f"results_rank{rank}.json").write_text(json.dumps(found))
    full = {}
    evaluated = next((m for t in techs if (m := t.eval_model(model, ctx)) is not model), model)  # fedavg's server
    for key, p in evaluated.named_parameters():
        tensor = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        full[key.removeprefix("module.")] = tensor.clone()
    if rank == 0:
        torch.save(full, out / "params.pt")
    if evaluated is not model:
        own = {k.removeprefix("module."): p.detach().clone() for k, p in model.named_parameters()}
        torch.save(own, out / f"own_rank{rank}.pt")


def main() -> None:
    dist.init_process_group("gloo")
    run(sys.argv[1:])
    end_rank(0)  # the trial's own ending: barrier, destroy, exit before gloo's threads meet interpreter teardown


if __name__ == "__main__":
    main()
