"""float8 training with torchao: the Linear layers' matmuls run in fp8 on GPUs with fp8 tensor cores.

Method card
- What: ``convert_to_float8_training`` swaps the targeted ``nn.Linear`` layers for ``Float8Linear``: in each of a
  Linear's three matmuls both operands are scaled dynamically and cast to float8 (e4m3, gradients e5m2) before
  ``torch._scaled_mm``. ``recipe``: ``tensorwise`` (one scale a tensor, fastest) or ``rowwise`` (one a row, more
  robust). ``filter=dims16`` takes layers whose sizes divide by 16 (not a tied head); ``auto`` adds torchao's size
  filter. Kind numeric.
- When it should pay: large matmuls on compute capability 8.9+ (Ada, Hopper), with ``torch.compile`` to fuse the
  scaling and casting; small shapes lose to bf16. Refused elsewhere (CPU emulation would measure numerics, not
  speed). On one H200 it ran only as ``bf16+fp8`` without compile (`reports/example-h200-first`, the README's GPU
  table); ``bf16+fp8+compile`` has not run.
- Refused with qat, sparse24, prune and tp.
- Sources: Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433; torchao float8 README (published:
  up to 1.25x at 8 GPUs / 8B parameters and 1.5x at 512 GPUs / 405B, with torch.compile, over bf16); PyTorch blog,
  "Supercharging Training using float8 and FSDP2" (2024).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-fp8 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from techniques import _reading as rd
from techniques._model import cuda_capability_problem, shared_weights, torchao_missing
from techniques.base import Claim, Context, Kind, Phase, Technique, register

_RECIPES = ("tensorwise", "rowwise")
_FILTERS = ("dims16", "auto")
MIN_CAPABILITY = (8, 9)


def fp8_device_problem(device: torch.device) -> str | None:
    """Why ``device`` cannot run float8 matmuls, or None."""
    return cuda_capability_problem(device, MIN_CAPABILITY, "fp8 training needs a CUDA GPU with compute capability "
                                   "8.9+ (Ada, Hopper)")


def float8_targets(model: nn.Module, recipe: str, filter: str) -> tuple[list[str], dict[str, str]]:
    """(the Linear layers to convert, {layer: why it stays in high precision} for the others)."""
    shared = shared_weights(model)
    auto = None
    if filter == "auto":
        from torchao.float8 import _auto_filter_for_recipe

        auto = _auto_filter_for_recipe(recipe, filter_fqns=[])
    targets, left = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if name in shared:
            left[name] = f"weight shared with {', '.join(shared[name])}; kept in high precision"
        elif module.in_features % 16 or module.out_features % 16:
            left[name] = (f"{module.in_features} -> {module.out_features}: float8 matmuls need both dimensions to be "
                          "multiples of 16")
        elif auto is not None and not auto(module, name):
            left[name] = f"{module.in_features} -> {module.out_features}: too small for torchao's {recipe} auto filter"
        else:
            targets.append(name)
    return targets, left


def apply_float8(model: nn.Module, recipe: str = "tensorwise", filter: str = "dims16", emulate: bool = False
                 ) -> tuple[list[str], dict[str, str]]:
    """Swap the targeted Linear layers of ``model`` for torchao's ``Float8Linear``, in place. ``emulate`` (tests only)
    casts to float8 and back around an ordinary matmul, so the swap runs on a CPU."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    targets, left = float8_targets(model, recipe, filter)
    if not targets:
        raise ValueError(f"fp8 found no nn.Linear layer to convert ({len(left)} left: "
                         f"{'; '.join(f'{k}: {v}' for k, v in left.items()) or 'the model has none'})")
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    chosen = set(targets)
    convert_to_float8_training(model, config=config, module_filter_fn=lambda module, fqn: fqn in chosen)
    return targets, left


def count_float8(model: nn.Module) -> int:
    from torchao.float8.float8_linear import Float8Linear

    return sum(isinstance(m, Float8Linear) for m in model.modules())


