"""sdpa_backend: force one kernel for every ``F.scaled_dot_product_attention`` call of the model.

Method card
- What: the forward runs inside ``torch.nn.attention.sdpa_kernel(SDPBackend.X)`` (the technique's
  ``forward_context``, which the harness also enters around evaluation), so every SDPA call may use only that
  kernel; a call it cannot serve raises "No available kernel" instead of falling back. The backward runs the
  kernel the forward chose (autograd recorded it). Backends: ``math`` (the composite reference in plain ATen ops;
  it materialises the T x T score matrix), ``flash`` (FlashAttention: tiles queries and keys so the score matrix
  never leaves fast memory, with an online softmax), ``efficient`` (xFormers' memory-efficient attention) and
  ``cudnn`` (cuDNN's fused attention). Without the technique PyTorch picks a kernel per call from what the inputs
  allow.
- Option: ``backend`` defaults to ``flash``: the one fused kernel both the CPU and the CUDA builds ship (CUDA: sm80+,
  fp16/bf16) and the one the method's paper describes, so the bare label means "force FlashAttention"; ``math`` is
  the reference the fused kernels are judged against.
- When it helps: on GPUs, pinning the kernel a model should get (flash for long sequences in bf16), or showing what
  the fused kernels save by forcing ``math``. FlashAttention's paper reports (published) end-to-end training 15% faster than the
  MLPerf 1.1 BERT-large record (sequence 512) and 3x faster GPT-2 (sequence 1K) than Hugging Face's, with memory
  linear instead of quadratic in the sequence length. With a short sequence (gpt:tiny: 64) the attention is a small
  part of the step, so little changes.
- Check: refuses a model whose description (``bench.core.structure``) says it never calls SDPA (the built-in ``mlp``,
  ``cnn``); ``gpt`` and ``hf`` (transformers' ``attn_implementation="sdpa"``) call it (a user's model is not
  known and is not refused), and the kernel choice was seen taking effect in both. Refuses ``efficient``
  and ``cudnn`` off CUDA, and any backend that cannot run a small causal attention (forward and backward, head dim
  32, the set's dtype: fp32, or bf16/fp16 with those techniques) on the trial's device, with torch's reason; the
  probe runs once per backend, device and dtype. A user's model that never calls SDPA runs unchanged under it.
- On this CPU (torch 2.13.0+cpu): ``math`` and ``flash`` run forward and backward (ops
  ``aten::_scaled_dot_product_attention_math`` and ``aten::_scaled_dot_product_flash_attention_for_cpu`` with its
  ``_backward``); ``efficient``, ``cudnn`` (and ``OVERRIDEABLE``) raise "No viable backend for
  scaled_dot_product_attention was found". The baseline already picks ``flash`` here (torch.profiler on a gpt:tiny
  and an hf:tiny step), so ``backend=flash`` is the baseline's own kernel on CPU.
- Kind ``numeric``: kernels sum in different orders. Measured on gpt:tiny (seed 0, 8 steps, against the baseline):
  ``flash`` bit-identical (the same kernel), ``math`` up to 7.2e-7 apart (2.0e-7 relative); the harness's parity
  check passes. On a GPU the default choice is another kernel (flash, efficient or cudnn by device and dtype), so
  there ``flash`` may differ from the baseline too.
- Measured (reports/example-cpu-bottleneck, AMD EPYC (AVX2 only), gpt:tiny: batch 16, sequence 64, 2 layers, 2
  heads of dim 32, 5 repeats): ``backend=math`` 0.90x [0.72, 1.11] of the baseline's samples/s, inconclusive. At
  sequence 64 attention is a small part of the step; probes of the attention alone (not committed) found the fused
  kernel quicker at longer sequences. Not yet run on a GPU.
- Sources: Dao, Fu, Ermon, Rudra and Re, "FlashAttention: Fast and Memory-Efficient Exact Attention with
  IO-Awareness", NeurIPS 2022 (arXiv:2205.14135); PyTorch docs, ``torch.nn.functional.scaled_dot_product_attention``
  and ``torch.nn.attention.sdpa_kernel``.

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
