"""Quantization-aware training (QAT): train with int8 fake quantization, then convert to a real int8 model.

Method card
- What: torchao's ``QATConfig`` swaps every ``nn.Linear`` (but a tied head) for a ``FakeQuantizedLinear``: inputs
  per token, asymmetric int8; weights symmetric int8 per channel (or per group of ``group_size`` columns). The
  rounding passes the gradient straight through, so fp32 master weights learn int8 numerics. After training the
  record evaluates the fake-quantized model and a real int8 conversion, with its weight bytes. Convolutions stay
  float (on ``cnn`` only the head is quantized). Algorithmic.
- When it should pay: never in training speed, on any device: fake quantization adds passes over every Linear's
  operands. What it buys is an int8 model that loses less quality than post-training quantization.
- Refused with bf16, fp16 (autocast would round the simulated values again), fp8, sparse24, prune and several
  processes. Optional extra ``trainbench[torchao]``.
- Sources: Jacob et al., CVPR 2018 (arXiv:1712.05877); Or et al., "Quantization-Aware Training for Large Language
  Models with PyTorch", PyTorch blog 2024 (published: up to 96% of the hellaswag loss of post-training quantization
  recovered for Llama3-8B); torchao QAT docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-qat (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny 0.83x [0.47, 1.47] inconclusive, memory 1.00x equivalent.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny 0.49x [0.30, 0.79] slower, memory 1.51x more.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/mlp`: mlp:tiny 0.26x [0.17, 0.38] slower, memory 1.32x more.
<!-- end generated -->
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from techniques import _reading as rd
from techniques._model import TORCHAO_MISSING, shared_weights, torchao_missing  # noqa: F401  (re-exported)
from techniques.base import Context, Kind, Phase, Probe, Technique, TrainConfig, register

_GRANULARITIES = ("per_channel", "per_group")


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held by ``tensors``, looking inside torchao's tensor subclasses (int8 data, scales, zero points)."""
    total = 0
    for t in tensors:
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            total += tensor_bytes(getattr(t, n) for n in names)
        else:
            total += t.numel() * t.element_size()
    return total


def model_bytes(model: nn.Module) -> int:
    return tensor_bytes([*model.parameters(), *model.buffers()])


def qat_targets(model: nn.Module, weight_granularity: str, group_size: int) -> tuple[list[str], dict[str, str]]:
    """(the Linear layers to fake-quantize, {layer: why it stays float} for the others)."""
    shared = shared_weights(model)
    targets, left = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if name in shared:
            left[name] = (f"weight shared with {', '.join(shared[name])}: the int8 conversion would untie it; "
                          "kept float")
        elif weight_granularity == "per_group" and module.in_features % group_size:
            left[name] = f"in_features {module.in_features} is not a multiple of group_size {group_size}; kept float"
        else:
            targets.append(name)
    return targets, left


def _weight_granularity(weight_granularity: str, group_size: int) -> Any:
    from torchao.quantization.granularity import PerAxis, PerGroup

    return PerGroup(group_size) if weight_granularity == "per_group" else PerAxis(0)


