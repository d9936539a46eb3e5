"""A model's structure, described once and queried by every technique that changes, splits or scales the model.

Techniques never ask which workload a model belongs to; they ask this description for the part they need (the
attention's projections and heads, the MLP's up/gate/down projections, hidden channels that can be removed together,
the embedding and what the model computes between it and the first block, the final norm and the head, what the
blocks take besides the hidden state, how to make a wider or deeper teacher) and, where it lacks the part, are
skipped with that part named. Four sources fill it, in this order of authority:

- a built-in workload declares its own (``bench/workloads/*.py``: ``Workload.structure(size)``, the same
  description its built model's ``BuiltWorkload.structure`` carries);
- a Hugging Face model derives it from its config and module names (``bench/workloads/hf_causal.py``: GPT-2's fused
  ``c_attn`` Conv1D, Llama's ``q/k/v_proj``, gated MLP, RMSNorm and rotary embeddings);
- a user's ``build`` may return it under the optional key ``structure`` (a ``ModelStructure`` or a dict of the same
  fields, docs/models.md), and ``teacher_size`` (another size of the same build for a distillation teacher);
- otherwise ``infer(model, blocks)`` finds what it can prove from the modules and a symbolic trace (torch.fx): the
  blocks, channel groups (a Linear or Conv2d whose every output channel flows, through element-wise activations,
  a BatchNorm of those channels or a product of two such branches, into one Linear or Conv2d and nowhere else), the
  embedding, final norm and head on the model's own data path, and ``nn.MultiheadAttention``; ``notes`` says what it
  could not find and why.

Every field is plain data (dotted module paths, counts, flags), so a description travels as JSON from the process
that checks a user's model to the plan (``to_dict`` / ``from_dict``). Paths inside a ``Block`` are relative to each
block; a ``Cut``'s tensor path is from the model's root.
"""

from __future__ import annotations

import dataclasses
import linecache
import operator
import os
import traceback
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Attention:
    """One block's self-attention. Paths are relative to the block; ``transposed``: the projections store their
    weights as (in, out), GPT-2's ``Conv1D``, where ``nn.Linear`` stores (out, in)."""

    heads: int  # query heads
    kv_heads: int  # key/value heads (== heads: multi-head attention)
    head_dim: int
    module: str | None = None  # the attention module itself
    qkv: str | None = None  # a fused projection whose outputs are [q; k; v] (heads * hd, then kv_heads * hd twice)
    q: str | None = None  # separate projections
    k: str | None = None
    v: str | None = None
    out: str | None = None  # the output projection
    rotary: bool = False  # rotary position embeddings applied to q and k per head (after the projections)
    transposed: bool = False
    packed: bool = False  # torch's nn.MultiheadAttention: the projections are parameters used inside its forward

    @property
    def projections(self) -> str | None:
        """Which projection form the attention has ("fused", "separate"), or None when it has neither as modules."""
        if self.packed:
            return None
        if self.qkv:
            return "fused"
        return "separate" if self.q and self.k and self.v else None


@dataclass(frozen=True)
class MLP:
    """One block's MLP (paths relative to the block): ``down(act(up(x)))``, or ``down(act(gate(x)) * up(x))``."""

    up: str
    down: str
    gate: str | None = None
    hidden: int = 0
    transposed: bool = False  # GPT-2's Conv1D: weights stored (in, out)


@dataclass(frozen=True)
class Block:
    """What each of the model's repeated blocks holds (the same in every block)."""

    attention: Attention | None = None
    mlp: MLP | None = None
    norms: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cut:
    """A tensor (a parameter or buffer, dotted path from the model's root) holding one slice per channel on ``dim``."""

    tensor: str
    dim: int


@dataclass(frozen=True)
class Channels:
    """Hidden channels that can be removed together: ``score`` holds each channel's incoming weights (its norm ranks
    it), ``cuts`` every tensor with one slice per channel (the score's tensors included). A tensor that is absent
    (a bias-free layer) is skipped."""

    name: str
    score: tuple[Cut, ...]
    cuts: tuple[Cut, ...]


