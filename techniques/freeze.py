"""Layer freezing: the input layers and the first ``blocks`` blocks are not trained.

Method card
- What: the model's input layers (the child modules registered before its blocks: gpt ``wte`` and ``wpe``, cnn
  ``stem``, mlp none) and its first ``blocks`` blocks get ``requires_grad=False``, and the optimizer holds only the
  trainable parameters: the frozen ones get no gradient, no AdamW state and no update. A parameter tied to a frozen
  one is frozen with it: on gpt the head, tied to ``wte`` (the record's ``frozen_by_tying`` says so). Kind
  algorithmic.
- When it should pay: autograd's backward stops at the first trainable block, so the frozen blocks' backward (about
  twice their forward's FLOPs) is skipped, with their saved activations, and each frozen parameter needs no gradient
  and no AdamW moments. The forward is unchanged. Where a step is compute-bound (a CPU, a GPU the model fills) the
  time falls about with the FLOPs (the record's ``flops_per_step``, counted on the trial's own loop); a small model
  on a GPU is launch-bound and gains less. In quality it pays when fine-tuning a pretrained model
  (``transfer+freeze:blocks=k``), whose early layers hold general features; trained from scratch, frozen layers stay
  random: a cheaper step, usually a worse model.
- Options and caveats: ``blocks`` (1). A frozen BatchNorm stays in training mode, as in torchvision's fine-tuning
  recipe: it normalises with the batch's statistics and updates its running ones; only its affine weight and bias are
  frozen. ``transfer`` and ``freeze`` give the same model in either order. A later transform that replaces modules
  would train what was frozen: such a set fails with that reason. Not implemented: gradual unfreezing (ULMFiT),
  FreezeOut's schedule, parameters registered directly on the model. `reports/example-cpu-model-techniques` also ran
  ``transfer+freeze:blocks=1``; its report.md has those answers (the block below lists freeze alone).
- Sources: Yosinski et al., "How transferable are features in deep neural networks?", NeurIPS 2014
  (arXiv:1411.1792); Howard & Ruder, ULMFiT, ACL 2018 (arXiv:1801.06146); Lee, Tang, Lin, "What Would Elsa Do?
  Freezing Layers During Transformer Fine-Tuning", arXiv:1911.03090; Brock et al., "FreezeOut", arXiv:1706.04983;
  PyTorch "Finetuning Torchvision Models" tutorial.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-freeze (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny freeze:blocks=1 1.33x [0.87, 2.05] inconclusive, memory 0.58x less.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny freeze:blocks=1 1.47x [1.21, 1.79] faster, memory 0.59x less.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/mlp`: mlp:tiny freeze:blocks=1 1.14x [0.38, 3.44] inconclusive, memory 0.96x less.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny 1.66x (no verdict: 1 repeat: a verdict needs 3), memory 0.59x less.
<!-- end generated -->

In your own training loop (plain PyTorch: ``model``, ``optimizer``, ``loss_fn``, ``batches`` and ``device``
are your loop's; ``tests/test_snippets.py`` runs this block on a toy loop):

```python
k = 1  # freeze the input layers and the first k blocks
for module in [model.inputs, *model.blocks[:k]]:  # model.inputs: the layers before the blocks (embedding, stem)
    module.requires_grad_(False)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)  # trainable only
for x, y in batches:  # backward now stops at block k
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
```
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from techniques import _reading as rd
from techniques.base import Context, Kind, Phase, Technique, model_blocks, model_structure, register

ADAMW_STATE_BYTES = 2 * 4  # exp_avg and exp_avg_sq, fp32, per parameter element


def input_modules(model: nn.Module, blocks_path: str) -> list[tuple[str, nn.Module]]:
    """(dotted name, module) of the children registered before the blocks, at each level of ``blocks_path``
    (``transformer.h``: ``transformer``'s children before ``h``, and the model's children before ``transformer``)."""
    found: list[tuple[str, nn.Module]] = []
    parent, prefix = model, ""
    for part in blocks_path.split("."):
        for name, child in parent.named_children():
            if name == part:
                break
            found.append((prefix + name, child))
        parent, prefix = parent.get_submodule(part), f"{prefix}{part}."
    return found


def frozen_tensors(model: nn.Module) -> int:
    """How many of the model's parameter tensors are frozen (``requires_grad`` off), each shared tensor once."""
    return sum(1 for p in model.parameters() if not p.requires_grad)


