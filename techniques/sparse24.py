"""2:4 semi-structured sparse training with torchao: the targeted Linear weights are pruned to 2:4 at every step.

Method card
- What: the targeted ``nn.Linear`` layers are swapped for a subclass of torchao's ``SemiSparseLinear``
  (``torchao.sparsity.training.swap_linear_with_semi_sparse_linear(model, {fqn: cls})``; the same weight and bias
  Parameters). Every forward prunes the current dense weight to the 2:4 pattern and compresses it
  (``semi_structured_sparsify(weight, backend="cusparselt")``, PyTorch's ``_sparse_semi_structured_tile`` kernel):
  in each 4x4 tile the values are taken greedily by magnitude while a row and a column hold fewer than two, so both
  ``W`` and ``W^T`` are 2:4 and the backward's transposed matmul (grad_input = grad_output @ W) is sparse too. The
  forward and grad_input matmuls run on cuSPARSELt's sparse tensor cores; grad_weight is a dense matmul. The pruning
  has no gradient of its own: the straight-through estimator hands the dense gradient to every weight, pruned or not,
  so the dense fp32 master weights keep learning and the mask is recomputed from them each step (runtime
  sparsity, the recipe of torchao's sparse-training README and xFormers' ``sparsify24``). Evaluation runs the same
  forward: the metric is the 2:4-pruned model's.
- fp32 master weights: cuSPARSELt's 2:4 kernels take fp16/bf16 operands, and autocast cannot cast a compressed tensor,
  so torchao's ``SemiSparseLinear`` (written for a model cast to fp16/bf16) would fail on this harness's fp32 weights
  under autocast. The subclass here casts the weight to the autocast dtype first (a differentiable cast: the gradient
  reaches the fp32 Parameter), then sparsifies, and runs the matmul on 16-bit operands. Hence the set needs ``bf16`` or
  ``fp16``.
- Which layers: ``layers=mlp`` (default) takes the Linear layers under a module named ``mlp`` (the transformer
  blocks' feed-forward: the configuration the torchao README found acceptable for DINO ViT training); ``layers=all``
  takes every Linear. In both, a layer qualifies only if its weight is held by no other module (GPT's head, tied to
  ``wte``, stays dense) and both its dimensions are multiples of 128: the cuSPARSELt metadata layout of
  ``_sparse_semi_structured_tile`` checks "rows/cols multiples of 128" (PyTorch's SparseSemiStructuredTile.cu). So
  gpt:tiny (d_model 64) has no qualifying layer (an error); gpt:small (256 -> 1024 -> 256) and gpt2-124m qualify, and
  on mlp ``layers=all`` takes the 256x256 (tiny) or 1024x1024 (small) hidden layers. cnn's convolutions are never
  sparsified.
- When it helps: large MLP matmuls on Ampere and newer GPUs (compute capability 8.0+). The per-step pruning and
  compression cost time of their own, which only large matmuls amortise; the README measures 1.24x and 1.27x on the
  two ViT-L MLP linear shapes (13008 x 1024 x 4096, A100, fp16) but 1.06x end to end (ViT-L forward + backward,
  torch.compile, fp16), and memory slightly up (58.5 to 59.4 GB). Expect a slowdown on the small workloads here.
- CPU: not offered (the sparsification and the sparse matmuls are CUDA kernels); skipped with its reason.
- Kind: ALGORITHMIC: the forward uses a pruned weight (half of each targeted matrix is zero), so what is learned
  changes; judged by the metric it reaches. The README's DINOv2 ImageNet run lost 0.5 pp accuracy fully 2:4-trained.
- FLOPs: counted on the workload's dense model (``own_flops`` False): MFU is in dense-equivalent FLOPs, the
  convention for sparse speedups (the sparse matmuls do half the multiply-adds, and the FLOP counter does not see
  inside cuSPARSELt's kernels).
- Refused: qat and fp8 (they swap the same Linear layers), prune (it masks the same weights its own way), and several
  processes (runtime 2:4 sparsification of sharded DTensor weights is untried here).
- Not implemented: activation sparsity (``SemiSparseActivationLinear``), switching to dense training for the end of
  the run (the README's recipe for -0.1 pp instead of -0.5 pp), exporting the 2:4 model.
- Functional form: ``apply_sparse24(model, layers)``.
- Measured: nothing yet: refused on CPU with the reason. The CUDA path has not been run in this project yet: the
  machine it was written on has no GPU.
- Sources: Mishra et al., "Accelerating Sparse Deep Neural Networks", arXiv:2104.08378 (2021); torchao sparsity
  training README (github.com/pytorch/ao/tree/main/torchao/sparsity/training: "a 6% e2e speedup on a single NVIDIA
  A100" for ViT-L with MLP weights 2:4, 1.24x and 1.27x on its MLP linear shapes; DINOv2 -0.5 pp fully sparse,
  -0.1 pp with a dense finish); PyTorch ``torch.sparse`` semi-structured sparsity docs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from techniques import _reading as rd
from techniques._model import cuda_capability_problem, shared_weights, torchao_missing
from techniques.base import Claim, Context, Kind, Phase, Technique, register

_LAYERS = ("mlp", "all")
MIN_CAPABILITY = (8, 0)
DIM_MULTIPLE = 128  # cuSPARSELt metadata of _sparse_semi_structured_tile: rows and cols multiples of 128
_HALF = (torch.float16, torch.bfloat16)


def sparse24_device_problem(device: torch.device) -> str | None:
    """Why ``device`` cannot run torchao's 2:4 sparse training, or None."""
    problem = cuda_capability_problem(device, MIN_CAPABILITY, "2:4 sparse kernels need a CUDA GPU with compute "
                                      "capability 8.0+ (Ampere or newer)")
    if problem:
        return problem
    if not torch.backends.cusparselt.is_available():
        return "this torch build has no cuSPARSELt (torch.backends.cusparselt), which the 2:4 matmuls run on"
    return None