@dataclass(frozen=True)
class Scaling:
    """How to make a wider or deeper model of the same build from its size parameters: the keys multiplied by the
    width factor (a list value element-wise), those multiplied by the depth factor, and (key, other key) pairs where
    the scaled key stays a multiple of the other (whole attention heads)."""

    width: tuple[str, ...] = ()
    depth: tuple[str, ...] = ()
    multiple_of: tuple[tuple[str, str], ...] = ()

    def apply(self, params: dict[str, Any], width: float, depth: int) -> dict[str, Any]:
        p = dict(params)
        missing = [k for k in (*self.width, *self.depth) if k not in p]
        if missing:
            raise ValueError(f"the size's parameters lack {', '.join(missing)}, which its scaling names")
        multiples = dict(self.multiple_of)
        for key in self.width:
            value = p[key]
            if isinstance(value, list | tuple):
                p[key] = [int(v * width) for v in value]
            elif key in multiples:
                unit = int(p[multiples[key]])
                p[key] = max(unit, round(value * width / unit) * unit)
            else:
                p[key] = int(value * width)
        for key in self.depth:
            p[key] = p[key] * depth
        return p


@dataclass(frozen=True)
class ModelStructure:
    """The parts of a model that techniques change, split or scale (see the module docstring)."""

    blocks: str | None = None  # dotted path of the nn.ModuleList (or nn.Sequential) of repeated blocks
    n_blocks: int = 0
    block: Block | None = None  # what every block holds; None: the blocks are not described inside
    embedding: str | None = None  # the token embedding (nn.Embedding): a sequence model's input
    final_norm: str | None = None  # the norm between the last block and the head
    head: str | None = None  # the output layer
    tied: bool = False  # the head's weight is the embedding's
    position_embedding: str | None = None  # a learned position embedding (nn.Embedding of positions 0..T-1) whose
    # output the model adds to the token embedding's before the first block
    pre_blocks: tuple[str, ...] = ()  # modules the model applies in order to that sum before the first block
    # (dropout, a norm); with the two above, what the model computes before its blocks
    block_inputs: tuple[str, ...] = ()  # what each block takes beyond the hidden state, computed once by the
    # model's forward and passed in (rotary cos/sin, a mask); (): the hidden state alone, or not known
    causal: bool | None = None  # position i never sees positions > i (a decoder); None: not known
    channels: tuple[Channels, ...] = ()  # hidden channels removable together, beyond the blocks' MLPs
    convolutional: bool | None = None  # holds nn.Conv2d layers; None: not known
    calls_sdpa: bool | None = None  # calls F.scaled_dot_product_attention; None: not known
    scaling: Scaling | None = None  # how to scale it for a distillation teacher
    teacher_size: str | None = None  # or: another size of the same build to use as the teacher
    source_task: str | None = None  # a pretraining source task the workload provides (transfer; built by
    # ``BuiltWorkload.source_task``)
    source: str = ""  # where the description came from ("declared", "hf", "build", "inferred")
    notes: tuple[str, ...] = ()  # what inference could not find, and why

    # ---- questions techniques ask ---------------------------------------------------------------------------

    @property
    def attention(self) -> Attention | None:
        return self.block.attention if self.block else None

    @property
    def mlp(self) -> MLP | None:
        return self.block.mlp if self.block else None

    def block_path(self, i: int, rel: str) -> str:
        return f"{self.blocks}.{i}.{rel}" if self.blocks else rel

    def hidden_channels(self) -> list[Channels]:
        """Every group of removable hidden channels: each block's MLP hidden units (up and gate rows, down
        columns) and the declared or inferred ``channels``."""
        groups = []
        mlp = self.mlp
        if mlp is not None and self.blocks:
            w_in, w_out = (1, 0) if mlp.transposed else (0, 1)  # the dim of a hidden unit in up/gate, and in down
            for i in range(self.n_blocks):
                score: list[Cut] = []
                for rel in (mlp.up, mlp.gate):
                    if rel:
                        base = self.block_path(i, rel)
                        score += [Cut(f"{base}.weight", w_in), Cut(f"{base}.bias", 0)]
                down = self.block_path(i, mlp.down)
                cuts = [*score, Cut(f"{down}.weight", w_out)]
                name = self.block_path(i, mlp.up.rsplit(".", 1)[0]) if "." in mlp.up else f"{self.blocks}.{i}"
                groups.append(Channels(name, tuple(score), tuple(cuts)))
        return groups + list(self.channels)

    def missing(self, *parts: str) -> list[str]:
        """The named parts this description lacks ("blocks", "attention", "mlp", "embedding", "head", ...)."""
        have = {
            "blocks": bool(self.blocks), "attention": self.attention is not None, "mlp": self.mlp is not None,
            "embedding": bool(self.embedding), "head": bool(self.head), "final_norm": bool(self.final_norm),
            "channels": bool(self.hidden_channels()), "teacher": bool(self.scaling or self.teacher_size),
        }
        return [p for p in parts if not have[p]]

    def lacks(self, *parts: str, hint: str = "") -> str | None:
        """The one-line reason a technique cannot run for lack of ``parts`` ("needs the model's ..."; the plan puts
        the technique's name before it), or None when none is missing."""
        lacking = self.missing(*parts)
        if not lacking:
            return None
        text = f"needs the model's {', '.join(PART_NAMES[p] for p in lacking)}, which its description " \
               f"({self.source or 'unknown source'}) lacks"
        # only the notes about a lacking part: a CNN's "no token embedding" is not explained by its attention
        relevant = [n for n in self.notes if any(word in n for p in lacking for word in NOTE_WORDS.get(p, (p,)))]
        if relevant:
            text += f": {'; '.join(relevant)}"
        return f"{text}; {hint or HOW_TO_DESCRIBE}"

    # ---- JSON ------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelStructure:
        """The description from ``to_dict``'s form (or a user's dict of the same fields); unknown keys are errors."""
        return _build(cls, data, "structure")


