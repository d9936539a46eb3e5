"""Learning from preferences: the gpt character model, fine-tuned towards a programmatic gold reward.

What the workload is (every part fixed and seeded; the trial's seed changes only the method's own randomness: its
batch order and its samples):

- **The starting policy** (the supervised stage): the ``gpt`` character model of the size's shape, trained once on
  the corpus's training split (``sft_steps`` steps of AdamW at ``sft_lr``, batch ``sft_batch``, initialisation and
  batch order from ``SFT_SEED``). It is the model every set starts from and the reference ``KL(policy || start)`` is
  measured against. Its cost (``sft_train_s``) is reported apart, in the record's ``workload.dataset.preference``,
  never charged to a trial.
- **Prompts**: the first ``prompt_len`` characters of evenly spaced windows of the held-out 10% of the corpus (the
  supervised stage never saw it): ``n_train_prompts`` from its first half for training, ``n_eval_prompts`` from its
  second half for evaluation. A completion is ``completion_len`` characters sampled at temperature 1.
- **The gold reward** of a completion (``gold_reward``), deterministic and cheap, in [0, 1]::

      gold = closeness * variety
      closeness = max(0, 1 - |f - VOWEL_TARGET| / VOWEL_TARGET)   f: the completion's fraction of vowels (aeiouAEIOU)
      variety   = distinct character bigrams / (completion_len - 1)

  The starting policy writes English-like text with about a quarter of its characters vowels, so it scores about
  0.5; text at the target vowel rate with no repeated bigram scores 1. A degenerate string does not maximise it:
  ``aaaa...`` overshoots the vowel rate (closeness 0) and repeats one bigram (variety 1/23); a short cycle such as
  ``aeiou`` repeated has the right rate but variety 5/23. Raising the vowel rate is easy for a character model (a
  shift of its unigram distribution); doing it without repeating itself is the real trade-off, and a policy that
  collapses onto a few characters scores low.
- **Preference data**: for ``n_pairs`` pairs, a training prompt (``pair i`` uses prompt ``i mod n_train_prompts``)
  and two completions sampled from the starting policy; the first is preferred with the Bradley-Terry probability
  ``sigmoid((gold_a - gold_b) / bt_scale)``, drawn from ``PAIR_SEED``. The label noise this leaves is measured and
  recorded (``label_agreement``: the fraction of pairs whose label agrees with the gold order, ties left out; about
  0.8 at ``bt_scale`` 0.05). The last ``heldout_pairs`` of them are held out for the reward model's accuracy.
- **The proxy reward model**: the starting policy's trunk (embeddings, blocks, final LayerNorm) with a scalar head on
  the mean of the completion positions' hidden states, initialised from the starting policy, trained on the pairs
  with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected)`` (``rm_steps`` of AdamW at ``rm_lr``, batch
  ``rm_batch`` pairs). Its held-out pair accuracy (``rm_heldout_accuracy``) is recorded: it must beat chance, and
  how far it stays from 1 is how much room there is to over-optimise it (Gao et al. 2022).

The starting policy, the pairs and the reward model are built together once per sweep, cached in the sweep's
reference directory (``references/pref-<key>.pt``, the key a hash of the size's parameters, the corpus's sha256 and
the seeds) and kept in memory for the process; their costs are kept in the cache, so a cache hit still reports them.

``evaluate`` samples ``eval_samples`` completions per evaluation prompt (from ``EVAL_SEED``, the same draws at every
evaluation and for every set) and returns ``gold_reward`` (the metric the reports follow, higher is better),
``proxy_reward`` (the reward model's mean score), ``kl`` (``KL(policy || start)`` in nats per completion, estimated
as the mean over the samples of ``sum_t log pi(y_t) - log pi_start(y_t)``, unbiased for the sequence KL), and the
gold reward's two factors (``vowel_frac``, ``variety``). The proxy reward and KL are recorded beside the metric at
every evaluation point (the record's ``quality.curve_extra``), which is what the report's reward-KL frontier plots.
A technique that changes how a policy is sampled (best-of-n) hands evaluation a module with ``preference_sample``
(samples and the KL that the sampling scheme has in closed form); evaluation uses it.

**Baseline**: on this workload the baseline is continued supervised training on the corpus at the same sample
budget (the workload's batches are corpus windows and its loss is the character cross-entropy): the control that
every preference method must beat, answering "is the gain from the preferences, or from training longer?" Its
gold reward stays near the start's, and its KL shows how far plain training drifts. The policy left at the start is
the first evaluation of every curve (step 0). A "sample" is one sequence trained with a gradient: a corpus window,
one side of a DPO pair, one sampled completion of an RL method.

Targets (``tiny``: see ``TINY_TARGET`` below) and the margin: a gold-reward difference of 0.02 or less at equal
samples is equivalent (``GOLD_MARGIN``).

Sources: Rafailov et al., "Direct Preference Optimization", NeurIPS 2023 (arXiv:2305.18290); Gao, Schulman,
Hilton, "Scaling Laws for Reward Model Overoptimization", ICML 2023 (arXiv:2210.10760): a gold reward beside a proxy
trained on its labels; Bradley & Terry, Biometrika 1952; Stiennon et al., "Learning to summarize from human
feedback", NeurIPS 2020 (arXiv:2009.01325): the reward model on the policy's trunk.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.files import save_torch_atomic
from bench.core.structure import ModelStructure
from bench.workloads.base import BuiltWorkload, Workload, artefact_dir, register
from bench.workloads.gpt_chars import (
    GPT,
    GPTConfig,
    GptSize,
    corpus_split,
    gpt_structure,
    lm_workload,
    window_batches,
)

log = logging.getLogger(__name__)

SFT_SEED = 30_000  # the starting policy's initialisation and batch order
PAIR_SEED = 30_001  # the pairs' samples and their Bradley-Terry draws
RM_SEED = 30_002  # the reward model's head and batch order
EVAL_SEED = 30_003  # evaluation's samples: the same draws at every evaluation and for every set
VOWELS = "aeiouAEIOU"
VOWEL_TARGET = 0.4  # the vowel rate the gold reward wants (the corpus's is about 0.25)
GOLD_MARGIN = 0.02  # a gold-reward difference at equal samples that does not decide between methods


def gold_reward_text(text: str, target: float = VOWEL_TARGET) -> float:
    """The gold reward of one completion string (see the module docstring): closeness of its vowel rate to
    ``target`` times the fraction of its character bigrams that are distinct."""
    if len(text) < 2:
        return 0.0
    f = sum(c in VOWELS for c in text) / len(text)
    closeness = max(0.0, 1.0 - abs(f - target) / target)
    variety = len({text[i : i + 2] for i in range(len(text) - 1)}) / (len(text) - 1)
    return closeness * variety


def gold_parts(completions: torch.Tensor, vowel_mask: torch.Tensor, vocab_size: int,
               target: float = VOWEL_TARGET) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gold, vowel fraction, variety) of completions (B, L) of token ids, vectorised: the same numbers as
    ``gold_reward_text`` on their decoded strings."""
    c = completions.long().cpu()
    frac = vowel_mask[c].float().mean(dim=1)
    closeness = (1.0 - (frac - target).abs() / target).clamp(min=0.0)
    bigrams = c[:, :-1] * vocab_size + c[:, 1:]
    ordered, _ = torch.sort(bigrams, dim=1)
    distinct = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(dim=1)
    variety = distinct.float() / bigrams.shape[1]
    return closeness * variety, frac, variety


