"""torch.compile: capture the model with TorchDynamo and generate fused kernels with Inductor.

Method card
- What: ``torch.compile(model, mode=...)``. The first steps compile, a one-off cost reported apart; later steps run
  generated code. Under ``zero2``/``zero3`` each block compiles before sharding. The record counts the graphs
  captured: a model Dynamo cannot trace (``nn.LSTM``) runs eager, and the report says so.
- When it should pay: steps dominated by small ops that fuse (norms, activations) or by kernel launches
  (``mode=reduce-overhead``: CUDA graphs). On one H200 it ran only with ``bf16`` (`reports/example-h200-first`). On
  a short run compiling can cost more than it saves; time to target with one-off costs says which.
- Caveats: a set's first trial compiles from a cold Inductor cache, the later ones reuse it. Compiled trials report
  RSS and CUDA peaks only: the tensor tracker cannot see inside the graphs.
- Sources: Ansel et al., "PyTorch 2", ASPLOS 2024; the PyTorch 2.0 announcement (published: +21% fp32 and +51% AMP
  training speed over 163 models on an A100).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-compile (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu`: cnn:tiny 1.00x [0.66, 1.53] inconclusive, memory 1.23x [1.20, 1.26] more (RSS); gpt:tiny 0.86x [0.33, 2.26] inconclusive, memory 1.25x [1.23, 1.26] more (RSS); mlp:tiny 0.86x [0.65, 1.12] inconclusive, memory 1.24x [1.23, 1.25] more (RSS).
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-auto`: cnn:tiny 0.95x [0.50, 1.82] inconclusive, memory 1.20x [1.17, 1.23] more (RSS); gpt:tiny 0.96x [0.69, 1.34] inconclusive, memory 1.24x [1.23, 1.25] more (RSS); mlp:tiny 0.85x [0.70, 1.03] inconclusive, memory 1.23x more (RSS).
<!-- end generated -->

In your own training loop (plain PyTorch; ``tests/test_snippets.py`` runs it):

```python
compiled = torch.compile(model)  # the first steps compile (a one-off cost); later steps run generated code
for x, y in batches:
    loss = loss_fn(compiled(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from techniques import _reading as rd
from techniques._distributed import FSDP_TECHNIQUES
from techniques.base import Bottleneck, Claim, Context, Kind, Phase, Remedy, Technique, model_blocks, register


@register
class Compile(Technique):
    name = "compile"
    summary = "torch.compile (TorchDynamo + Inductor)"
    kind = Kind.EXACT
    phase = Phase.COMPILE
    slot = "compiler"
    hides_tensors = True
    own_flops = False
    tune_options = ("",)
    claims = (
        Claim("speedup", 1.21, 1.51, "A100, 163 open-source models (fp32 +21%, AMP +51%)",
              "PyTorch 2.0 release notes / Ansel et al., ASPLOS 2024"),
    )

    @dataclass(frozen=True)
    class Options:
        mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
        fullgraph: bool = False
        dynamic: bool = False

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        opts = {"mode": self.options.mode, "fullgraph": self.options.fullgraph, "dynamic": self.options.dynamic}
        blocks = model_blocks(model, ctx) if FSDP_TECHNIQUES & set(ctx.technique_names) else None
        if blocks is not None:
            # FSDP2 shards after this: compile block by block (torchtitan's order), so each block's fully_shard
            # hooks gather its parameters around the compiled code; a whole-model graph would meet DTensors.
            for i, block in enumerate(blocks):
                blocks[i] = torch.compile(block, **opts)
            return model
        return torch.compile(model, **opts)

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return getattr(model, "_orig_mod", model)  # OptimizedModule's eager original, the same parameters

    def results(self, ctx: Context) -> dict[str, int]:
        """How much TorchDynamo captured in this process: a compiled set that captured no graph ran eager (a model
        Dynamo skips, such as one built around ``nn.LSTM``), so its speed says nothing about compilation."""
        from torch._dynamo.utils import counters

        return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
                "graph_breaks": int(sum(counters["graph_break"].values()))}

    # ---- reading ------------------------------------------------------------------------------------------

    remedies = (
        Remedy(Bottleneck.OVERHEAD, why="fewer Python and kernel-launch costs", again="look at the trace's top operators"),
        Remedy(Bottleneck.COMPUTE, why="fuses small ops"),
        # CUDA graphs: the whole step's kernels are recorded once and replayed with one launch, so a GPU no longer
        # waits for the host to launch each short kernel (torch.compile docs, mode="reduce-overhead")
        Remedy(Bottleneck.LAUNCH, say="compile:mode=reduce-overhead", device="cuda",
               why="CUDA graphs: the step's kernels replayed with one launch",
               again="compile:mode=reduce-overhead where compile runs another mode (CUDA graphs replay the step's "
                     "kernels with one launch)"),
        Remedy(Bottleneck.HOST, say="compile:mode=reduce-overhead", device="cuda",
               why="CUDA graphs: the step replayed without its Python",
               again="compile:mode=reduce-overhead where compile runs another mode (CUDA graphs replay the step "
                     "without its Python)"),
    )

    @classmethod
    def caveat(cls, found: list[dict[str, Any]]) -> str | None:
        if found and all(f is not None and f.get("graphs") == 0 for f in found):
            return ("torch.compile captured no graph (TorchDynamo skipped the model): these trials ran eager, so "
                    "their numbers are not a compile result")
        return None

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The graphs compiled and the graph breaks, or that TorchDynamo captured none (the trials ran eager)."""
        graphs = [f.get("graphs") for f in found]
        if all(g == 0 for g in graphs):
            return "captured no graph: TorchDynamo skipped the model, so these trials ran eager (not a compile result)"
        return f"graphs compiled {rd.values(graphs)}; graph breaks {rd.values([f.get('graph_breaks') for f in found])}"
