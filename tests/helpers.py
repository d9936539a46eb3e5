"""Build a workload with techniques applied, in-process, the way bench.trial does."""

from __future__ import annotations

import torch

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from bench.plan.config import Budget, TechniqueSet
from bench.trial import configure


def build_loop(workload: str, label: str, seed: int = 0, size: str = "tiny", budget: Budget | None = None,
               device: torch.device | None = None):
    """(loop, batches iterator, built workload) for ``label`` applied to ``workload`` (tune probes included)."""
    techs = sorted((s.resolve() for s in TechniqueSet.parse(label).specs), key=lambda t: t.phase)
    wl = workloads.get(workload)
    device = device or torch.device("cpu")
    built = wl.build(size, seed, device)
    cfg, ctx, _ = configure(wl, size, built, techs, budget or Budget(), seed, device)
    model = built.model
    for t in techs:
        model = t.transform_model(model, ctx)
    opt = build_optimizer(model, techs, ctx, cfg.lr)
    loop = TrainLoop(model, opt, built.loss_fn, techs, ctx, cfg.micro_batches, built.tokens_per_sample)
    batches = built.batches(cfg.batch_size, seed)
    for t in techs:
        batches = t.wrap_data(batches, ctx)
    return loop, batches, built


def whole_batch_trial(tmp_path, label: str):
    """One 2-rank trial of ``label`` (tp, pp: every rank trains the whole batch) on gpt:tiny through the real runner,
    checked against its baseline: ok, exact parity, and the whole model's parameter count and FLOPs per step (not
    one rank's share, not the world size times them). Returns the record."""
    from bench.plan.config import build_config
    from bench.run.runner import SweepRunner
    from tests.conftest import TINY_BUDGET

    cfg = build_config("smoke", {"workloads": "gpt", "techniques": label, "repeats": 1, "nproc": 2,
                                 "budget": {**TINY_BUDGET, "timeout_s": 180}})
    records = {r.technique_label: r for r in SweepRunner(cfg, tmp_path / "s", torch.device("cpu")).run()}
    r, base = records[label], records["baseline"]
    assert r.status == "ok", r.reason
    assert r.world_size == 2 and r.kind == "exact"
    assert r.parity.ok, (r.parity.loss_rel_diff, r.parity.distance_rel_diff)
    assert r.workload["n_params"] == base.workload["n_params"] == r.build.n_params
    assert r.speed.flops_per_step == base.speed.flops_per_step > 0
    return r