def sparse24_targets(model: nn.Module, layers: str) -> tuple[list[str], dict[str, str]]:
    """(the Linear layers to make 2:4 sparse, {layer: why it stays dense} for the other candidates)."""
    shared = shared_weights(model)
    targets, left = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if layers == "mlp" and "mlp" not in name.split("."):
            continue
        if name in shared:
            left[name] = f"weight shared with {', '.join(shared[name])}; kept dense"
        elif module.in_features % DIM_MULTIPLE or module.out_features % DIM_MULTIPLE:
            left[name] = (f"{module.in_features} -> {module.out_features}: the 2:4 kernels need both dimensions to be "
                          f"multiples of {DIM_MULTIPLE}; kept dense")
        else:
            targets.append(name)
    return targets, left


def _sparsify(weight: torch.Tensor) -> torch.Tensor:
    """The weight pruned to 2:4 and compressed for cuSPARSELt (straight-through gradient). Tests replace it."""
    from torchao.sparsity.training.autograd import semi_structured_sparsify

    return semi_structured_sparsify(weight, backend="cusparselt")


@functools.cache
def semi_sparse_linear_class() -> type[nn.Linear]:
    """torchao's ``SemiSparseLinear`` for fp32 master weights under autocast (built once, on first use: torchao is
    imported lazily)."""
    from torchao.sparsity.training import SemiSparseLinear

    class AutocastSemiSparseLinear(SemiSparseLinear):
        """Casts the weight to the autocast dtype (fp16/bf16) before pruning it to 2:4, then multiplies in that dtype."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            kind = x.device.type
            dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.weight.dtype
            if dtype not in _HALF:
                raise RuntimeError(f"sparse24's 2:4 kernels take fp16/bf16 operands, not {dtype}: combine it with "
                                   "bf16 or fp16 (autocast)")
            weight = _sparsify(self.weight.to(dtype))
            bias = None if self.bias is None else self.bias.to(dtype)
            with torch.autocast(kind, enabled=False):  # autocast would try to cast the compressed weight
                return F.linear(x.to(dtype), weight, bias)

    return AutocastSemiSparseLinear


def apply_sparse24(model: nn.Module, layers: str = "mlp") -> tuple[list[str], dict[str, str]]:
    """Swap the targeted Linear layers of ``model`` for the 2:4 sparse ones, in place."""
    from torchao.sparsity.training import swap_linear_with_semi_sparse_linear

    targets, left = sparse24_targets(model, layers)
    if not targets:
        scope = "under a module named 'mlp'" if layers == "mlp" else "in the model"
        raise ValueError(f"sparse24 found no nn.Linear layer {scope} to make 2:4 sparse ({len(left)} left dense: "
                         f"{'; '.join(f'{k}: {v}' for k, v in left.items()) or 'none qualifies'}"
                         f"{'; layers=all takes every Linear' if layers == 'mlp' else ''})")
    cls = semi_sparse_linear_class()
    swap_linear_with_semi_sparse_linear(model, {name: cls for name in targets})
    return targets, left


@register
class Sparse24(Technique):
    name = "sparse24"
    summary = "2:4 semi-structured sparse training of the MLP Linear layers (torchao, cuSPARSELt); optional extra"
    kind = Kind.ALGORITHMIC
    phase = Phase.PRECISION  # a module converter: before checkpointing and compile
    own_flops = False  # dense-equivalent FLOPs (method card)
    hides_tensors = False
    tune_options = ("",)
    conflicts = frozenset({"qat", "fp8", "prune"})
    claims = (
        Claim("speedup", 1.06, 1.06, "ViT-L forward + backward, one A100, fp16 + torch.compile, MLP weights 2:4 vs "
              "dense", "torchao sparsity training README"),
    )

    @dataclass(frozen=True)
    class Options:
        layers: Literal["mlp", "all"] = "mlp"  # mlp: Linear layers under a module named 'mlp'; all: every Linear

        def __post_init__(self) -> None:
            if self.layers not in _LAYERS:
                raise ValueError(f"layers must be one of {', '.join(_LAYERS)}, got {self.layers!r}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._targets: list[str] = []
        self._left: dict[str, str] = {}
        self._model: nn.Module | None = None

    def check(self, ctx: Context) -> str | None:
        if problem := torchao_missing(ctx) or sparse24_device_problem(ctx.device):
            return problem
        if ctx.world_size > 1:
            return "sparse24 runs on one process (2:4 sparsification of sharded weights is untried here)"
        if not {"bf16", "fp16"} & set(ctx.technique_names):
            return ("needs bf16 or fp16 in the set: the 2:4 kernels take 16-bit operands (e.g. bf16+sparse24); the "
                    "fp32 master weights are cast under autocast")
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        if problem := sparse24_device_problem(ctx.device):
            raise RuntimeError(problem)
        self._targets, self._left = apply_sparse24(model, self.options.layers)
        self._model = model
        return model

    def results(self, ctx: Context) -> dict[str, Any] | None:
        if self._model is None:
            return None
        cls = semi_sparse_linear_class()
        modules = dict(self._model.named_modules())
        weights = sum(modules[n].weight.numel() for n in self._targets)
        total = sum(p.numel() for p in self._model.parameters())
        return {"layers_option": self.options.layers,
                "sparse_layers": sum(isinstance(m, cls) for m in self._model.modules()),
                "layers": list(self._targets), "left_dense": dict(self._left),
                "weights_2to4": weights, "fraction_of_params": round(weights / total, 4) if total else None}

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The Linear layers trained 2:4 sparse and their share of the parameters, and the layers left dense."""
        first = found[0]
        left = first.get("left_dense") or {}
        return (f"layers={first.get('layers_option')}: {rd.values([f.get('sparse_layers') for f in found])} Linear "
                f"layers 2:4 sparse ({rd.n(first.get('weights_2to4'))} weights, "
                f"{rd.values([f.get('fraction_of_params') for f in found])} of the parameters); "
                f"{len(left)} left dense" + (f" ({', '.join(sorted(left)[:3])}{', ...' if len(left) > 3 else ''})"
                                             if left else ""))
