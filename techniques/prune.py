"""Magnitude pruning during training: gradual unstructured masks, or a one-shot structured shrink of hidden channels.

Method card
- What, ``mode=unstructured`` (default): every ``nn.Linear`` and ``nn.Conv2d`` weight not shared with another module
  is masked by magnitude with ``torch.nn.utils.prune`` (L1), over all of them (``scope=global``) or layer by layer
  (``scope=layer``). The sparsity rises to ``sparsity`` on Zhu & Gupta's cubic schedule in ``events`` steps between
  ``start`` and ``end`` (fractions of the quality run's planned steps), each event reaching its count exactly.
  Biases, embeddings, norms and tied weights (gpt's head) stay dense. Pruned weights get zero gradient and stay zero.
- What, ``mode=structured``: at ``start``, once, the hidden channels with the smallest L2 norm of their incoming
  weights are cut out (as Li et al. 2017 do with filters), ``sparsity`` of them per layer: each block's MLP hidden
  units, a CNN block's inner channels, or the channel groups a user's model declares or tracing infers. Parameters
  and AdamW's state are sliced in place; the rest of the budget fine-tunes the smaller model. Kind algorithmic.
- When it should pay: masks never make a dense matmul faster. The zeros are still multiplied, and each masked
  weight adds an elementwise multiply per forward and two weight-sized tensors, on a CPU or a GPU alike: expect
  unstructured pruning to run slightly slower with more memory. Speed needs smaller tensors (structured: the
  matmuls shrink with the FLOPs removed, on gpt the MLP only) or sparse kernels (``sparse24``, Ampere and newer).
  What pruning buys is a smaller or sparser model to deploy at some cost in quality: read quality and time to target.
  FLOPs per step are the dense model's for masks, the shrunk model's for structured.
- Options and caveats: ``sparsity`` (0.5), ``mode``, ``scope`` (global), ``start`` (0.25), ``end`` (0.75), ``events``
  (10). The speed window trains the final sparsity or the shrunk model. Refused with ``compile``,
  ``efficient_arch``, ``qat``, ``sparse24`` and several processes; ``mode=structured`` for a model with no channel
  group described or inferred. Not implemented: pruning embeddings, attention heads or the residual width,
  iterative structured pruning, lottery-ticket rewinding, sparse kernels.
- Sources: Han et al., "Learning both Weights and Connections for Efficient Neural Networks", NeurIPS 2015
  (arXiv:1506.02626); Zhu & Gupta, "To prune, or not to prune", arXiv:1710.01878; Li et al., "Pruning Filters for
  Efficient ConvNets", ICLR 2017 (arXiv:1608.08710); Blalock et al., "What is the State of Neural Network
  Pruning?", MLSys 2020 (arXiv:2003.03033: few papers measure real speedups); ``torch.nn.utils.prune`` docs.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-prune (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/cnn`: cnn:tiny 0.87x [0.72, 1.06] inconclusive, memory 1.06x more; cnn:tiny prune:mode=structured 0.99x [0.87, 1.13] inconclusive, memory 0.80x less.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/gpt`: gpt:tiny 0.95x [0.38, 2.34] inconclusive, memory 1.07x more; gpt:tiny prune:mode=structured 1.28x [1.02, 1.60] inconclusive (the whole interval above 1, not clear of the threshold), memory 0.79x less.
- AMD EPYC (AVX2 only), `reports/example-cpu-model-techniques/mlp`: mlp:tiny 0.88x [0.53, 1.46] inconclusive, memory 1.40x more; mlp:tiny prune:mode=structured 1.33x [0.91, 1.93] inconclusive, memory 0.27x less.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-user-models-structure`: small_resnet:small prune:mode=structured 1.16x [0.82, 1.63] inconclusive, memory 0.80x less.
- AMD EPYC (AVX-512, avx512_bf16), `reports/example-cpu-outside-model`: nanogpt_chars:tiny prune:mode=structured 0.91x (no verdict: 1 repeat: a verdict needs 3), memory 0.78x less.
<!-- end generated -->
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import prune

from bench.core.structure import ModelStructure, resolve
from techniques import _reading as rd
from techniques._model import shared_weights
from techniques.base import Context, Kind, Phase, Technique, model_structure, register

_MODES = ("unstructured", "structured")
_SCOPES = ("global", "layer")


def cubic_sparsity(step: float, begin: float, end: float, final: float) -> float:
    """Zhu & Gupta's gradual schedule: 0 up to ``begin``, ``final`` from ``end`` on, and in between
    ``final * (1 - (1 - (step - begin) / (end - begin))^3)``."""
    if step >= end:
        return final
    if step <= begin:
        return 0.0
    return final * (1.0 - (1.0 - (step - begin) / (end - begin)) ** 3)


def sparsity_schedule(total_steps: int, start: float, end: float, events: int, final: float
                      ) -> list[tuple[int, float]]:
    """The pruning events ``(step, sparsity)``: ``events`` of them between ``start`` and ``end`` (fractions of
    ``total_steps``), the i-th at ``t0 + i dt`` (rounded to a whole step) with the cubic schedule's sparsity there;
    the last is at ``end`` with exactly ``final``. Events that round to the same step share it (the later wins)."""
    t0, t1 = round(start * total_steps), round(end * total_steps)
    return [(t0 + round(i * (t1 - t0) / events), cubic_sparsity(i, 0, events, final)) for i in range(1, events + 1)]


def prunable_weights(model: nn.Module) -> tuple[list[tuple[str, nn.Module, nn.Parameter]], list[str]]:
    """The (name, module, weight) of every nn.Linear and nn.Conv2d whose weight Parameter belongs to that module
    alone, and the names of those left out because another module shares it (a head tied to an embedding)."""
    tied = shared_weights(model)
    targets, shared = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            weight = module._parameters.get("weight")
            if weight is None:  # already reparametrised by someone else: not ours to touch
                continue
            if name in tied:
                shared.append(name)
            else:
                targets.append((name, module, weight))
    return targets, shared


def effective_weight(module: nn.Module) -> torch.Tensor:
    """The weight the next forward uses: ``weight_orig * weight_mask`` under pruning, else the weight itself."""
    if hasattr(module, "weight_mask"):
        return module.weight_orig.detach() * module.weight_mask
    return module.weight.detach()


def _pruned_count(module: nn.Module) -> int:
    return int((module.weight_mask == 0).sum()) if hasattr(module, "weight_mask") else 0


def _drop_mask_copies(module: nn.Module) -> None:
    """Free the per-event mask copies torch's pruning container keeps as history. The forward hook multiplies by the
    module's ``weight_mask`` buffer only; each ``CustomFromMask`` (one per global event) would otherwise keep a view
    of that event's whole global mask alive: ``events`` x N floats (3.4 GB for an 85M-weight model at 10 events)."""
    for hook in module._forward_pre_hooks.values():
        methods = getattr(hook, "_pruning_methods", (hook,))
        for method in methods:
            if isinstance(method, prune.CustomFromMask):
                method.mask = None


