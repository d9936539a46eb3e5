"""Quantization-aware training (QAT): train with int8 fake quantization, then convert to a real int8 model.

Method card
- What: before training, every targeted ``nn.Linear`` is swapped for torchao's ``FakeQuantizedLinear`` with
  ``quantize_(model, QATConfig(activation_config=..., weight_config=..., step="prepare"))`` (torchao >= 0.18). Its
  forward quantizes and at once dequantizes (fake-quantizes) both operands before an ordinary fp32 matmul:
  the input per token, asymmetric int8 (``IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False)``:
  for each row, with ``lo = min(min x, 0)`` and ``hi = max(max x, 0)``, ``s = (hi - lo) / 255``, ``z = -128 -
  round(lo / s)``, ``x' = (clamp(round(x / s) + z, -128, 127) - z) s``, recomputed every step); the weight symmetric
  int8 with one scale per output channel (``weight_granularity=per_channel``) or per group of ``group_size`` input
  columns (``per_group``): ``s = max|w| / 127.5`` over the row or group, ``w' = clamp(round(w / s), -128, 127) s``
  (torchao's ``choose_qparams_affine``). The rounding has no gradient; the
  backward pass uses the straight-through estimator (the gradient of ``round`` taken as 1 inside the clamp range), so
  the fp32 master weights keep learning while the loss sees int8 numerics (Jacob et al. 2018). These are the fake
  quantizers torchao itself pairs with ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8)``
  (its ``_infer_fake_quantize_configs``); ``Int8DynamicActivationInt8WeightConfig`` is not accepted as a QAT base
  config in torchao 0.18, hence the explicit fake-quantize configs.
- Which layers: every ``nn.Linear`` except one whose weight Parameter another module also holds. GPT's head is tied to
  the token embedding ``wte``: fake-quantizing it would keep the tie (torchao's ``FakeQuantizedLinear`` reuses the
  Parameter), but the int8 conversion replaces ``head.weight`` by an int8 tensor and cuts the tie (checked: the
  embedding keeps the float table), so the deployed model would hold both and training would simulate a head the
  conversion does not produce. The head stays float, unquantized and tied. ``per_group``: a layer whose
  ``in_features`` is not a multiple of ``group_size`` stays float too (mlp's first layer, 40 inputs, with the default
  32) and is listed in the results; none left at all is an error. torchao's QAT covers ``nn.Linear`` (and
  ``nn.Embedding``, weights only) here, not convolutions: on ``cnn`` only the classifier head is fake-quantized
  and every convolution stays float, so the cnn trial says little about int8 convolutions. Embeddings stay float.
- After training (``results``, once at the end of the trial, on the live model): the fake-quantized model is
  evaluated (what the quality run's curve measured), then a deep copy is converted with ``QATConfig(step="convert")``
  (the fake quantizers removed: the same trained weights as a float model, evaluated), and that float copy is
  quantized for real with ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=
  PerAxis(0) or PerGroup(group_size))`` (int8 weights stored with their scales, int8 per-token asymmetric dynamic
  activations: the scheme the fake quantizers simulated) on the same layers, and evaluated again. The record holds
  the three metrics, the converted layers' weight bytes against their fp32 bytes and the whole model's, and the time
  the conversion took. Checked on gpt:tiny (tests/test_qat.py): the int8 model's val_loss equals the fake-quantized
  model's to 1e-4 relative (the fake quantizers simulate exactly what the conversion computes), and the targeted
  weights shrink to under 30% of their fp32 bytes (1 byte per weight plus an fp32 scale and an int8 zero point per
  row). In a trial that runs the speed window after the quality run, the model at the end has trained
  past the quality run's last evaluation (``trained_steps`` says how far): compare the three metrics with each
  other (the same weights), not with the curve's last point. A conversion that fails leaves its error in the
  record; the trial still counts.
- CPU vs GPU: torchao's ``unpacked_to_int8`` weight format (the default, meant for export to ExecuTorch) runs its
  matmul by dequantizing the weight on the fly, so the converted model's metric is the int8 model's numerics, not an
  int8 kernel's speed; the weights take 1 byte per value plus one fp32 scale (and zero point) per row or group.
- Costs: fake quantization adds elementwise work to every targeted Linear's forward and backward (min/max reductions,
  round, clamp, multiply: several passes over each activation and weight), so a training step is slower than the
  baseline on any device. QAT trains no faster; what it buys is a converted int8 model that loses less quality than
  post-training quantization of a float-trained one. The FLOP count (matmuls) is unchanged (``own_flops`` False),
  and ``compute_dtype`` stays fp32: the matmuls run in fp32 on fake-quantized values.
- Kind: ALGORITHMIC. Fake quantization changes the forward function itself (int8 rounding of activations and weights,
  errors of order 1/255 of each row's range), not just the arithmetic's rounding, and the straight-through gradient
  is not the true gradient: what is learned differs, so the trial is judged by the metric it reaches, not by parity.
- Refused: bf16, fp16 (autocast would round the fake-quantized values again to 16 bits before the matmul, so the
  simulation is no longer the int8 model's arithmetic, and the end-of-trial evaluations, run without autocast, would
  not compare with the curve), fp8 and sparse24 (they swap the same Linear layers), prune (its reparametrised weight
  is not a Parameter the module swap can take over), and several processes (each rank would copy and convert the
  whole model at the end).
- Not implemented: int4 or lower weights (torchao's fake quantizers take them; not offered here), range learning,
  embedding quantization, QAT for only part of training (torchao's ``disable_linear_fake_quant``), the speed of an
  int8 kernel.
- Functional form: ``apply_qat(model, weight_granularity, group_size)`` returns the targeted and the left-out layers.
- Measured (AMD EPYC (AVX2 only); tiny sizes, `--preset quick`, 3 seeds; reports/example-cpu-model-techniques):
  fake quantization cost gpt 0.49x [0.30, 0.79] and mlp 0.26x [0.17, 0.38] of the samples/s (slower) and 1.51x /
  1.32x the memory (more) (cnn: 0.83x [0.47, 1.47], inconclusive; only its head is a Linear); its quality
  differences at equal samples are inconclusive (gpt -0.005 val_loss, cnn -0.007, mlp -0.002), and so are those at
  equal time (gpt +0.34 [+0.11, +0.57], mlp -0.16 [-0.29, -0.02]: p = 0.024 and 0.038 alone, not after Holm's
  correction over each report's comparisons). The int8-converted models
  matched the fake-quantized ones to three digits (gpt val_loss 2.22, 2.38, 2.33 both), with the quantized layers'
  weights 3.8 times smaller (gpt 384 KiB -> 102 KiB: exact byte counts).
- Sources: Jacob et al., "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
  Inference", CVPR 2018 (arXiv:1712.05877); Or, Zhang, Smothers, Khandelwal, Rao, "Quantization-Aware Training for
  Large Language Models with PyTorch", PyTorch blog 2024 (pytorch.org/blog/quantization-aware-training: QAT recovered
  up to 96% of the accuracy degradation on hellaswag and 68% of the perplexity degradation on wikitext for Llama3-8B
  compared to post-training quantization, with int8 dynamic activations and int4 grouped weights); torchao QAT docs
  (``torchao.quantization.qat``: ``QATConfig``, ``IntxFakeQuantizeConfig``).
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
