"""float8 training with torchao: the Linear layers' matmuls run in fp8 on GPUs with fp8 tensor cores.

Method card
- What: ``torchao.float8.convert_to_float8_training`` swaps the targeted ``nn.Linear`` layers for ``Float8Linear``
  (the same weight and bias Parameters). In each of the three matmuls of a Linear (output, grad_input, grad_weight)
  both operands are scaled and cast to float8 just before ``torch._scaled_mm``: inputs and weights to e4m3, output
  gradients to e5m2 (Micikevicius et al. 2022), with dynamic scales ``s = fp8_max / amax`` computed from the tensor
  itself each step; the product is accumulated in higher precision and unscaled. ``recipe=tensorwise`` (torchao's
  default: one scale per tensor, cuBLAS kernel, fastest) or ``recipe=rowwise`` (one scale per row, e4m3 everywhere,
  scales rounded down to powers of two, CUTLASS kernel: more robust to outliers, slower), from
  ``Float8LinearConfig.from_recipe_name``. Master weights, the optimizer and every non-Linear op keep their dtype
  (fp32 here, or bf16 under ``bf16`` autocast, the combination torchtitan trains with).
- Which layers (``filter=dims16``, default): every ``nn.Linear`` whose in_features and out_features are multiples of 16
  (``torch._scaled_mm``'s requirement) and whose weight no other module holds. GPT's head is tied to ``wte`` and
  stays in high precision (torchtitan leaves its output layer out of float8 by default too: the logits are the most
  precision-sensitive matmul). ``filter=auto`` applies torchao's ``_auto_filter_for_recipe`` on top: it also skips
  layers its H100 microbenchmarks found too small to gain (tensorwise: K <= 4096 and N <= 1024; rowwise: N <= 2048
  or K <= 1024, ...); on this project's workloads up to gpt:small that leaves nothing, which is an error.
- When it helps: large matmuls on GPUs with fp8 tensor cores (NVIDIA Ada and Hopper, compute capability 8.9+; twice
  the bf16 peak on H100). The scaling and casting add memory-bound passes (amax reductions, casts), which only large
  M, K, N amortise; torchao's README has published its own benchmark: small shapes (M, K, N = 1024, 2048, 1024) ran at 0.80x and large ones (4096,
  8192, 16384) at 1.39x of bf16 on an H100. torchao and torchtitan say float8 training needs ``torch.compile`` to
  fuse the scaling and casting kernels: eager fp8 is not what fp8 is meant to cost, and the report says so beside
  every set that holds fp8 without ``compile`` (``setting_caveat``). Compare ``bf16+fp8+compile`` with
  ``bf16+compile``: the claims check measures fp8 against the same set without it, paired by seed, and names the
  claim's conditions the setting does not meet (compile, an 8B model, 8 GPUs). On the workloads here expect a
  slowdown even compiled: torchao's tensorwise size filter (skip when K <= 4096 and N <= 1024) would skip half the
  Linear layers of gpt:gpt2-124m (each block's two 768-wide output projections), and the other half (768 -> 2304
  and 768 -> 3072) are far from the shapes where fp8 gained. The technique's results count the layers the filter
  would skip.
- CPU: not offered. torchao can emulate float8 (``Float8LinearConfig(emulate=True)``: casts to fp8 and back around an
  ordinary matmul), which would measure fp8's numerics, not its speed, so on a CPU or an older GPU the technique is
  skipped with its reason (the tests use the emulation to check the layer swap).
- Kind: NUMERIC, like bf16: the same model and training, with matmul operands rounded to 8 bits (e4m3: 3 mantissa
  bits); loss drift against the baseline is recorded, not failed.
- FLOPs: the same matmuls (``own_flops`` False). ``compute_dtype`` stays unset (the harness calibrates no float8 peak
  yet): MFU is measured against the set's other dtype (bf16's peak with ``bf16``, fp32's alone), so it is not an
  fp8 utilisation.
- Refused: qat and sparse24 (they swap the same Linear layers), prune (its reparametrised weight is no Parameter),
  tp (float8 needs its own tensor-parallel plans, ``Float8ColwiseParallel``, not wired up here).
- Not implemented: delayed or static scaling, ``rowwise_with_gw_hp``, float8 all-gather with FSDP2
  (``enable_fsdp_float8_all_gather``), MX formats.
- Functional form: ``apply_float8(model, recipe, filter)``.
- Measured on one H200 (torch 2.11, torchao 0.18, 2026-12-04; reports/example-h200-first), gpt:gpt2-124m at batch
  8, eager (no compile): bf16+fp8 0.68x [0.59, 0.78] of fp32, slower (3 pairs), and 0.17x [0.13, 0.23] of bf16, no
  verdict (2 pairs); its phase pass timed a 181 ms step against bf16's 31 ms (medians, no verdict). Its GPU tests
  passed there (reports/example-h200-first/pytest-m-gpu.txt). ``bf16+fp8+compile`` has not run yet.
- Sources: Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433 (2022); torchao float8 README
  (github.com/pytorch/ao/tree/main/torchao/float8: "e2e pretraining throughput speedups of up to 1.5x at 512 GPU /
  405B parameter count scale, and up to 1.25x at 8 GPU / 8B parameter count scale", with torch.compile; its
  torchtitan table for Llama3-8B on 8xH100 with FSDP2: +25.03% tokens/s with tensorwise and float8 all-gather,
  +10.05% with rowwise, over bf16); PyTorch blog, "Supercharging Training using float8 and FSDP2" (2024).
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
