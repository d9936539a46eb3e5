"""2:4 semi-structured sparse training: the targeted Linear weights are pruned to 2:4 at every step, and the
forward and grad_input matmuls run on cuSPARSELt's sparse tensor cores.

Method card
- What: the targeted ``nn.Linear`` layers become ``Sparse24Linear``: each forward casts the fp32 master weight to the
  autocast dtype and prunes it by magnitude to 2:4 in one torch kernel (``_sparse_semi_structured_tile``), so
  forward and grad_input run on cuSPARSELt; grad_weight is dense. A straight-through function hands every weight the
  dense gradient, so the mask is chosen again each step. Needs ``bf16`` or ``fp16``. ``layers=mlp`` (default) or
  ``all``; a layer qualifies when both its sizes are multiples of 128 and its weight is not tied (gpt:tiny has none).
  Algorithmic: evaluation runs the pruned model.
- When it should pay: large MLP matmuls on compute capability 8.0+; the per-step pruning costs time that only large
  matmuls amortise. Refused on CPU. Not measured: the torchao-based version crashed on the one H200
  (`reports/example-h200-first`, its ``pytest-m-gpu.txt``), and this version has not run on a GPU.
- Refused with qat, fp8, prune and several processes.
- Sources: Mishra et al., "Accelerating Sparse Deep Neural Networks", arXiv:2104.08378; torchao 0.18's sparse
  training README (published: 1.06x end to end for ViT-L on one A100, -0.5 points on DINOv2 fully sparse); PyTorch
  semi-structured sparsity docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-sparse24 (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from techniques import _reading as rd
from techniques._model import cuda_capability_problem, shared_weights
from techniques.base import Claim, Context, Kind, Phase, Technique, register

_LAYERS = ("mlp", "all")
KERNELS = ("cusparselt", "reference")
MIN_CAPABILITY = (8, 0)
DIM_MULTIPLE = 128  # cuSPARSELt metadata of _sparse_semi_structured_tile: rows and cols multiples of 128
TILE = 4  # the mask is chosen per 4x4 tile: at most 2 kept in each of its rows and each of its columns
ALGORITHM = "largest_abs_values_greedy"  # the tile kernel's default ("") ranks by signed value, not magnitude
_HALF = (torch.float16, torch.bfloat16)


def sparse24_device_problem(device: torch.device) -> str | None:
    """Why ``device`` cannot run 2:4 sparse training on cuSPARSELt, or None."""
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


# ---- the 2:4 mask, the packing and the straight-through function ------------------------------------------------


def mask24(weight: torch.Tensor) -> torch.Tensor:
    """Which entries of ``weight`` (rows and columns multiples of 4) the magnitude-greedy 2:4 tile pruning keeps: in
    each 4x4 tile, entries by descending ``|w|`` (ties: the earlier in row-major order first), each kept while its row
    and its column of the tile hold fewer than two. What ``largest_abs_values_greedy`` computes on the GPU, in plain
    torch: one vectorised pass per rank within the tiles, over all tiles at once."""
    rows, cols = weight.shape
    if rows % TILE or cols % TILE:
        raise ValueError(f"2:4 tiles need both dimensions to be multiples of {TILE}, got {rows} x {cols}")
    tiles = weight.detach().abs().reshape(rows // TILE, TILE, cols // TILE, TILE).transpose(1, 2).reshape(-1, 16)
    order = torch.sort(tiles, dim=1, descending=True, stable=True).indices
    at = torch.arange(len(tiles), device=weight.device)
    per_row = torch.zeros(len(tiles), TILE, dtype=torch.int64, device=weight.device)
    per_col = torch.zeros_like(per_row)
    keep = torch.zeros(tiles.shape, dtype=torch.bool, device=weight.device)
    for rank in range(16):
        pos = order[:, rank]
        r, c = pos // TILE, pos % TILE
        take = (per_row[at, r] < 2) & (per_col[at, c] < 2)
        keep[at, pos] = take
        per_row[at, r] += take.long()
        per_col[at, c] += take.long()
    return keep.reshape(rows // TILE, cols // TILE, TILE, TILE).transpose(1, 2).reshape(rows, cols)


def cusparselt_tensor(shape: torch.Size, packed: torch.Tensor, meta: torch.Tensor | None, packed_t: torch.Tensor,
                      meta_t: torch.Tensor | None, bitmask: torch.Tensor | None) -> torch.Tensor:
    """The compressed ``W`` and ``W^T`` of the tile kernel as torch's cuSPARSELt tensor. ``torch._cslt_sparse_mm``
    asserts a 2-D compressed operand, while the kernel returns each buffer flat: view them as (rows of that operand,
    kept values and metadata), as ``SparseSemiStructuredTensorCUSPARSELT.prune_dense_static_sort`` does."""
    from torch.sparse import SparseSemiStructuredTensorCUSPARSELT

    rows, cols = shape
    with warnings.catch_warnings():  # torch's "prototype stage" notice, once per process: the card says so already
        warnings.filterwarnings("ignore", message="The PyTorch API of SparseSemiStructuredTensor")
        return SparseSemiStructuredTensorCUSPARSELT(shape, packed=packed.view(rows, -1), meta=meta,
                                                    packed_t=packed_t.view(cols, -1), meta_t=meta_t,
                                                    compressed_swizzled_bitmask=bitmask, requires_grad=False)


def pack_cusparselt(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (fp16/bf16, on a CUDA GPU) pruned to 2:4 by magnitude and compressed for cuSPARSELt."""
    packed, meta, packed_t, meta_t, bitmask = torch._sparse_semi_structured_tile(weight, algorithm=ALGORITHM,
                                                                                 use_cutlass=False)
    return cusparselt_tensor(weight.shape, packed, meta, packed_t, meta_t, bitmask)