PART_NAMES = {
    "blocks": "blocks", "attention": "attention (its projections and heads)",
    "mlp": "MLP (up/down projections)", "embedding": "token embedding", "head": "output head",
    "final_norm": "final norm", "channels": "removable hidden channels (an MLP or a conv channel group)",
    "teacher": "teacher (a teacher_size, or width/depth scaling)",
}
# the words by which inference's notes name each part (bench.core.structure.infer writes them)
NOTE_WORDS = {"blocks": ("block",), "attention": ("attention",), "mlp": ("MLP", "channel"),
              "embedding": ("embedding",), "head": ("head",), "final_norm": ("final norm",),
              "channels": ("channel",), "teacher": ()}
HOW_TO_DESCRIBE = "return structure from build (docs/models.md, Structure)"


def _build(cls: type, data: Any, where: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a {cls.__name__} or a dict of its fields, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(str, unknown))} (valid: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        values[key] = _value(hints[key], value, f"{where}.{key}")
    try:
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None


_NESTED = {"Attention": Attention, "MLP": MLP, "Block": Block, "Cut": Cut, "Channels": Channels,
           "Scaling": Scaling}


def _value(hint: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value, where) if inner else value
    if origin is tuple:
        items = list(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(items))
        return tuple(_value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, items, strict=True)))
    if isinstance(hint, type) and hint.__name__ in _NESTED:
        return _build(hint, value, where)
    return value


# ---- inference -------------------------------------------------------------------------------------------------

ACTIVATIONS = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.Mish, nn.Dropout,
               nn.Identity, nn.Hardswish, nn.ReLU6)