# ---- structured: hidden channels ---------------------------------------------------------------------------------


@dataclass
class ChannelGroup:
    """One layer's hidden channels: the tensors (module, name, dim) whose slices on ``dim`` are a channel's incoming
    weights (its score), and every (module, tensor name, dim) that holds one slice per channel."""

    name: str
    incoming: list[tuple[nn.Module, str, int]]
    cuts: list[tuple[nn.Module, str, int]]
    labels: dict[int, str] = field(default_factory=dict)  # id(module) -> its name in the model, for messages

    def label(self, module: nn.Module, tensor: str) -> str:
        return f"{self.labels.get(id(module), type(module).__name__)}.{tensor}"

    @property
    def channels(self) -> int:
        module, name, dim = self.incoming[0]
        return getattr(module, name).shape[dim]

    def scores(self) -> torch.Tensor:
        """Each channel's L2 norm over its incoming weights (and bias)."""
        parts = [getattr(m, n).detach().float().movedim(d, 0).reshape(self.channels, -1) for m, n, d in self.incoming]
        return torch.linalg.vector_norm(torch.cat(parts, dim=1), dim=1)


def channel_groups(model: nn.Module, structure: ModelStructure) -> list[ChannelGroup]:
    """The hidden channels structured pruning removes, as the model's description names them (``bench.core.structure``:
    each block's MLP hidden units, up and gate rows with down's columns, and the declared or inferred channel groups,
    such as a conv's filters with its BatchNorm and the next conv's input channels)."""
    labels = {id(m): name for name, m in model.named_modules()}
    groups = []
    for found in structure.hidden_channels():
        incoming = [(r.module, r.name, r.dim) for c in found.score if (r := resolve(model, c)) is not None]
        cuts = [(r.module, r.name, r.dim) for c in found.cuts if (r := resolve(model, c)) is not None]
        if not incoming:
            raise ValueError(f"prune: the description's channel group {found.name} names no tensor the model has")
        sizes = {getattr(m, n).shape[d] for m, n, d in cuts}
        if len(sizes) != 1:
            raise ValueError(f"prune: the tensors of channel group {found.name} disagree on its channel count "
                             f"({sorted(sizes)}); the model's description does not match the model")
        groups.append(ChannelGroup(found.name, incoming, cuts, labels))
    return groups