def apply_freeze(model: nn.Module, blocks_path: str, k: int) -> dict[str, Any]:
    """Freeze the input layers and the first ``k`` blocks of ``model`` in place; returns what was frozen."""
    blocks = model.get_submodule(blocks_path)
    if not isinstance(blocks, nn.ModuleList | nn.Sequential):
        raise TypeError(f"the model's blocks {blocks_path!r} are a {type(blocks).__name__}, not an nn.ModuleList")
    if k > len(blocks):
        raise ValueError(f"freeze:blocks={k} but the model has {len(blocks)} blocks; use 1..{len(blocks)}")
    modules = [(n, m) for n, m in input_modules(model, blocks_path) if any(True for _ in m.parameters())]
    modules += [(f"{blocks_path}.{i}", blocks[i]) for i in range(k)]
    frozen: dict[int, nn.Parameter] = {}
    for _, module in modules:
        for p in module.parameters():
            if p.requires_grad:
                frozen[id(p)] = p
    for p in frozen.values():
        p.requires_grad_(False)
    inside = {f"{name}.{pname}" for name, m in modules for pname, _ in m.named_parameters(remove_duplicate=False)}
    tied = sorted(n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in frozen and n not in inside)
    unique = {id(p): p for p in model.parameters()}.values()
    n_frozen = sum(p.numel() for p in frozen.values())
    return {
        "frozen_modules": [n for n, _ in modules],
        "frozen_by_tying": tied,
        "frozen_params": n_frozen,
        "trainable_params": sum(p.numel() for p in unique if p.requires_grad),
        "optimizer_state_bytes_saved": ADAMW_STATE_BYTES * n_frozen,
        "grad_bytes_saved": sum(p.numel() * p.element_size() for p in frozen.values()),
    }


@register
class Freeze(Technique):
    name = "freeze"
    summary = "freeze the input layers and the first k blocks (requires_grad off: no gradient, update or state)"
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "freeze"
    own_flops = True  # the frozen part's backward is skipped
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        blocks: int = 1  # how many of the first blocks to freeze (with the input layers before them)

        def __post_init__(self) -> None:
            if self.blocks < 1:
                raise ValueError(f"blocks must be >= 1 (the number of leading blocks to freeze), got {self.blocks}")

    def check(self, ctx: Context) -> str | None:
        if ctx.structure is not None and not ctx.structure.blocks:  # None: no model named, nothing to refuse
            return "needs the model's blocks (an nn.ModuleList, ctx.blocks); this model has none"
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        path = model_structure(model, ctx).blocks
        if path is None or model_blocks(model, ctx) is None:
            raise ValueError("freeze needs the model's blocks (an nn.ModuleList); this model has none")
        self._found = apply_freeze(model, path, self.options.blocks)
        self._model, self._n_frozen = model, frozen_tensors(model)
        return model

    def attach(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        # A later transform that replaces modules with new parameters (a converter of a later phase) would train
        # what was frozen, silently: the frozen tensors are counted again once every transform has run.
        now = frozen_tensors(self._model) if hasattr(self, "_model") else None
        if now is not None and now < self._n_frozen:
            raise ValueError(f"freeze: {self._n_frozen - now} of the {self._n_frozen} frozen parameter tensors were "
                             "replaced by a later model transform and would train; combine freeze without it")

    def results(self, ctx: Context) -> dict[str, Any] | None:
        found = getattr(self, "_found", None)
        return {"blocks": self.options.blocks, **found} if found else None

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def caveat(cls, found: list[dict[str, Any]]) -> str | None:
        """A weight frozen only because it is tied to a frozen one (a head tied to the embedding): trained from
        scratch it stays at its random start, which explains a worse metric better than the step's numerics."""
        tied = sorted({name for f in found if f for name in f.get("frozen_by_tying") or ()})
        if not tied:
            return None
        return (f"it froze {', '.join(tied)} too, tied to a frozen input layer (one tensor), so the model's output "
                "layer never trains from its initial weights: freeze a model whose head is untied, or start from "
                "trained weights (transfer)")

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The frozen blocks and parameters, and the optimizer-state and gradient bytes saved."""
        first = found[0]
        return (f"first {first.get('blocks')} block(s) and the input layers frozen: {rd.n(first.get('frozen_params'))} "
                f"params ({rd.n(first.get('trainable_params'))} still train); optimizer state {rd.fmt_bytes(first.get('optimizer_state_bytes_saved'))} "
                f"and gradients {rd.fmt_bytes(first.get('grad_bytes_saved'))} saved")