_ELEMENTWISE_FUNCTIONS = {torch.relu, torch.tanh, torch.sigmoid, torch.nn.functional.relu,
                          torch.nn.functional.gelu, torch.nn.functional.silu, torch.nn.functional.dropout,
                          torch.nn.functional.leaky_relu, torch.nn.functional.elu, torch.nn.functional.relu6,
                          torch.nn.functional.hardswish, torch.nn.functional.mish, torch.sigmoid}
_ELEMENTWISE_METHODS = {"relu", "tanh", "sigmoid"}
NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)


class _BlocksAsLeaves(torch.fx.Tracer):
    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)


def _trace(module: nn.Module, leaves: set[str]) -> tuple[torch.fx.Graph | None, str | None]:
    try:
        return _BlocksAsLeaves(leaves).trace(module), None
    except Exception as exc:  # a data-dependent branch, an untraceable call: nothing inferred from the trace
        return None, trace_failure(exc)


def trace_failure(exc: BaseException) -> str:
    """Why a symbolic trace failed, in one line that names the line of the model's code that broke it
    (``model.py:182 (assert t <= self.block_size)``: the innermost frame outside torch), then the error."""
    where = ""
    torch_dir = os.path.dirname(torch.__file__)
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        path = frame.f_code.co_filename
        if not path.startswith(torch_dir) and os.path.abspath(path) != os.path.abspath(__file__):
            code = " ".join(linecache.getline(path, lineno).split())
            code = code if len(code) <= 60 else code[:57] + "..."
            where = f"{os.path.basename(path)}:{lineno}" + (f" ({code})" if code else "")
    error = " ".join(str(exc).split()).split(". ")[0][:100]
    return f"{where}: {type(exc).__name__}: {error}" if where else f"{type(exc).__name__}: {error}"


def _producer(modules: dict[str, nn.Module], node: torch.fx.Node) -> nn.Module | None:
    if node.op == "call_module":
        m = modules.get(str(node.target))
        if isinstance(m, nn.Linear) or (isinstance(m, nn.Conv2d) and m.groups == 1):
            return m
    return None


def _channel_wise(modules: dict[str, nn.Module], node: torch.fx.Node) -> bool:
    """An element-wise op of one input (an activation, dropout) or a BatchNorm over the channels."""
    if node.op == "call_module":
        return isinstance(modules.get(str(node.target)), ACTIVATIONS + (nn.modules.batchnorm._BatchNorm,))
    if node.op == "call_function":
        return node.target in _ELEMENTWISE_FUNCTIONS
    if node.op == "call_method":
        return node.target in _ELEMENTWISE_METHODS
    return False


def _walk_group(modules: dict[str, nn.Module], consumer: torch.fx.Node
                ) -> tuple[set[torch.fx.Node], list[torch.fx.Node]] | None:
    """The nodes between a consumer (a Linear or Conv2d) and its producers, walking back from its input through
    channel-wise ops and products, and the producers; None when the walk meets anything else or a value of the
    group leaves it (a residual, a second consumer)."""
    if _producer(modules, consumer) is None or not consumer.args:
        return None
    inner: set[torch.fx.Node] = set()
    producers: list[torch.fx.Node] = []
    stack = [consumer.args[0]]
    while stack:
        node = stack.pop()
        if not isinstance(node, torch.fx.Node) or node in inner:
            return None
        inner.add(node)
        if _producer(modules, node) is not None:
            producers.append(node)
        elif _channel_wise(modules, node):
            stack.append(node.args[0] if node.args else None)
        elif node.op == "call_function" and node.target in (operator.mul, torch.mul) and len(node.args) == 2:
            stack += list(node.args)
        else:
            return None
    if not producers or any(user not in inner and user is not consumer for n in inner for user in n.users):
        return None
    return inner, producers