def kept_channels(scores: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Indices (ascending) of the ``round((1 - sparsity) * channels)`` channels with the largest scores (at least
    one; ties keep the earlier channel)."""
    keep = max(1, round((1.0 - sparsity) * len(scores)))
    return torch.argsort(scores, descending=True, stable=True)[:keep].sort().values


def _select(t: torch.Tensor, dim: int, idx: torch.Tensor) -> torch.Tensor:
    out = t.index_select(dim, idx.to(t.device))
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        out = out.contiguous(memory_format=torch.channels_last)  # keep a channels_last layout as it was
    return out


def _check_state(optimizer: torch.optim.Optimizer | None, param: nn.Parameter, label: str) -> None:
    state = optimizer.state.get(param, {}) if optimizer is not None else {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
            raise ValueError(
                f"prune:mode=structured cannot slice the optimizer's state {key!r} of {label} (shape "
                f"{tuple(value.shape)}, the parameter's {tuple(param.shape)}): it slices only elementwise state "
                f"(AdamW's exp_avg, exp_avg_sq; SGD's momentum); use such an optimizer or mode=unstructured")


def _sync_sizes(module: nn.Module) -> None:
    """Keep a cut module's size attributes (its repr, its reset_parameters) in step with its tensors."""
    if isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.Conv2d):
        module.out_channels, module.in_channels = module.weight.shape[0], module.weight.shape[1] * module.groups
    elif isinstance(module, _BatchNorm):
        module.num_features = module.running_mean.shape[0] if module.running_mean is not None else module.weight.shape[0]
    elif hasattr(module, "nf") and hasattr(module, "nx") and module.weight.dim() == 2:  # GPT-2's Conv1D: (in, out)
        module.nx, module.nf = module.weight.shape


def shrink(groups: list[ChannelGroup], sparsity: float, optimizer: torch.optim.Optimizer | None
           ) -> dict[str, list[int]]:
    """Cut each group to its kept channels, in place: the same Parameter objects with smaller data (gradients
    dropped), buffers replaced, and the optimizer's per-parameter state sliced the same way. Every group's kept
    channels are chosen before any tensor is cut. Returns {group: [channels before, after]}."""
    plan = [(g, kept_channels(g.scores(), sparsity)) for g in groups]
    for g, _ in plan:  # refuse before anything is cut
        for module, name, _dim in g.cuts:
            t = getattr(module, name)
            if isinstance(t, nn.Parameter):
                _check_state(optimizer, t, g.label(module, name))
    sizes = {}
    with torch.no_grad():
        for g, idx in plan:
            sizes[g.name] = [g.channels, len(idx)]
            for module, name, dim in g.cuts:
                t = getattr(module, name)
                if isinstance(t, nn.Parameter):
                    state = optimizer.state.get(t, {}) if optimizer is not None else {}
                    for key, value in state.items():
                        if torch.is_tensor(value) and value.dim() > 0:
                            state[key] = _select(value, dim, idx)
                    t.data = _select(t.data, dim, idx)
                    t.grad = None
                else:
                    module._buffers[name] = _select(t, dim, idx)
                _sync_sizes(module)
    return sizes


# ---- the technique -----------------------------------------------------------------------------------------------