def pack_reference(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` with the entries ``mask24`` drops set to zero: a dense tensor, on any device."""
    return weight * mask24(weight)


_PACKERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"cusparselt": pack_cusparselt,
                                                               "reference": pack_reference}


class StraightThrough24(torch.autograd.Function):
    """The forward prunes (``pack``); the backward hands the gradient of the pruned weight on unchanged to the dense
    weight (the straight-through estimator), so pruned weights keep learning and may come back."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, pack: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        return pack(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sparsify24(weight: torch.Tensor, kernels: str = "cusparselt") -> torch.Tensor:
    """``weight`` pruned to 2:4 with a straight-through gradient: compressed for cuSPARSELt, or (``reference``) the
    dense masked weight."""
    if kernels == "cusparselt":
        return _cusparselt_in_graph()(weight)
    return StraightThrough24.apply(weight, _PACKERS[kernels])


@functools.cache
def _cusparselt_in_graph() -> Callable[[torch.Tensor], torch.Tensor]:
    """The cuSPARSELt sparsify as one opaque call under torch.compile (as torchao's was: Dynamo does not trace the
    construction of the sparse tensor); made on first use, since importing Dynamo is slow."""
    return torch._dynamo.allow_in_graph(lambda weight: StraightThrough24.apply(weight, pack_cusparselt))


class Sparse24Linear(nn.Linear):
    """An ``nn.Linear`` that multiplies by its weight pruned to 2:4 each step, in the autocast dtype (fp16/bf16)."""

    kernels: str = "cusparselt"  # "reference": the same mask as a dense masked matmul (numerics only, any device)

    @classmethod
    def from_dense(cls, linear: nn.Linear, kernels: str = "cusparselt") -> Sparse24Linear:
        """The layer holding ``linear``'s own weight and bias Parameters (the optimizer's, unchanged)."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight, layer.bias = linear.weight, linear.bias
        layer.kernels = kernels
        return layer.train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else self.weight.dtype
        if dtype not in _HALF:
            raise RuntimeError(f"sparse24's 2:4 kernels take fp16/bf16 operands, not {dtype}: combine it with "
                               "bf16 or fp16 (autocast)")
        weight = sparsify24(self.weight.to(dtype), self.kernels)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(kind, enabled=False):  # autocast would try to cast the compressed weight
            return F.linear(x.to(dtype), weight, bias)


def apply_sparse24(model: nn.Module, layers: str = "mlp", kernels: str = "cusparselt"
                   ) -> tuple[list[str], dict[str, str]]:
    """Swap the targeted Linear layers of ``model`` for ``Sparse24Linear``, in place: (the layers swapped, {layer:
    why it stays dense}). ``kernels="reference"`` checks numerics on any device and measures no speed."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    targets, left = sparse24_targets(model, layers)
    if not targets:
        scope = "under a module named 'mlp'" if layers == "mlp" else "in the model"
        raise ValueError(f"sparse24 found no nn.Linear layer {scope} to make 2:4 sparse ({len(left)} left dense: "
                         f"{'; '.join(f'{k}: {v}' for k, v in left.items()) or 'none qualifies'}"
                         f"{'; layers=all takes every Linear' if layers == 'mlp' else ''})")
    for name in targets:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, Sparse24Linear.from_dense(getattr(owner, child), kernels))
    return targets, left


@register
class Sparse24(Technique):
    name = "sparse24"
    summary = "2:4 semi-structured sparse training of the MLP Linear layers (torch's cuSPARSELt kernels; CUDA 8.0+)"
    kind = Kind.ALGORITHMIC
    phase = Phase.PRECISION  # a module converter: before checkpointing and compile
    own_flops = False  # dense-equivalent FLOPs (method card)
    hides_tensors = False
    tune_options = ("",)
    conflicts = frozenset({"qat", "fp8", "prune"})
    claims = (
        Claim("speedup", 1.06, 1.06, "ViT-L forward + backward, one A100, fp16 + torch.compile, MLP weights 2:4 vs "
              "dense", "torchao sparsity training README", needs=("compile",), params=3.04e8, devices=1,
              over_rest=True),
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
        if problem := sparse24_device_problem(ctx.device):
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
        modules = dict(self._model.named_modules())
        weights = sum(modules[n].weight.numel() for n in self._targets)
        total = sum(p.numel() for p in self._model.parameters())
        return {"layers_option": self.options.layers,
                "sparse_layers": sum(isinstance(m, Sparse24Linear) for m in self._model.modules()),
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