def _groups_in(graph: torch.fx.Graph, root: nn.Module, prefix: str) -> list[Channels]:
    """Channel groups in a traced graph (see the module docstring): walking back from each consumer's input through
    channel-wise ops and products to its producers, every node on the way used only inside the group."""
    modules = dict(root.named_modules())
    groups = []
    for consumer in graph.nodes:
        walked = _walk_group(modules, consumer)
        if walked is None:
            continue
        inner, producers = walked
        cmod = modules[str(consumer.target)]
        width = cmod.in_features if isinstance(cmod, nn.Linear) else cmod.in_channels
        pmods = [modules[str(p.target)] for p in producers]
        if any((m.out_features if isinstance(m, nn.Linear) else m.out_channels) != width for m in pmods):
            continue
        if any(isinstance(m, nn.Conv2d) != isinstance(cmod, nn.Conv2d) for m in pmods):
            continue
        bns = [modules[str(n.target)] for n in inner if n.op == "call_module"
               and isinstance(modules[str(n.target)], nn.modules.batchnorm._BatchNorm)]
        if any(bn.num_features != width for bn in bns):
            continue
        name = lambda n: f"{prefix}{n.target}"  # noqa: E731
        score = [c for p in producers for c in (Cut(f"{name(p)}.weight", 0), Cut(f"{name(p)}.bias", 0))]
        norms = [Cut(f"{name(n)}.{t}", 0) for n in inner if n.op == "call_module"
                 and isinstance(modules[str(n.target)], nn.modules.batchnorm._BatchNorm)
                 for t in ("weight", "bias", "running_mean", "running_var")]
        cuts = (*score, *norms, Cut(f"{name(consumer)}.weight", 1))
        groups.append(Channels(f"{prefix}{consumer.target}:in", tuple(score), cuts))
    return groups


def _mlp_in(graph: torch.fx.Graph, block: nn.Module) -> tuple[MLP | None, str | None]:
    """The block's MLP, read off the same walk as its channel groups: a Linear fed through element-wise
    activations by one Linear (``down(act(up(x)))``) or by the product of two (``down(act(gate(x)) * up(x))``, the
    gate the branch with the activation), with no BatchNorm between; (None, why) when there is none or several."""
    modules = dict(block.named_modules())
    found = []
    for consumer in graph.nodes:
        walked = _walk_group(modules, consumer)
        if walked is None or not isinstance(modules[str(consumer.target)], nn.Linear):
            continue
        inner, producers = walked
        pmods = [modules[str(p.target)] for p in producers]
        width = modules[str(consumer.target)].in_features
        if len(producers) > 2 or any(not isinstance(m, nn.Linear) or m.out_features != width for m in pmods):
            continue
        if any(n.op == "call_module" and isinstance(modules[str(n.target)], nn.modules.batchnorm._BatchNorm)
               for n in inner):
            continue  # its channels also cut a BatchNorm: a channel group, not the MLP form
        gate = None
        if len(producers) == 2:
            activated = [p for p in producers if _activated_before_product(modules, p, inner)]
            if len(activated) != 1:
                continue
            gate = activated[0]
        up = next(p for p in producers if p is not gate)
        found.append(MLP(up=str(up.target), down=str(consumer.target), gate=str(gate.target) if gate else None,
                         hidden=width))
    if len(found) == 1:
        return found[0], None
    return None, ("no MLP (a Linear feeding one Linear through activations)" if not found else
                  f"{len(found)} MLP-like Linear pairs ({', '.join(m.down for m in found)}), not one")


def _activated_before_product(modules: dict[str, nn.Module], producer: torch.fx.Node,
                              inner: set[torch.fx.Node]) -> bool:
    """Whether ``producer``'s output passes a channel-wise op before it reaches a product inside ``inner``."""
    node = producer
    while True:
        users = [u for u in node.users if u in inner]
        if len(users) != 1:
            return False
        node = users[0]
        if node.op == "call_function" and node.target in (operator.mul, torch.mul):
            return False
        if _channel_wise(modules, node):
            return True


