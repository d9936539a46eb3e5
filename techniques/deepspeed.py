"""DeepSpeed ZeRO stages 1-3 (optional extra: ``pip install 'trainbench[deepspeed]'``).

Method card
- What: ``deepspeed.initialize`` wraps model and optimizer in an engine that shards optimizer state (``stage=1``),
  gradients (2) and parameters (3); the engine owns backward and the optimizer step. The optimizer is torch's AdamW,
  so nothing is compiled.
- When it should pay: as ``zero1``-``zero3``; it is the ZeRO paper's own implementation. Not run on a GPU yet.
- Refuses ``grad_accum`` (the engine accumulates itself), ``fp16`` and ``compile``.
- Sources: Rajbhandari et al., ZeRO, SC 2020; Rasley et al., "DeepSpeed", KDD 2020; DeepSpeed configuration docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-deepspeed (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from techniques._distributed import needs_world, shard_batches
from techniques.base import Claim, Context, Kind, Phase, Technique, register


@register
class DeepSpeed(Technique):
    name = "deepspeed"
    summary = "DeepSpeed ZeRO engine (stage 1, 2 or 3); optional extra"
    kind = Kind.EXACT
    phase = Phase.SHARDING
    slot = "sharding"
    tune_options = ("stage=1", "stage=2", "stage=3")
    own_flops = False
    hides_tensors = False
    multi_process = True
    conflicts = frozenset({"grad_accum", "fp16", "compile"})
    claims = (
        Claim("model_state_ratio", 0.0, 0.5, "ZeRO stages 1-3 on N GPUs", "Rajbhandari et al., ZeRO, SC 2020"),
    )

    @dataclass(frozen=True)
    class Options:
        stage: Literal["1", "2", "3"] = "2"

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self.zero_stage = int(self.options.stage)

    def check(self, ctx: Context) -> str | None:
        if "deepspeed" not in ctx.available_packages:
            return "the deepspeed package is not installed (pip install 'trainbench[deepspeed]')"
        return needs_world(ctx, self.name)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        import deepspeed

        lr = ctx.state.get("lr", 1e-3)
        config = {
            "train_micro_batch_size_per_gpu": ctx.state["local_batch_size"],
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": int(self.options.stage)},
            "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
            "bf16": {"enabled": "bf16" in ctx.technique_names},
        }
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config, dist_init_required=False
        )
        ctx.state["deepspeed_engine"] = engine
        ctx.state["deepspeed_optimizer"] = optimizer
        return engine

    def build_optimizer(
        self, params: Iterable[nn.Parameter], default: Callable[..., torch.optim.Optimizer], ctx: Context
    ) -> torch.optim.Optimizer | None:
        return ctx.state["deepspeed_optimizer"]

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        return shard_batches(batches, ctx)

    def backward(self, loss: torch.Tensor, ctx: Context) -> bool:
        ctx.state["deepspeed_engine"].backward(loss)
        return True

    def optimizer_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> bool:
        ctx.state["deepspeed_engine"].step()
        return True
