"""Build a workload with techniques applied, in-process, the way bench.trial does."""

from __future__ import annotations

import torch

from bench import workloads
from bench.config import TechniqueSet
from bench.loop import TrainLoop, build_optimizer
from techniques.base import Context, TrainConfig


def build_loop(workload: str, label: str, seed: int = 0, size: str = "tiny"):
    """(loop, batches iterator, built workload) for ``label`` applied to ``workload``."""
    techs = sorted((s.resolve() for s in TechniqueSet.parse(label).specs), key=lambda t: t.phase)
    wl = workloads.get(workload)
    built = wl.build(size, seed, torch.device("cpu"))
    cfg = TrainConfig(batch_size=built.batch_size, lr=built.lr)
    for t in techs:
        cfg = t.configure(cfg)
    ctx = Context(device=torch.device("cpu"), workload=workload, seed=seed, has_blocks=wl.has_blocks,
                  has_batchnorm=wl.has_batchnorm)
    model = built.model
    for t in techs:
        model = t.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, cfg.lr)
    loop = TrainLoop(model, opt, built.loss_fn, techs, ctx, cfg.micro_batches)
    return loop, built.batches(cfg.batch_size, seed), built