# Ops that only move or cut a tensor's elements (what lies between an attention's projections and SDPA).
_SHAPE_METHODS = {"view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "split", "chunk"}
_SHAPE_FUNCTIONS = {torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.split, torch.chunk,
                    operator.getitem}


def _is_shape_op(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target in _SHAPE_METHODS) or \
        (node.op == "call_function" and node.target in _SHAPE_FUNCTIONS)


def _projection_of(modules: dict[str, nn.Module], node: Any) -> tuple[torch.fx.Node, int | None] | None:
    """The Linear whose output reaches ``node`` through shape ops alone, and which piece of it (the index taken
    from a split or chunk of its output; None: all of it); None when anything else lies between."""
    piece = None
    while isinstance(node, torch.fx.Node):
        if node.op == "call_module" and isinstance(modules.get(str(node.target)), nn.Linear):
            return node, piece
        if not _is_shape_op(node) or not node.args:
            return None
        if node.target is operator.getitem:
            if piece is not None or not isinstance(node.args[1], int):
                return None
            piece = node.args[1]
        node = node.args[0]
    return None


def _attention_in(graph: torch.fx.Graph, block: nn.Module) -> tuple[Attention | None, str | None]:
    """The block's attention, when it provably is one: a single ``F.scaled_dot_product_attention`` whose query,
    key and value are Linear outputs reached through shape ops alone (one fused projection split in three, q, k, v in
    that order, or three projections), whose output reaches one Linear the same way; heads and head size from the
    shapes of one run of the block on a small input. (None, why) otherwise: rotary embeddings or a repeat of
    key/value heads between the projections and SDPA are not shape ops, so such attention is not inferred."""
    modules = dict(block.named_modules())
    calls = [n for n in graph.nodes if n.op == "call_function" and n.target is F.scaled_dot_product_attention]
    if len(calls) != 1:
        return None, f"{len(calls)} calls of scaled_dot_product_attention, not one"
    sdpa = calls[0]
    names = ("query", "key", "value")
    args = [sdpa.args[i] if len(sdpa.args) > i else sdpa.kwargs.get(names[i]) for i in range(3)]
    projections = [_projection_of(modules, a) for a in args]
    if any(p is None for p in projections):
        return None, "its query, key or value is not a Linear's output reshaped (rotary embeddings or repeated heads?)"
    sources = [p[0] for p in projections]  # type: ignore[index]
    pieces = [p[1] for p in projections]  # type: ignore[index]
    fused = len(set(sources)) == 1 and pieces == [0, 1, 2]
    if not fused and (len(set(sources)) != 3 or any(i is not None for i in pieces)):
        return None, "its query, key and value are neither one fused projection's three pieces nor three projections"
    node, out = sdpa, None
    while out is None:
        users = list(node.users)
        if len(users) != 1:
            return None, "the attention's output is not one Linear's input"
        node = users[0]
        if node.op == "call_module" and isinstance(modules.get(str(node.target)), nn.Linear):
            out = node
        elif not _is_shape_op(node):
            return None, "the attention's output reaches its projection through other ops than reshapes"
    shapes = _shapes(graph, block, modules[str(sources[0].target)].in_features)
    if shapes is None:
        return None, "one run of the block on a small input failed (it takes more than the hidden state?)"
    q, k = (shapes.get(a.name) if isinstance(a, torch.fx.Node) else None for a in args[:2])
    if q is None or k is None or len(q) != 4 or len(k) != 4:
        return None, "its query and key are not (batch, heads, positions, head size)"
    heads, kv_heads, head_dim = int(q[1]), int(k[1]), int(q[-1])
    paths = [str(s.target) for s in dict.fromkeys(sources)] + [str(out.target)]
    parents = {p.rpartition(".")[0] for p in paths}
    module = parents.pop() if len(parents) == 1 and "" not in parents else None
    if fused:
        return Attention(heads=heads, kv_heads=kv_heads, head_dim=head_dim, module=module, qkv=paths[0],
                         out=paths[1]), None
    return Attention(heads=heads, kv_heads=kv_heads, head_dim=head_dim, module=module, q=paths[0], k=paths[1],
                     v=paths[2], out=paths[3]), None


def _shapes(graph: torch.fx.Graph, block: nn.Module, width: int) -> dict[str, tuple[int, ...]] | None:
    """The shape of every node's value when the block runs once on a (2, 8, width) input, in eval mode without
    gradients and without drawing from the global RNG (the trial's own draws stay the same); None when it fails."""
    from torch.fx.passes.shape_prop import ShapeProp

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not placeholders or any(not n.args for n in placeholders[1:]):  # a second input without a default
        return None
    param = next(block.parameters(), None)
    x = torch.zeros(2, 8, width, device=param.device if param is not None else None,
                    dtype=param.dtype if param is not None and param.is_floating_point() else None)
    modes = [(m, m.training) for m in block.modules()]
    try:
        gm = torch.fx.GraphModule(block, graph)
        gm.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            ShapeProp(gm).propagate(x)
    except Exception:
        return None
    finally:
        for m, training in modes:
            m.training = training
    return {n.name: tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
            if isinstance(n.meta.get("tensor_meta"), torch.fx.passes.shape_prop.TensorMetadata)}


def infer(model: nn.Module, blocks: str | None) -> ModelStructure:
    """What can be proven about ``model`` without being told (see the module docstring)."""
    notes: list[str] = []
    try:
        block_list = model.get_submodule(blocks) if blocks else None
    except AttributeError:  # a context's default path on a model without it
        block_list, blocks = None, None
    n_blocks = len(block_list) if block_list is not None else 0
    leaves = {f"{blocks}.{i}" for i in range(n_blocks)} if blocks else set()
    graph, why = _trace(model, leaves)
    embedding = final_norm = head = None
    channels: list[Channels] = []
    modules = dict(model.named_modules())
    if graph is None:
        notes.append(f"the model's forward does not trace ({why}): no embedding, head, final norm or channel groups "
                     "found outside the blocks")
    else:
        channels += _groups_in(graph, model, "")
        out = next(n for n in graph.nodes if n.op == "output")
        last = out.args[0] if isinstance(out.args[0], torch.fx.Node) else None
        if last is not None and last.op == "call_module" and isinstance(modules.get(str(last.target)), nn.Linear):
            head = str(last.target)
            before = last.args[0] if last.args else None
            if isinstance(before, torch.fx.Node) and before.op == "call_module" and \
                    isinstance(modules.get(str(before.target)), NORMS):
                final_norm = str(before.target)
        else:
            notes.append("the model's output is not an nn.Linear's: no head found")
        for n in graph.nodes:
            if n.op == "call_module" and isinstance(modules.get(str(n.target)), nn.Embedding) and n.args and \
                    isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "placeholder":
                embedding = str(n.target)
                break
    attention, mlp = None, None
    graphs = [graph] if graph is not None else []
    complete = graph is not None
    if block_list is not None and n_blocks:
        parts = []  # each block's (attention, MLP) as inferred from its own trace: one description for all blocks
        traced = True
        for i, block in enumerate(block_list):
            g, why = _trace(block, set())
            if g is None:
                notes.append(f"block {i} ({type(block).__name__}) could not be traced ({why}): no attention, MLP or "
                             "channel groups inside it")
                complete = traced = False
                break
            graphs.append(g)
            channels += _groups_in(g, block, f"{blocks}.{i}.")
            parts.append((_attention_in(g, block), _mlp_in(g, block)))
        mha = [(p, m) for p, m in block_list[0].named_modules() if isinstance(m, nn.MultiheadAttention)]
        if len(mha) == 1:
            path, m = mha[0]
            attention = Attention(heads=m.num_heads, kv_heads=m.num_heads, head_dim=m.head_dim, module=path,
                                  out=f"{path}.out_proj", packed=True)
        elif traced:
            attention, why = _same_in_every_block([a for a, _ in parts], "attention")
            if attention is None:
                notes.append(f"attention not inferred: {why}")
        if traced:
            mlp, why = _same_in_every_block([m for _, m in parts], "MLP")
            if mlp is None:
                notes.append(f"MLP not inferred: {why}")
            else:  # its hidden units are the MLP's: one group per block in the MLP's form, not twice
                ours = {f"{blocks}.{i}.{mlp.down}:in" for i in range(n_blocks)}
                channels = [c for c in channels if c.name not in ours]
    tied = bool(head and embedding and modules[head].weight is modules[embedding].weight)
    tied = bool(head and embedding and modules[head].weight is modules[embedding].weight)
    sdpa = any(n.op == "call_function" and n.target is F.scaled_dot_product_attention for g in graphs for n in g.nodes)
    mha = any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    calls_sdpa = True if sdpa else (False if complete and not mha else None)  # None: a part was not traced
    return ModelStructure(
        blocks=blocks, n_blocks=n_blocks, block=Block(attention=attention, mlp=mlp) if attention or mlp else None,
        embedding=embedding, final_norm=final_norm, head=head, tied=tied, channels=tuple(channels),
        convolutional=any(isinstance(m, nn.Conv2d) for m in model.modules()), calls_sdpa=calls_sdpa, source="inferred",
        notes=tuple(notes))


def _same_in_every_block(found: list[tuple[Any, str | None]], what: str) -> tuple[Any, str | None]:
    """The part every block has alike (block 0's, when each block's own trace found the same), or (None, why)."""
    first, why = found[0]
    if first is None:
        return None, f"in block 0, {why}" if why else "not found in block 0"
    differ = next((i for i, (part, _) in enumerate(found) if part != first), None)
    if differ is not None:
        return None, f"block {differ}'s {what} differs from block 0's"
    return first, None


def find_blocks(model: nn.Module) -> str | None:
    """The dotted path of the model's blocks: ``blocks`` when it is an nn.ModuleList, else the ModuleList of two or
    more modules of one type holding the most parameters (a transformer's layers, a ResNet's stages), else None."""
    if isinstance(getattr(model, "blocks", None), nn.ModuleList):
        return "blocks"
    best, best_params = None, -1
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(m) for m in module}) != 1:
            continue
        n = sum(p.numel() for p in module.parameters())
        if n > best_params:
            best, best_params = path, n
    return best


def describe(model: nn.Module, blocks: str | None = None) -> ModelStructure:
    """A model's own description (a built-in model's ``trainbench_structure()``), else ``infer``'s with ``blocks``
    (the path of its blocks when known, else ``find_blocks``'s). What the trial uses for a workload that declares no
    structure, and a technique for a model it is handed without one."""
    own = getattr(model, "trainbench_structure", None)
    if callable(own):
        return own()
    return infer(model, blocks or find_blocks(model))


@dataclass
class Resolved:
    """A ``Cut`` resolved on a live model: the module holding the tensor, the tensor's name there, the dim."""

    module: nn.Module
    name: str
    dim: int
    path: str = field(default="")


def resolve(model: nn.Module, cut: Cut) -> Resolved | None:
    """The module and tensor name of ``cut`` in ``model``; None when the tensor is absent (a bias-free layer)."""
    owner, _, name = cut.tensor.rpartition(".")
    try:
        module = model.get_submodule(owner) if owner else model
    except AttributeError:
        raise ValueError(f"the model's description names {cut.tensor!r}, but the model has no module "
                         f"{owner!r}") from None
    if getattr(module, name, None) is None:
        return None
    return Resolved(module, name, cut.dim, cut.tensor)