def apply_qat(model: nn.Module, weight_granularity: str = "per_channel", group_size: int = 32
              ) -> tuple[list[str], dict[str, str]]:
    """Swap the targeted Linear layers of ``model`` for torchao's fake-quantized ones (int8 per-token asymmetric
    activations, int8 symmetric weights per channel or per group), in place. Returns ``qat_targets``'s answer."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import IntxFakeQuantizeConfig, QATConfig

    targets, left = qat_targets(model, weight_granularity, group_size)
    if not targets:
        raise ValueError(f"qat found no nn.Linear layer to fake-quantize ({len(left)} left float: "
                         f"{'; '.join(f'{k}: {v}' for k, v in left.items()) or 'the model has none'})")
    activations = IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)
    weights = IntxFakeQuantizeConfig(torch.int8, _weight_granularity(weight_granularity, group_size),
                                     is_symmetric=True)
    chosen = set(targets)
    quantize_(model, QATConfig(activation_config=activations, weight_config=weights, step="prepare"),
              filter_fn=lambda module, fqn: fqn in chosen and isinstance(module, nn.Linear))
    return targets, left


def count_fake_quantizers(model: nn.Module) -> tuple[int, int]:
    """(fake-quantized Linear layers, fake quantizers) in ``model``."""
    from torchao.quantization.qat.fake_quantizer import FakeQuantizerBase
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    layers = sum(isinstance(m, FakeQuantizedLinear) for m in model.modules())
    return layers, sum(isinstance(m, FakeQuantizerBase) for m in model.modules())


@torch.no_grad()
def _metrics(evaluate: Callable[[nn.Module], dict[str, float]], model: nn.Module) -> dict[str, float]:
    was_training = model.training
    model.eval()
    try:
        return {k: float(v) for k, v in evaluate(model).items()}
    finally:
        model.train(was_training)


@register
class QAT(Technique):
    name = "qat"
    summary = "int8 quantization-aware training (torchao fake quantization), then a real int8 conversion; optional extra"
    kind = Kind.ALGORITHMIC
    phase = Phase.PRECISION  # a module converter: before checkpointing and compile (torchtitan's order)
    own_flops = False  # fake quantizers add no matmuls (method card)
    hides_tensors = False
    tune_options = ("",)
    conflicts = frozenset({"bf16", "fp16", "fp8", "sparse24", "prune"})

    @dataclass(frozen=True)
    class Options:
        weight_granularity: Literal["per_channel", "per_group"] = "per_channel"
        group_size: int = 32  # per_group only: input columns per weight scale; must divide a layer's in_features

        def __post_init__(self) -> None:
            if self.weight_granularity not in _GRANULARITIES:
                raise ValueError(f"weight_granularity must be one of {', '.join(_GRANULARITIES)}, "
                                 f"got {self.weight_granularity!r}")
            if self.group_size < 1:
                raise ValueError(f"group_size must be >= 1, got {self.group_size}")
            if self.weight_granularity == "per_channel" and self.group_size != 32:
                raise ValueError(f"group_size={self.group_size} applies to weight_granularity=per_group only "
                                 "(per_channel has one scale per output channel)")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._model: nn.Module | None = None
        self._evaluate: Callable[[nn.Module], dict[str, float]] | None = None
        self._targets: list[str] = []
        self._left: dict[str, str] = {}

    def check(self, ctx: Context) -> str | None:
        if missing := torchao_missing(ctx):
            return missing
        if ctx.world_size > 1:
            return "qat runs on one process (each rank would copy and convert the whole model at the end)"
        return None

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        # The held-out evaluation, kept for results(): a closure over the workload's held-out data, not its model.
        self._evaluate = probe.fresh().evaluate
        return cfg

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        o = self.options
        self._targets, self._left = apply_qat(model, o.weight_granularity, o.group_size)
        self._model = model
        return model

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        layers, quantizers = count_fake_quantizers(self._model) if self._model is not None else (0, 0)
        out: dict[str, Any] = {
            "weight_granularity": o.weight_granularity,
            "group_size": o.group_size if o.weight_granularity == "per_group" else None,
            "fake_quantized_layers": layers, "fake_quantizers": quantizers,
            "layers": list(self._targets), "left_float": dict(self._left),
            "trained_steps": ctx.step, "metric": ctx.metric or None,
        }
        if self._model is None or self._evaluate is None:
            out["conversion_error"] = "no model or evaluation to convert (transform_model or tune did not run)"
            return out
        try:
            out.update(self._convert_and_evaluate(self._model, self._evaluate))
        except Exception as exc:  # the trial's own result stands; the record says why the conversion failed
            out["conversion_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return out

    def _convert_and_evaluate(self, model: nn.Module, evaluate: Callable[[nn.Module], dict[str, float]]
                              ) -> dict[str, Any]:
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
        from torchao.quantization.qat import QATConfig

        o = self.options
        metrics = {"fake_quant": _metrics(evaluate, model)}
        started = time.perf_counter()
        converted = copy.deepcopy(model)
        quantize_(converted, QATConfig(step="convert"))  # FakeQuantizedLinear -> nn.Linear, the same weights
        convert_s = time.perf_counter() - started
        left = count_fake_quantizers(converted)
        if left != (0, 0):
            raise RuntimeError(f"the convert step left {left[0]} fake-quantized layers behind")
        metrics["float"] = _metrics(evaluate, converted)
        chosen = set(self._targets)
        modules = dict(converted.named_modules())
        float_weights = tensor_bytes(modules[name].weight for name in self._targets)
        float_model = model_bytes(converted)
        ptq = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int8, weight_granularity=_weight_granularity(o.weight_granularity, o.group_size))
        started = time.perf_counter()
        quantize_(converted, ptq, filter_fn=lambda module, fqn: fqn in chosen and isinstance(module, nn.Linear))
        convert_s += time.perf_counter() - started
        modules = dict(converted.named_modules())
        metrics["int8"] = _metrics(evaluate, converted)
        return {
            "metrics": metrics,
            "conversion": (f"Int8DynamicActivationIntxWeightConfig(weight_dtype=int8, {o.weight_granularity}), "
                           "int8 per-token asymmetric dynamic activations"),
            "converted_weight_type": type(modules[self._targets[0]].weight).__name__,
            "weight_bytes": {"float": float_weights,
                             "int8": tensor_bytes(modules[name].weight for name in self._targets)},
            "model_bytes": {"float": float_model, "int8": model_bytes(converted)},
            "convert_s": round(convert_s, 4),  # the copy, the convert step and the int8 quantization, no evaluation
        }

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The fake-quantized layers; the metric with fake-quant, float and int8 weights; the weights' bytes before
        and after."""
        first = found[0]
        metric = first.get("metric") or ""
        errors = [f["conversion_error"] for f in found if f.get("conversion_error")]
        if errors:
            return f"{first.get('fake_quantized_layers')} Linear layers fake-quantized; conversion failed: {errors[0]}"

        def of(kind: str) -> str:
            return rd.values([((f.get("metrics") or {}).get(kind) or {}).get(metric) for f in found])

        wb = first.get("weight_bytes") or {}
        return (f"{first.get('fake_quantized_layers')} Linear layers fake-quantized; {metric} at the trial's end (after "
                f"{rd.values([f.get('trained_steps') for f in found])} steps: the quality run's and the timed window's): "
                f"fake-quant {of('fake_quant')}, float weights {of('float')}, int8 converted {of('int8')}; those layers' "
                f"weights {rd.small_bytes(wb.get('float'))} -> {rd.small_bytes(wb.get('int8'))}")