def bt_labels(gold_a: torch.Tensor, gold_b: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """Bradley-Terry labels: True where the first of a pair is preferred, drawn with probability
    sigmoid((gold_a - gold_b) / scale) from ``generator`` (a smaller scale: less label noise)."""
    return torch.rand(len(gold_a), generator=generator) < torch.sigmoid((gold_a - gold_b) / scale)


def trunk_features(gpt: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The GPT's hidden states after its final LayerNorm (B, T, d_model): its forward without the head."""
    pos = torch.arange(idx.shape[1], device=idx.device)
    x = gpt.drop(gpt.wte(idx) + gpt.wpe(pos))
    for block in gpt.blocks:
        x = block(x)
    return gpt.ln_f(x)


class RewardModel(nn.Module):
    """The policy's trunk with a scalar head on the mean hidden state of the completion's positions."""

    def __init__(self, trunk: GPT, prompt_len: int) -> None:
        super().__init__()
        self.trunk = trunk
        self.prompt_len = prompt_len
        self.score = nn.Linear(trunk.cfg.d_model, 1)

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        hidden = trunk_features(self.trunk, seqs)[:, self.prompt_len :]
        return self.score(hidden.mean(dim=1)).squeeze(-1)


@torch.no_grad()
def sample(model: nn.Module, prompts: torch.Tensor, length: int, generator: torch.Generator,
           temperature: float = 1.0) -> torch.Tensor:
    """Prompts (B, P) followed by ``length`` characters sampled from ``model`` (B, P + length): one forward of the
    whole prefix per character (no KV cache: the sequences are short), draws from the CPU ``generator``."""
    seq = prompts
    for _ in range(length):
        out = model(seq)
        logits = (out.logits if hasattr(out, "logits") else out)[:, -1, :].float()
        probs = torch.softmax(logits / temperature, dim=-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=generator).to(seq.device)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


def completion_logprobs(model: nn.Module, seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Per-character log-probabilities (B, L) of each sequence's completion (the characters after ``prompt_len``)
    under ``model``, in float32; with a gradient when one is being recorded."""
    out = model(seqs[:, :-1])
    logits = (out.logits if hasattr(out, "logits") else out)[:, prompt_len - 1 :].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, seqs[:, prompt_len:, None]).squeeze(-1)


def generation_flops(n_params: int, prompt_len: int, length: int) -> int:
    """Forward FLOPs of sampling one completion without a KV cache: 2 x params x the prefix length, per character
    (the usual 2N-per-token estimate, Kaplan et al. 2020)."""
    return 2 * n_params * sum(prompt_len + t for t in range(length))


@dataclass
class PreferenceTask:
    """The preference structure a technique finds on ``BuiltWorkload.preference`` (the ``Preference`` interface of
    ``bench.workloads.base``): prompts, pairs, the frozen starting policy and reward model, the gold reward, and
    samplers. Tensors live on the workload's device."""

    prompt_len: int
    completion_len: int
    vocab: list[str]
    train_prompts: torch.Tensor  # (n_train_prompts, P)
    eval_prompts: torch.Tensor  # (n_eval_prompts, P)
    chosen: torch.Tensor  # (n_train_pairs, P + L): the preferred sequence of each training pair
    rejected: torch.Tensor  # (n_train_pairs, P + L)
    heldout_chosen: torch.Tensor
    heldout_rejected: torch.Tensor
    start: nn.Module  # the starting policy, frozen, eval mode
    reward_model: RewardModel  # frozen, eval mode
    vowel_mask: torch.Tensor
    meta: dict[str, Any] = field(default_factory=dict)  # what it cost and how good it is (record: dataset)

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.completion_len

    def gold(self, seqs: torch.Tensor) -> torch.Tensor:
        """Gold reward of each sequence's completion (B,), on the sequences' device."""
        return gold_parts(seqs[:, self.prompt_len :], self.vowel_mask, len(self.vocab))[0].to(seqs.device)

    @torch.no_grad()
    def proxy(self, seqs: torch.Tensor) -> torch.Tensor:
        """The reward model's score of each sequence (B,)."""
        return self.reward_model(seqs).float()

    def sample(self, model: nn.Module, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return sample(model, prompts, self.completion_len, generator)

    def logprobs(self, model: nn.Module, seqs: torch.Tensor) -> torch.Tensor:
        return completion_logprobs(model, seqs, self.prompt_len)

    def generation_flops(self, n_params: int) -> int:
        """Forward FLOPs of sampling one completion with ``sample`` (no KV cache) from a model of ``n_params``."""
        return generation_flops(n_params, self.prompt_len, self.completion_len)


# tiny's gold-reward target: halfway from the start's gold reward (0.509) to what the oracle (grpo:reward=gold, the
# gold reward itself as the reward) reaches at the end of the budget (0.815, seed 0), rounded down: 0.65. The baseline
# (more supervised training) never reaches it; the calibration run (seed 0, lr 3e-4, 60 steps): dpo 0.777 at step
# 20 then 0.322 at the end, ipo 0.727, grpo 0.758 at step 10 then 0.096, rloo 0.753 then 0.033, best_of_n (n=4)
# 0.644 throughout.
TINY_TARGET = 0.65


@dataclass(frozen=True)
class PrefSize(GptSize):
    """A ``pref`` size: the ``gpt`` model's (the policy's shape, the batch and LR of the methods, the corpus, the
    budget and the target on the gold reward), and what the preference structure is built from (docstring)."""

    prompt_len: int
    completion_len: int
    n_train_prompts: int
    n_eval_prompts: int
    eval_samples: int  # completions sampled per evaluation prompt
    sft_steps: int  # the starting policy's supervised training
    sft_lr: float
    sft_batch: int
    n_pairs: int  # preference pairs, the held-out ones included
    heldout_pairs: int  # of them, held out for the reward model's accuracy
    bt_scale: float  # the Bradley-Terry label noise's scale
    rm_steps: int  # the reward model's training
    rm_lr: float
    rm_batch: int

    def problem(self) -> str | None:
        if self.prompt_len + self.completion_len > self.seq_len:
            return (f"a prompt and its completion ({self.prompt_len} + {self.completion_len} tokens) must fit the "
                    f"context (seq_len {self.seq_len})")
        if self.heldout_pairs >= self.n_pairs:
            return f"heldout_pairs {self.heldout_pairs} leaves none of the {self.n_pairs} pairs to train on"
        return super().problem()


@register
class Preference(Workload):
    name = "pref"
    summary = ("preference learning: the gpt character model fine-tuned towards a programmatic gold reward "
               "(pairs, a proxy reward model); metric gold_reward")
    has_preferences = True
    pretrained_start = True
    sizes = {
        "tiny": PrefSize(n_layer=2, n_head=2, d_model=64, seq_len=64, batch_size=16, lr=3e-4, corpus_mb=0,
                         eval_windows=32, target=TINY_TARGET, quality_steps=60, eval_points=6, prompt_len=16,
                         completion_len=24, n_train_prompts=256, n_eval_prompts=64, eval_samples=2, sft_steps=300,
                         sft_lr=3e-3, sft_batch=16, n_pairs=640, heldout_pairs=128, bt_scale=0.05, rm_steps=300,
                         rm_lr=1e-3, rm_batch=32),
    }

    def structure_from(self, params: dict[str, Any]) -> ModelStructure:
        """The ``gpt`` model's parts (the policy is that model); no source task (the workload builds none)."""
        return dataclasses.replace(gpt_structure(params["n_layer"], params["n_head"], params["d_model"]),
                                   source_task=None)

    def build_from(self, params: dict[str, Any], seed: int, device: torch.device) -> BuiltWorkload:
        p = PrefSize.of(params).params()
        train, held_out_windows, vocab, record = corpus_split(p["corpus_mb"], p["seq_len"], p["eval_windows"])
        p["vocab_size"] = len(vocab)
        task = preference_task(p, vocab, record, device)
        cfg = GPTConfig(vocab_size=len(vocab), seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                        d_model=p["d_model"])
        torch.manual_seed(seed)
        model = GPT(cfg).to(device)
        model.load_state_dict(task.start.state_dict())
        dataset = dict(record, preference=dict(task.meta))
        built = lm_workload(model, train, held_out_windows, p, dataset, preference=task,
                            curve_metrics=("proxy_reward", "kl"), structure=self.structure_from(p))
        built.metric, built.higher_is_better, built.margin = "gold_reward", True, GOLD_MARGIN
        built.evaluate = lambda m: evaluate(task, m, p["eval_samples"])
        built.batches = lambda batch_size, bseed: window_batches(train, batch_size, p["seq_len"], bseed)
        return built


def evaluate(task: PreferenceTask, module: nn.Module, per_prompt: int) -> dict[str, float]:
    """Gold and proxy reward of samples on the evaluation prompts, and KL(policy || start) (see the docstring)."""
    gen = torch.Generator().manual_seed(EVAL_SEED)
    prompts = task.eval_prompts.repeat_interleave(per_prompt, dim=0)
    custom: Callable[..., tuple[torch.Tensor, float]] | None = getattr(module, "preference_sample", None)
    if custom is not None:
        seqs, kl = custom(prompts, gen)
    else:
        seqs = task.sample(module, prompts, gen)
        kl = float((task.logprobs(module, seqs) - task.logprobs(task.start, seqs)).sum(dim=1).mean())
    gold, frac, variety = gold_parts(seqs[:, task.prompt_len :], task.vowel_mask, len(task.vocab))
    return {"gold_reward": float(gold.mean()), "proxy_reward": float(task.proxy(seqs).mean()), "kl": kl,
            "vowel_frac": float(frac.mean()), "variety": float(variety.mean())}


# ---- the artefacts built once: starting policy, pairs, reward model ------------------------------------------

_MEMO: dict[str, dict[str, Any]] = {}
_ARTEFACT_KEYS = ("n_layer", "n_head", "d_model", "seq_len", "corpus_mb", "prompt_len", "completion_len",
                  "n_train_prompts", "n_eval_prompts", "sft_steps", "sft_lr", "sft_batch", "n_pairs", "heldout_pairs",
                  "bt_scale", "rm_steps", "rm_lr", "rm_batch")


def artefact_key(p: dict[str, Any], dataset_sha: str | None) -> str:
    spec = {k: p[k] for k in _ARTEFACT_KEYS} | {"dataset": dataset_sha, "seeds": [SFT_SEED, PAIR_SEED, RM_SEED],
                                                 "vowel_target": VOWEL_TARGET, "version": 1}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def prompts_of(p: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(training prompts, evaluation prompts): prefixes of evenly spaced windows of the held-out split's first and
    second halves (no RNG)."""
    from bench.workloads.gpt_chars import load_corpus

    ids, _, record = load_corpus(p["corpus_mb"])
    held = torch.from_numpy(ids[record["n_train"] :])
    half = len(held) // 2
    P = p["prompt_len"]

    def spaced(part: torch.Tensor, n: int) -> torch.Tensor:
        starts = torch.linspace(0, len(part) - P - 1, n).long()
        return part[starts[:, None] + torch.arange(P)]

    return spaced(held[:half], p["n_train_prompts"]), spaced(held[half:], p["n_eval_prompts"])


def preference_task(p: dict[str, Any], vocab: list[str], record: dict[str, Any],
                    device: torch.device) -> PreferenceTask:
    """The task of size parameters ``p``: from this process's memo, the sweep's cache, or built now."""
    key = artefact_key(p, record.get("sha256"))
    saved, cached = _MEMO.get(key), True
    where = artefact_dir()
    path = where / f"pref-{key}.pt" if where is not None else None
    if saved is None and path is not None and path.exists():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        saved["meta"] = json.loads(saved["meta"])
    if saved is None:
        saved, cached = build_artefacts(p, vocab), False
    if path is not None and not path.exists():  # built here, or by this process before the sweep's cache was set
        save_torch_atomic(path, {**saved, "meta": json.dumps(saved["meta"])})
    _MEMO[key] = saved
    cfg = GPTConfig(vocab_size=len(vocab), seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                    d_model=p["d_model"])
    start = GPT(cfg)
    start.load_state_dict(saved["sft"])
    rm = RewardModel(GPT(cfg), p["prompt_len"])
    rm.load_state_dict(saved["rm"])
    for m in (start, rm):
        m.to(device).eval().requires_grad_(False)
    train_prompts, eval_prompts = prompts_of(p)
    n_train = p["n_pairs"] - p["heldout_pairs"]
    chosen, rejected = saved["chosen"].to(device), saved["rejected"].to(device)
    mask = torch.tensor([c in VOWELS for c in vocab])
    return PreferenceTask(p["prompt_len"], p["completion_len"], vocab, train_prompts.to(device),
                          eval_prompts.to(device), chosen[:n_train], rejected[:n_train], chosen[n_train:],
                          rejected[n_train:], start, rm, mask, {**saved["meta"], "cached": cached, "key": key})


def build_artefacts(p: dict[str, Any], vocab: list[str]) -> dict[str, Any]:
    """Train the starting policy, sample and label the pairs, train the reward model (on the CPU, seeded)."""
    meta: dict[str, Any] = {}
    with torch.random.fork_rng(devices=[]):
        policy = _supervised_stage(p, vocab, meta)
        chosen, rejected, g_c, g_r = _labelled_pairs(p, vocab, policy, meta)
        rm = _reward_model(p, policy, chosen, rejected, g_c, g_r, meta)
    log.info("preference artefacts built: %s", meta)
    return {"sft": {k: v.detach().clone() for k, v in policy.state_dict().items()},
            "rm": {k: v.detach().clone() for k, v in rm.state_dict().items()},
            "chosen": chosen, "rejected": rejected, "meta": meta}


def _supervised_stage(p: dict[str, Any], vocab: list[str], meta: dict[str, Any]) -> GPT:
    """The starting policy: the character model trained ``sft_steps`` on the corpus."""
    started = time.perf_counter()
    train, held_out_windows, _, record = corpus_split(p["corpus_mb"], p["seq_len"], p["eval_windows"])
    cfg = GPTConfig(vocab_size=len(vocab), seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                    d_model=p["d_model"])
    torch.manual_seed(SFT_SEED)
    policy = GPT(cfg)
    sft = lm_workload(policy, train, held_out_windows, {**p, "batch_size": p["sft_batch"], "lr": p["sft_lr"]},
                      record)
    # The supervised stage is the plain loop's math (AdamW at weight decay 0, one micro-batch), written out here:
    # a workload sits below bench.loop in the layers (tests/test_layers.py).
    optimizer = torch.optim.AdamW(policy.parameters(), lr=p["sft_lr"], weight_decay=0.0)
    batches = window_batches(train, p["sft_batch"], p["seq_len"], SFT_SEED)
    policy.train()
    for _ in range(p["sft_steps"]):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        sft.loss_fn(policy(x), y).backward()
        optimizer.step()
    policy.eval()
    with torch.no_grad():
        val = sft.evaluate(policy)
    meta["sft_train_s"] = round(time.perf_counter() - started, 3)
    meta["sft_steps"] = p["sft_steps"]
    meta["sft_val_loss"] = round(val["val_loss"], 6)
    return policy


def _labelled_pairs(p: dict[str, Any], vocab: list[str], policy: GPT, meta: dict[str, Any]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs of the starting policy's completions, labelled by a Bradley-Terry draw on their gold rewards:
    (chosen, rejected, gold of chosen, gold of rejected)."""
    started = time.perf_counter()
    train_prompts, _ = prompts_of(p)
    n = p["n_pairs"]
    prompts = train_prompts[torch.arange(n) % len(train_prompts)]
    gen = torch.Generator().manual_seed(PAIR_SEED)
    a = torch.cat([sample(policy, prompts[i : i + 256], p["completion_len"], gen) for i in range(0, n, 256)])
    b = torch.cat([sample(policy, prompts[i : i + 256], p["completion_len"], gen) for i in range(0, n, 256)])
    mask = torch.tensor([c in VOWELS for c in vocab])
    ga = gold_parts(a[:, p["prompt_len"] :], mask, len(vocab))[0]
    gb = gold_parts(b[:, p["prompt_len"] :], mask, len(vocab))[0]
    a_wins = bt_labels(ga, gb, p["bt_scale"], gen)
    chosen = torch.where(a_wins[:, None], a, b)
    rejected = torch.where(a_wins[:, None], b, a)
    g_c, g_r = torch.where(a_wins, ga, gb), torch.where(a_wins, gb, ga)
    untied = g_c != g_r
    meta["pairs_s"] = round(time.perf_counter() - started, 3)
    meta["n_pairs"] = n  # the held-out pairs are other samples; their prompts recur among the training pairs'
    meta["heldout_pairs"] = p["heldout_pairs"]
    meta["bt_scale"] = p["bt_scale"]
    meta["label_agreement"] = round(float((g_c > g_r)[untied].float().mean()), 4)
    meta["start_gold_pairs"] = round(float(torch.cat([ga, gb]).mean()), 4)
    return chosen, rejected, g_c, g_r


def _reward_model(p: dict[str, Any], policy: GPT, chosen: torch.Tensor, rejected: torch.Tensor, g_c: torch.Tensor,
                  g_r: torch.Tensor, meta: dict[str, Any]) -> RewardModel:
    """The proxy: the policy's trunk and a scalar head, Bradley-Terry loss on the training pairs; its accuracy on
    the held-out pairs (the last ``heldout_pairs``) beside the gold order's own."""
    started = time.perf_counter()
    n = p["n_pairs"]
    torch.manual_seed(RM_SEED)
    rm = RewardModel(copy.deepcopy(policy), p["prompt_len"])
    rm.train()
    opt = torch.optim.AdamW(rm.parameters(), lr=p["rm_lr"])
    n_train = n - p["heldout_pairs"]
    order = torch.Generator().manual_seed(RM_SEED)
    perm = torch.randperm(n_train, generator=order)
    pos, B = 0, p["rm_batch"]
    for _ in range(p["rm_steps"]):
        if pos + B > n_train:
            perm, pos = torch.randperm(n_train, generator=order), 0
        idx = perm[pos : pos + B]
        pos += B
        scores = rm(torch.cat([chosen[idx], rejected[idx]]))
        loss = -F.logsigmoid(scores[:B] - scores[B:]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    rm.eval()
    with torch.no_grad():
        def accuracy(lo: int, hi: int) -> float:
            s = rm(torch.cat([chosen[lo:hi], rejected[lo:hi]]))
            return float((s[: hi - lo] > s[hi - lo :]).float().mean())

        meta["rm_train_accuracy"] = round(accuracy(0, n_train), 4)
        meta["rm_heldout_accuracy"] = round(accuracy(n_train, n), 4)
        # the gold order's own accuracy on the held-out labels: the ceiling the label noise leaves
        meta["gold_heldout_accuracy"] = round(float((g_c[n_train:] > g_r[n_train:]).float().mean()), 4)
    meta["rm_train_s"] = round(time.perf_counter() - started, 3)
    meta["rm_steps"] = p["rm_steps"]
    return rm

