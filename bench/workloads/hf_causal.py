"""Hugging Face causal language models, built from a config, on the ``gpt`` workload's character corpus.

Source: ``transformers``' ``GPT2LMHeadModel`` built from a ``GPT2Config`` and ``LlamaForCausalLM`` from a
``LlamaConfig`` (the optional ``trainbench[transformers]`` extra). No weights are downloaded: the model is
initialised by transformers' own ``post_init`` after ``torch.manual_seed(seed)``, so it builds offline.

Why it exists: every other workload is a model the harness wrote; this one trains a model written by someone else,
with its own modules and calling conventions, through the same loop, techniques, data and metric. ``model`` is a
thin adapter whose ``forward(input_ids)`` returns the logits; the Hugging Face model is ``model.hf`` and its
decoder layers (``blocks``) are ``hf.transformer.h`` (GPT-2) or ``hf.model.layers`` (Llama).

Corpus, batches, loss and metric are the ``gpt`` workload's (``gpt_chars.load_corpus``, ``window_batches``,
``lm_loss``, ``lm_metrics``): the vocabulary is the corpus's characters, so the config's ``vocab_size`` and context
length (``seq_len``) are set by the workload. Dropout is 0 and the KV cache is off, so a run is deterministic.

Sizes: ``tiny`` is a GPT-2 of ``gpt:tiny``'s shape and budget (2 layers, 2 heads, d_model 64, context 64, batch
16, lr 3e-3, 150 steps, 10 evaluations of 32 windows), so the two can be compared; ``llama-tiny`` is a Llama of
the same width, depth and budget (SwiGLU width 176, about 8/3 of d_model, so its MLP has about as many parameters
as GPT-2's 4x MLP; tied embeddings like ``gpt:tiny``). Any other size is written ``MODEL_TYPE[:key=value...]``,
e.g. ``gpt2:n_layer=4:n_embd=128`` or ``llama:num_hidden_layers=2:hidden_size=128``: keys are attributes of the
model type's config class or the training keys (``batch_size``, ``lr``, ``seq_len``, ``quality_steps``,
``eval_points``, ``eval_windows``, ``corpus_mb``); unset keys come from that model type's tiny preset.

Quality budgets and validation targets (``quality_steps`` at ``batch_size``; see docs/methodology.md), set as for
``gpt``: the less demanding of the median over seeds of the baseline's val_loss at the evaluation nearest 70% of
the budget and the worst seed's best evaluation, from ``scripts/calibrate_targets.py`` (transformers 5.24, CPU):

- ``tiny``: seeds 0-6 at step 105: 2.304, 2.398, 2.660, 2.371, 2.321, 2.464, 2.609 (median 2.398), but seed 2
  never gets below 2.503 in the budget. Target 2.51 (2.503 rounded in the lenient direction).
- ``llama-tiny``: seeds 0-6 at step 105: 2.546, 2.261, 2.199, 2.112, 2.065, 2.392, 2.367 (median 2.261), but seed
  0 never gets below 2.299. Target 2.30.

Any other size has no target: a preset's target holds for its own model and budget only.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.core.structure import MLP as StructMLP
from bench.core.structure import Attention, ModelStructure, Scaling
from bench.core.structure import Block as StructBlock
from bench.core.text import shown
from bench.workloads.base import BuiltWorkload, Size, Workload, WorkloadError, register
from bench.workloads.gpt_chars import corpus_split, lm_workload

# model type -> (config class, model class, context-length attribute); its parts are in ``hf_structure``
MODEL_TYPES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "n_positions"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "max_position_embeddings"),
}
TRAIN_KEYS = {"batch_size": int, "lr": float, "seq_len": int, "quality_steps": int, "eval_points": int,
              "eval_windows": int, "corpus_mb": float}
# Config attributes the workload sets itself: the corpus fixes the vocabulary, seq_len the context; no generation,
# so no cache and no special tokens (GPT-2's default bos/eos 50256 lie outside a character vocabulary).
FIXED = {"vocab_size", "n_positions", "max_position_embeddings", "use_cache", "bos_token_id", "eos_token_id",
         "pad_token_id"}
NO_DROPOUT = {"gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, "llama": {"attention_dropout": 0.0}}
_DEFAULT_PRESET = {"gpt2": "tiny", "llama": "llama-tiny"}


def _config_class(model_type: str) -> type | None:
    """The transformers config class of ``model_type``, or None when transformers is not installed."""
    if importlib.util.find_spec("transformers") is None:
        return None
    import transformers

    return getattr(transformers, MODEL_TYPES[model_type][0])


def _parse(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text  # a string: accepted only where the config's default is one


_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _typed(value: Any, default: Any, where: str, raw: str) -> Any:
    """``value`` as the type of ``default`` (an int may stand for a float), or a WorkloadError."""
    kind = type(default)
    ok = (isinstance(value, kind) and (kind is bool) == isinstance(value, bool)) or \
        (kind is float and isinstance(value, int) and not isinstance(value, bool)) or default is None
    if not ok:
        raise WorkloadError(f"{where} must be {_KIND.get(kind, kind.__name__)}, not {shown(raw)}")
    return float(value) if kind is float else value


@dataclass(frozen=True)
class HFSize(Size):
    """An ``hf`` size: the model type, attributes of its config class, the training keys (``TRAIN_KEYS``; unset ones
    are ``tiny``'s) and the target. Its ``params()`` are flat: the config's attributes beside the training keys."""

    may_be_zero = ("corpus_mb",)
    derived = ("vocab_size",)  # the corpus's characters: set by the build, recorded in its params

    model_type: str  # a key of MODEL_TYPES
    config: Mapping[str, Any]  # attributes of the model type's config class (n_layer, hidden_size, ...)
    batch_size: int = 16
    lr: float = 3e-3
    seq_len: int = 64
    quality_steps: int = 150
    eval_points: int = 10
    eval_windows: int = 32
    corpus_mb: float = 0
    target: float | None = None  # validation loss; None: not calibrated (any size but a preset)

    def problem(self) -> str | None:
        if self.model_type not in MODEL_TYPES:
            return f"model_type {shown(self.model_type)} is not one of {', '.join(MODEL_TYPES)}"
        clash = sorted(set(self.config) & ({"model_type", "target", *TRAIN_KEYS} | FIXED))
        if clash:
            return f"config sets {', '.join(clash)}, which the size (or the workload) sets itself"
        return None

    def params(self) -> dict[str, Any]:
        return {"model_type": self.model_type, **self.config, **{k: getattr(self, k) for k in TRAIN_KEYS},
                "target": self.target}

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> HFSize:
        own = {"model_type", "target", *TRAIN_KEYS}
        given = {k: v for k, v in params.items() if k not in cls.derived}
        if "model_type" not in given:
            raise WorkloadError(f"HFSize lacks model_type (one of {', '.join(MODEL_TYPES)})")
        return cls(config={k: v for k, v in given.items() if k not in own},
                   **{k: v for k, v in given.items() if k in own})


@register
class HFCausalLM(Workload):
    name = "hf"
    summary = "Hugging Face GPT-2 / Llama (transformers, built from a config) on the gpt characters; metric val_loss"
    sizes = {
        "tiny": HFSize("gpt2", {"n_layer": 2, "n_head": 2, "n_embd": 64}, target=2.51),
        "llama-tiny": HFSize("llama", {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64,
                                       "intermediate_size": 176, "tie_word_embeddings": True}, target=2.30),
    }

    def check(self) -> str | None:
        if importlib.util.find_spec("transformers") is None:
            return "needs the transformers extra: pip install 'trainbench[transformers]'"
        return None

    def size_params(self, size: str) -> dict[str, Any]:
        if size in self.sizes:
            return self.sizes[size].params()
        model_type, *items = size.split(":")
        if model_type not in MODEL_TYPES:
            raise WorkloadError(f"hf size {shown(size)}: unknown model type {shown(model_type)} (presets: "
                                f"{', '.join(self.sizes)}; model types: {', '.join(MODEL_TYPES)}, e.g. gpt2:n_layer=2)")
        preset = self.sizes[_DEFAULT_PRESET[model_type]].params()
        p, seen = dict(preset), set()
        cfg_cls = _config_class(model_type)
        if cfg_cls is not None:  # its own attributes (not the generic PreTrainedConfig ones) and their aliases
            base = set(inspect.signature(cfg_cls.__mro__[1].__init__).parameters)
            own = [k for k in inspect.signature(cfg_cls.__init__).parameters if k not in base | FIXED]
            aliases, defaults = dict(getattr(cfg_cls, "attribute_map", {})), cfg_cls()
        for item in items:
            key, eq, raw = item.partition("=")
            where = f"hf size {shown(size)}: {shown(key)}"
            if not (eq and key and raw):
                raise WorkloadError(f"hf size {shown(size)}: {shown(item)} is not KEY=VALUE "
                                    f"(e.g. {model_type}:{list(preset)[1]}=4)")
            value = _parse(raw)
            if key in TRAIN_KEYS:
                value = _typed(value, TRAIN_KEYS[key](0), where, raw)
                if value < 0 or (value == 0 and key != "corpus_mb"):
                    raise WorkloadError(f"{where} must be positive, not {shown(raw)}")
            elif key in FIXED or (cfg_cls is not None and aliases.get(key) in FIXED):
                raise WorkloadError(f"{where} is set by the workload (the vocabulary by the corpus, the context "
                                    f"by seq_len)")
            elif cfg_cls is not None:
                key = aliases.get(key, key)
                if key not in own:
                    raise WorkloadError(f"{where}: {cfg_cls.__name__} has no such attribute (valid keys include "
                                        f"{', '.join(own[:8])}; training keys: {', '.join(TRAIN_KEYS)})")
                value = _typed(value, getattr(defaults, key), where, raw)
            if key in seen:
                raise WorkloadError(f"hf size {shown(size)}: {key} is given twice")
            seen.add(key)
            p[key] = value
        if p != preset:  # the preset's target (if any) is for the preset's model and budget only
            p["target"] = None
        return HFSize.of(p).params()

    def build(self, size: str, seed: int, device: torch.device) -> BuiltWorkload:
        return self.build_from(self.size_params(size), seed, device)

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        import transformers  # lazily: an optional extra, and slow to import

        p = HFSize.of(params).params()
        cfg_name, model_name, context_key = MODEL_TYPES[p["model_type"]]
        T = p["seq_len"]
        train, (x_eval, y_eval), vocab, record = corpus_split(p["corpus_mb"], T, p["eval_windows"])
        p["vocab_size"] = len(vocab)

        kwargs = {k: v for k, v in p.items() if k not in TRAIN_KEYS and k not in ("model_type", "target", "vocab_size")}
        kwargs = {**NO_DROPOUT[p["model_type"]], **kwargs, "vocab_size": len(vocab), context_key: T,
                  "use_cache": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
        cfg_cls, model_cls = getattr(transformers, cfg_name), getattr(transformers, model_name)
        if getattr(model_cls, "_supports_sdpa", False):  # the fused attention the gpt workload uses too
            kwargs["attn_implementation"] = "sdpa"
        torch.manual_seed(seed)
        hf = model_cls(cfg_cls(**kwargs))
        model = LogitsOnly(hf).to(device)

        return lm_workload(model, train, (x_eval, y_eval), p, record,
                           structure=config_structure(p["model_type"], hf.config))

    def structure_from(self, params: dict[str, Any]) -> ModelStructure:
        """The structure from the size's keys alone (the config class's defaults for unset ones: the preset's
        keys name every part a technique asks about)."""
        p = params
        if p["model_type"] == "gpt2":
            n_embd, heads = p.get("n_embd", 768), p.get("n_head", 12)
            return hf_structure("gpt2", p.get("n_layer", 12), heads, heads, n_embd, p.get("n_inner") or 4 * n_embd,
                                True)
        heads = p.get("num_attention_heads", 32)
        return hf_structure("llama", p.get("num_hidden_layers", 32), heads, p.get("num_key_value_heads") or heads,
                            p.get("hidden_size", 4096), p.get("intermediate_size", 11008),
                            bool(p.get("tie_word_embeddings", False)), p.get("head_dim"))


def config_structure(model_type: str, cfg: Any) -> ModelStructure:
    """The structure of a built model, read from its config."""
    if model_type == "gpt2":
        return hf_structure("gpt2", cfg.n_layer, cfg.n_head, cfg.n_head, cfg.n_embd, cfg.n_inner or 4 * cfg.n_embd,
                            bool(getattr(cfg, "tie_word_embeddings", True)))
    return hf_structure("llama", cfg.num_hidden_layers, cfg.num_attention_heads,
                        cfg.num_key_value_heads or cfg.num_attention_heads, cfg.hidden_size, cfg.intermediate_size,
                        bool(cfg.tie_word_embeddings), getattr(cfg, "head_dim", None))


def hf_structure(model_type: str, n_layer: int, heads: int, kv_heads: int, d: int, hidden: int, tied: bool,
                 head_dim: int | None = None) -> ModelStructure:
    """GPT-2 (``transformers.models.gpt2``): blocks ``transformer.h``, each ``ln_1``, ``attn`` (one fused
    ``c_attn`` Conv1D of (in, out) weights, ``c_proj``), ``ln_2``, ``mlp`` (``c_fc``, ``c_proj``); ``wte``,
    ``ln_f`` and the tied ``lm_head``. Llama (``transformers.models.llama``): blocks ``model.layers``, each
    ``input_layernorm`` and ``post_attention_layernorm`` (RMSNorm), ``self_attn`` (``q_proj``, ``k_proj``,
    ``v_proj``, ``o_proj``, rotary embeddings on q and k), ``mlp`` (``gate_proj``, ``up_proj``, ``down_proj``:
    SwiGLU); ``embed_tokens``, ``norm`` and ``lm_head``. Paths are from the harness's adapter (``hf.``). GPT-2
    adds the learned position embedding ``wpe`` and applies dropout ``drop`` before its blocks, which take the hidden
    state alone (causal without a mask); Llama's decoder layers take the rotary ``position_embeddings`` (cos, sin)
    that ``LlamaModel.forward`` computes once (``rotary_emb``) and passes in."""
    hd = head_dim or d // heads
    if model_type == "gpt2":
        block = StructBlock(
            attention=Attention(heads=heads, kv_heads=kv_heads, head_dim=hd, module="attn", qkv="attn.c_attn",
                                out="attn.c_proj", transposed=True),
            mlp=StructMLP(up="mlp.c_fc", down="mlp.c_proj", hidden=hidden, transposed=True), norms=("ln_1", "ln_2"))
        return ModelStructure(blocks="hf.transformer.h", n_blocks=n_layer, block=block, embedding="hf.transformer.wte",
                              position_embedding="hf.transformer.wpe", pre_blocks=("hf.transformer.drop",),
                              final_norm="hf.transformer.ln_f", head="hf.lm_head", tied=tied, causal=True,
                              convolutional=False, calls_sdpa=True,
                              scaling=Scaling(width=("n_embd",), depth=("n_layer",),
                                              multiple_of=(("n_embd", "n_head"),)),
                              source="hf: GPT-2 config and module names")
    block = StructBlock(
        attention=Attention(heads=heads, kv_heads=kv_heads, head_dim=hd, module="self_attn", q="self_attn.q_proj",
                            k="self_attn.k_proj", v="self_attn.v_proj", out="self_attn.o_proj", rotary=True),
        mlp=StructMLP(up="mlp.up_proj", gate="mlp.gate_proj", down="mlp.down_proj", hidden=hidden),
        norms=("input_layernorm", "post_attention_layernorm"))
    return ModelStructure(blocks="hf.model.layers", n_blocks=n_layer, block=block, embedding="hf.model.embed_tokens",
                          final_norm="hf.model.norm", head="hf.lm_head", tied=tied, causal=True, convolutional=False,
                          block_inputs=("position_embeddings",),
                          calls_sdpa=True,
                          scaling=Scaling(width=("hidden_size", "intermediate_size"), depth=("num_hidden_layers",),
                                          multiple_of=(("hidden_size", "num_attention_heads"),)),
                          source="hf: Llama config and module names")


class LogitsOnly(nn.Module):
    """``forward(input_ids)`` returns the logits tensor, as the harness's ``loss_fn(model(x), y)`` expects."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=input_ids, use_cache=False).logits
