"""torch.compile: capture the model with TorchDynamo and generate fused kernels with Inductor.

Method card
- What: ``torch.compile(model, mode=...)``. The first steps pay the compile time (reported separately as
  ``first_step_s``); later steps run the generated code.
- When it helps: models dominated by small elementwise ops that fuse (normalisation, activations), and on GPUs
  with CUDA graphs (``mode=reduce-overhead``). On CPUs the gain is usually small, and compile time can exceed
  the whole budget's gain: the report compares them.
- With FSDP (zero2 / zero3) each block is compiled on its own before sharding, torchtitan's order; the rest of
  the model stays eager (a whole-model graph compiled before fully_shard fails on DTensor parameters).
- What it captured: the record's ``technique_results.compile`` counts the graphs TorchDynamo compiled and its graph
  breaks, and the report shows them. Measured: the example LSTM language model (``examples/lstm_lm.py``) captures
  no graph at all (Dynamo does not trace ``nn.LSTM`` by default and skips the frame), so its "compiled" trials ran
  eager: one-off 0.32 s, curves bit-identical to the baseline, 1.05x [0.61, 1.82] inconclusive
  (reports/example-cpu-user-models).
- Measurement: every trial runs in its own process. The first trial of a workload and set compiles from an empty
  ``TORCHINDUCTOR_CACHE_DIR`` of its own, so its one-off cost is a cold-cache figure; the set's later trials share
  that cache (``bench.run.launcher``: repeats and speed-only pairs load what it compiled), their records say
  ``caches.inductor: warm``, and the analysis reports the cold trials' one-off cost for the set. The tensor-level
  memory tracker cannot see inside compiled graphs: compiled trials report RSS (and CUDA allocator peaks) only.
- Sources: Ansel et al., "PyTorch 2: Faster Machine Learning Through Dynamic Python Bytecode Transformation and
  Graph Compilation", ASPLOS 2024; PyTorch 2.0 announcement (+21% fp32 / +51% AMP training on A100, 163 models).

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

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
