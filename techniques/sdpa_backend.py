"""sdpa_backend: force one kernel for every ``F.scaled_dot_product_attention`` call of the model.

Method card
- What: the forward (and evaluation) runs inside ``sdpa_kernel(SDPBackend.X)``: every SDPA call uses that kernel or
  raises. ``backend``: ``flash`` (default: the score matrix tiled in fast memory), ``math`` (the reference),
  ``efficient`` and ``cudnn`` (CUDA only). Kind numeric.
- When it should pay: on GPUs, pinning a fused kernel for long sequences in bf16, or forcing ``math`` to see what
  the fused kernels save; not measured on a GPU. On the CPUs here torch already picks ``flash`` (a profiler
  probe), so ``backend=flash`` is the baseline's own kernel there, and at short sequences attention is a small part
  of the step.
- Refused for a model that never calls SDPA, and for a backend that cannot run on the trial's device and dtype.
- Sources: Dao et al., "FlashAttention", NeurIPS 2022 (arXiv:2205.14135); PyTorch docs,
  ``scaled_dot_product_attention`` and ``sdpa_kernel``.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-sdpa_backend (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-bottleneck`: gpt:tiny sdpa_backend:backend=math 0.90x [0.72, 1.11] inconclusive, memory 1.09x more.
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
from torch.nn.attention import SDPBackend, sdpa_kernel

q = k = v = torch.randn(2, 2, 16, 8, requires_grad=True)  # (batch, heads, sequence, head dim): your attention
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # only this kernel (SDPBackend.MATH is the reference)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out.sum().backward()  # the backward runs the kernel the forward chose
```
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from techniques.base import Context, Kind, Phase, Technique, register

BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


DTYPES = ("float32", "bfloat16", "float16")
CHILD_TIMEOUT_S = 180.0  # a child that imports torch and runs a dozen small attentions


def backend_problem(backend: str, device: str, dtype: str = "float32") -> str | None:
    """Why ``backend`` cannot run a small causal attention (forward and backward) on ``device`` in ``dtype``, in
    torch's words, or None when it can. On a CUDA device this process has not initialised (the planner's: it
    launches the trials and holds no CUDA context, ``bench.measure.cuda_caps``), the kernels run in a child process,
    every backend and dtype at once."""
    if device.startswith("cuda") and not torch.cuda.is_initialized():
        return problems_in_child(device).get(f"{backend}/{dtype}", f"the {backend} SDPA kernel was not probed")
    return _probe(backend, device, dtype)


@functools.cache
def problems_in_child(device: str) -> dict[str, str | None]:
    """``{"backend/dtype": problem or None}`` for every backend and dtype on ``device``, probed by
    ``child_main`` in a child process; a child that fails gives its failure as every answer."""
    # -c, not -m: run as __main__ the module would register its technique a second time
    cmd = [sys.executable, "-c", "import sys; from techniques.sdpa_backend import child_main; child_main(sys.argv[1])",
           device]
    root = Path(__file__).resolve().parent.parent
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=root)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1])
        why = f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-2:])
    except subprocess.TimeoutExpired:
        why = f"it ran over {CHILD_TIMEOUT_S:g} s"
    problem = f"the SDPA kernels could not be probed on {device} in a child process ({why})"
    return {f"{b}/{d}": problem for b in BACKENDS for d in DTYPES}


@functools.cache
def _probe(backend: str, device: str, dtype: str) -> str | None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 32, generator=gen).to(device=device, dtype=getattr(torch, dtype))
               .requires_grad_() for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(BACKENDS[backend]):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        except RuntimeError as exc:
            # torch explains in warnings why each kernel declined (CUDA); the error itself names no reason
            why = "; ".join(" ".join(str(w.message).split()) for w in caught[:2]) or str(exc).strip().splitlines()[0]
            return f"the {backend} SDPA kernel cannot run on {device} in {dtype}: {why}"
    return None


@register
class SDPABackend(Technique):
    name = "sdpa_backend"
    tune_options = ("backend=flash", "backend=math", "backend=efficient", "backend=cudnn")
    own_flops = False  # the same attention math in another kernel
    hides_tensors = False
    summary = "one scaled-dot-product-attention kernel (math, flash, efficient, cudnn) for every SDPA call"
    kind = Kind.NUMERIC
    phase = Phase.SURGERY
    # No Claim: FlashAttention's published speedups (Dao et al. 2022: BERT-large +15%, GPT-2 3x on A100s) are against
    # unfused attention, while this harness's baseline already lets SDPA pick its fused kernel (flash on CPU), so
    # the claims table would compare flash with itself (and math with a claim it never made).
    @dataclass(frozen=True)
    class Options:
        backend: Literal["math", "flash", "efficient", "cudnn"] = "flash"

    def check(self, ctx: Context) -> str | None:
        if ctx.structure is not None and ctx.structure.calls_sdpa is False:  # None: not known, not refused
            return (f"workload '{ctx.workload}' is a model without attention (its description: "
                    f"{ctx.structure.source or 'unknown'}): it never calls F.scaled_dot_product_attention, so no kernel "
                    "is chosen")
        if self.options.backend in ("efficient", "cudnn") and not ctx.is_cuda:
            return (f"the {self.options.backend} SDPA kernel exists only in CUDA builds; on {ctx.device.type} "
                    "use backend=math or backend=flash")
        dtype = ("bfloat16" if "bf16" in ctx.technique_names else
                 "float16" if "fp16" in ctx.technique_names else "float32")
        return backend_problem(self.options.backend, str(ctx.device), dtype)

    def forward_context(self, ctx: Context) -> contextlib.AbstractContextManager[Any]:
        return sdpa_kernel(BACKENDS[self.options.backend])


def child_main(device: str) -> None:
    """The child of ``problems_in_child``: every backend and dtype on ``device``, one JSON line on stdout."""
    print(json.dumps({f"{b}/{d}": _probe(b, device, d) for b in BACKENDS for d in DTYPES}))
