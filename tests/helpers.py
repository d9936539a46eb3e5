"""Build a workload with techniques applied, in-process, the way bench.trial does."""

from __future__ import annotations

import torch

from bench import workloads
from bench.config import Budget, TechniqueSet
from bench.loop import TrainLoop, build_optimizer
from bench.trial import configure


def build_loop(workload: str, label: str, seed: int = 0, size: str = "tiny", budget: Budget | None = None):
    """(loop, batches iterator, built workload) for ``label`` applied to ``workload`` (tune probes included)."""
    techs = sorted((s.resolve() for s in TechniqueSet.parse(label).specs), key=lambda t: t.phase)
    wl = workloads.get(workload)
    built = wl.build(size, seed, torch.device("cpu"))
    cfg, ctx, _ = configure(wl, size, built, techs, budget or Budget(), seed, torch.device("cpu"))
    model = built.model
    for t in techs:
        model = t.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, cfg.lr)
    loop = TrainLoop(model, opt, built.loss_fn, techs, ctx, cfg.micro_batches, built.tokens_per_sample)
    batches = built.batches(cfg.batch_size, seed)
    for t in techs:
        batches = t.wrap_data(batches, ctx)
    return loop, batches, built