@register
class Prune(Technique):
    name = "prune"
    summary = "magnitude pruning: gradual cubic unstructured masks (torch prune) or a one-shot shrink of hidden channels"
    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    # compile: the mask hooks and the changing shapes would recompile or break its graphs; efficient_arch replaces
    # the layers pruning targets (either order would prune modules no longer in the model, or none)
    conflicts = frozenset({"compile", "efficient_arch"})
    own_flops = True
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        sparsity: float = 0.5  # fraction of the targeted weights (unstructured) or hidden channels (structured) removed
        mode: Literal["unstructured", "structured"] = "unstructured"
        scope: Literal["global", "layer"] = "global"  # unstructured: one magnitude threshold for all, or per layer
        start: float = 0.25  # fraction of the planned steps: first event (unstructured) / the shrink (structured)
        end: float = 0.75  # unstructured: the last event, at the full sparsity
        events: int = 10  # unstructured: pruning events between start and end

        def __post_init__(self) -> None:
            if not 0 < self.sparsity < 1:
                raise ValueError(f"sparsity must be in (0, 1), got {self.sparsity}")
            if self.mode not in _MODES:
                raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
            if self.scope not in _SCOPES:
                raise ValueError(f"scope must be one of {', '.join(_SCOPES)}, got {self.scope!r}")
            if not 0 <= self.start <= 1:
                raise ValueError(f"start must be in [0, 1] (a fraction of the planned steps), got {self.start}")
            if self.mode == "structured":
                unused = [f"{k}={getattr(self, k)}" for k, default in (("scope", "global"), ("end", 0.75),
                                                                       ("events", 10)) if getattr(self, k) != default]
                if unused:
                    raise ValueError(f"{', '.join(unused)}: scope, end and events apply to mode=unstructured only "
                                     "(structured pruning cuts each layer once, at start)")
                return
            if not self.start <= self.end <= 1:
                raise ValueError(f"need 0 <= start <= end <= 1, got start={self.start}, end={self.end}")
            if self.events < 1:
                raise ValueError(f"events must be >= 1, got {self.events}")

    def __init__(self, options: Options | None = None) -> None:
        super().__init__(options)
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._targets: list[tuple[str, nn.Module, nn.Parameter]] = []
        self._shared: list[str] = []
        self._groups: list[ChannelGroup] = []
        self._schedule: list[tuple[int, float]] | None = None
        self._next = 0  # index of the next unstructured event
        self._ran: list[list[Any]] = []  # (step, sparsity) of the events that ran
        self._sizes: dict[str, list[int]] = {}
        self._params_before: int | None = None
        self._params_after: int | None = None

    def check(self, ctx: Context) -> str | None:
        if ctx.world_size > 1:
            return "prune runs on one process (each rank would prune and cut its own replica)"
        if self.options.mode == "structured" and ctx.structure is not None:
            return ctx.structure.lacks("channels", hint=(
                "return structure from build with the MLP or the channel groups (docs/models.md); "
                "mode=unstructured prunes any model's Linear and Conv2d weights"))
        return None

    def transform_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        self._model = model
        if self.options.mode == "structured":
            self._groups = channel_groups(model, model_structure(model, ctx))
            if not self._groups:
                raise ValueError(f"prune:mode=structured: {model_structure(model, ctx).lacks('channels')}")
        else:
            self._targets, self._shared = prunable_weights(model)
            if not self._targets:
                raise ValueError("prune found no unshared nn.Linear or nn.Conv2d weight to prune in the model")
        return model

    def attach(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        self._optimizer = optimizer

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        for batch in batches:
            self._advance(ctx.step, self._optimizer, ctx)  # a window past the plan starts at the final state
            yield batch

    def after_step(self, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        self._advance(ctx.step + 1, optimizer, ctx)

    # ---- the schedule --------------------------------------------------------------------------------------------

    def _advance(self, completed: int, optimizer: torch.optim.Optimizer | None, ctx: Context) -> None:
        """Bring pruning up to ``completed`` optimizer steps."""
        o = self.options
        if o.mode == "structured":
            if self._params_after is None and completed >= round(o.start * ctx.total_steps):
                self._shrink(completed, optimizer)
            return
        if self._schedule is None:
            self._schedule = sparsity_schedule(ctx.total_steps, o.start, o.end, o.events, o.sparsity)
        due = self._next
        while due < len(self._schedule) and self._schedule[due][0] <= completed:
            due += 1
        if due > self._next:
            self._next = due
            target = self._schedule[due - 1][1]
            self.prune_to(target)
            self._ran.append([completed, round(target, 6)])

    def _shrink(self, completed: int, optimizer: torch.optim.Optimizer | None) -> None:
        if self._model is None:
            raise RuntimeError("prune: transform_model was not called before training")
        if optimizer is None:
            raise RuntimeError("prune:mode=structured needs the optimizer (attach) to slice its state")
        self._params_before = sum(p.numel() for p in self._model.parameters())
        self._sizes = shrink(self._groups, self.options.sparsity, optimizer)
        self._params_after = sum(p.numel() for p in self._model.parameters())
        self._ran.append([completed, self.options.sparsity])

    def prune_to(self, sparsity: float) -> None:
        """Prune the targets to ``sparsity`` (global or per layer), exactly ``round(sparsity * n)`` weights."""
        if not self._targets:
            raise RuntimeError("prune: transform_model was not called before training")
        with torch.no_grad():
            for _, m, _ in self._targets:
                if not hasattr(m, "weight_mask"):
                    prune.identity(m, "weight")
                    # torch's pruning flattens masks and scores with view(-1): a channels_last conv weight's
                    # ones_like mask would not flatten, so the masks (and the scores below) are kept contiguous
                    m._buffers["weight_mask"] = m.weight_mask.contiguous()
            if self.options.scope == "global":
                total = sum(p.numel() for _, _, p in self._targets)
                amount = round(sparsity * total) - sum(_pruned_count(m) for _, m, _ in self._targets)
                if amount > 0:
                    scores = {(m, "weight"): p.detach().contiguous() for _, m, p in self._targets}  # current values
                    prune.global_unstructured([(m, "weight") for _, m, _ in self._targets],
                                              pruning_method=prune.L1Unstructured, importance_scores=scores,
                                              amount=amount)
            else:
                for _, m, p in self._targets:
                    amount = round(sparsity * p.numel()) - _pruned_count(m)
                    if amount > 0:
                        prune.l1_unstructured(m, "weight", amount=amount, importance_scores=p.detach().contiguous())
        for name, m, p in self._targets:
            if hasattr(m, "weight_mask"):
                if m.weight_orig is not p:  # the optimizer steps ``p``: it must be what the mask multiplies
                    raise RuntimeError(f"prune: {name}.weight_orig is not the Parameter the optimizer holds")
                _drop_mask_copies(m)

    def continuation_blocker(self, ctx: Context) -> str | None:
        when = "its shrink" if self.options.mode == "structured" else "its pruning events"
        return f"prune places {when} at fractions of the planned steps: a longer run would place them later"

    # ---- the record ----------------------------------------------------------------------------------------------

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        out: dict[str, Any] = {"mode": o.mode, "target": o.sparsity, "events": self._ran}
        if o.mode == "structured":
            out.update(start_step=round(o.start * ctx.total_steps), params_before=self._params_before,
                       params_after=self._params_after,
                       channels=self._sizes,
                       layers={k: round(1 - after / before, 6) for k, (before, after) in self._sizes.items()})
            if self._sizes:
                before = sum(b for b, _ in self._sizes.values())
                out["sparsity"] = round(1 - sum(a for _, a in self._sizes.values()) / before, 6)
            return out
        layers, zeros, total = {}, 0, 0
        for name, m, _ in self._targets:
            w = effective_weight(m)
            z = int((w == 0).sum())
            layers[name] = round(z / w.numel(), 6)
            zeros, total = zeros + z, total + w.numel()
        out.update(scope=o.scope, start=o.start, end=o.end,
                   schedule=[[s, round(v, 6)] for s, v in self._schedule or []],
                   sparsity=round(zeros / total, 6) if total else None, layers=layers, weights=total,
                   nonzero=total - zeros, left_dense_shared=self._shared)
        return out

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The sparsity reached (unstructured), or the hidden channels removed and the parameters before and after
        (structured)."""
        first = found[0]
        reached = rd.values([f.get("sparsity") for f in found])
        if first.get("mode") == "structured":
            if all(f.get("params_after") is None for f in found):
                return f"structured: never reached its step {first.get('start_step')}; nothing was removed"
            return (f"structured: {first.get('target'):.0%} of the hidden channels removed at step {first.get('start_step')} "
                    f"(channel sparsity {reached}); params {rd.n(first.get('params_before'))} -> "
                    f"{rd.n(first.get('params_after'))}")
        return (f"unstructured ({first.get('scope')}): {reached} of {rd.n(first.get('weights'))} weights zero at the end "
                f"(target {first.get('target'):.0%}); masks leave dense matmuls as large as before")