@register
class FP8(Technique):
    name = "fp8"
    summary = "float8 matmuls in the Linear layers (torchao float8 training; CUDA capability 8.9+); optional extra"
    kind = Kind.NUMERIC
    phase = Phase.PRECISION  # a module converter: before checkpointing, compile and sharding (torchtitan's order)
    own_flops = False  # the same matmuls in float8 (method card)
    hides_tensors = False
    tune_options = ("",)
    conflicts = frozenset({"qat", "sparse24", "prune", "tp"})
    claims = (
        Claim("speedup", 1.10, 1.25, "Llama3-8B, 8xH100, FSDP2 + torch.compile, vs bf16 (rowwise 1.10x, tensorwise "
              "1.25x); up to 1.5x at 512 GPUs / 405B", "torchao float8 README (training benchmarks)",
              needs=("bf16", "compile"), params=8e9, devices=8, over_rest=True),
    )

    @dataclass(frozen=True)
    class Options:
        recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
        filter: Literal["dims16", "auto"] = "dims16"  # auto: also torchao's size thresholds for a speedup

        def __post_init__(self) -> None:
            if self.recipe not in _RECIPES:
                raise ValueError(f"recipe must be one of {', '.join(_RECIPES)}, got {self.recipe!r}")
            if self.filter not in _FILTERS:
                raise ValueError(f"filter must be one of {', '.join(_FILTERS)}, got {self.filter!r}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._targets: list[str] = []
        self._left: dict[str, str] = {}
        self._too_small: list[str] = []
        self._model: nn.Module | None = None

    def check(self, ctx: Context) -> str | None:
        return torchao_missing(ctx) or fp8_device_problem(ctx.device)

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        if problem := fp8_device_problem(ctx.device):
            raise RuntimeError(problem)
        # Which of them torchao's own size filter would skip as too small to gain (asked before the swap)
        auto = set(float8_targets(model, self.options.recipe, "auto")[0])
        self._targets, self._left = apply_float8(model, self.options.recipe, self.options.filter)
        self._too_small = [n for n in self._targets if n not in auto]
        self._model = model
        return model

    def results(self, ctx: Context) -> dict[str, Any] | None:
        if self._model is None:
            return None
        modules = dict(self._model.named_modules())
        converted = sum(modules[n].weight.numel() for n in self._targets)
        total = sum(p.numel() for p in self._model.parameters())
        return {"recipe": self.options.recipe, "filter": self.options.filter,
                "float8_layers": count_float8(self._model), "layers": list(self._targets),
                "left_high_precision": dict(self._left), "weights_in_float8_matmuls": converted,
                "fraction_of_params": round(converted / total, 4) if total else None,
                "too_small_to_gain": len(self._too_small)}

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def setting_caveat(cls, names: tuple[str, ...]) -> str | None:
        """Eager fp8 is not what fp8 is meant to cost: its scaling and casting run as separate kernels."""
        if "compile" in names:
            return None
        return ("fp8 ran without torch.compile: torchao and torchtitan say float8 training needs compile to fuse its "
                "scaling and casting kernels, so this eager number is not what fp8 is meant to cost; measure "
                "bf16+fp8+compile against bf16+compile")

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The recipe, the Linear layers converted to float8 matmuls and their share of the parameters, the layers
        left in high precision, and how many of the converted ones torchao's size filter would skip as too small."""
        first = found[0]
        left = first.get("left_high_precision") or {}
        small = first.get("too_small_to_gain")
        return (f"{first.get('recipe')} recipe: {rd.values([f.get('float8_layers') for f in found])} Linear layers in "
                f"float8 matmuls ({rd.n(first.get('weights_in_float8_matmuls'))} weights, "
                f"{rd.values([f.get('fraction_of_params') for f in found])} of the parameters); "
                f"{len(left)} left in high precision" + (f" ({', '.join(sorted(left)[:3])}"
                                                         f"{', ...' if len(left) > 3 else ''})" if left else "")
                + (f"; torchao's size filter (filter=auto) would skip {small} of them as too small for float8 to "
                   "gain" if small else ""))
