"""Best-of-n: no training; at evaluation, sample n completions per prompt and keep the one the proxy scores best.

Method card
- What: the policy stays at the start; evaluation samples ``n`` (4) completions a prompt and keeps the reward model's
  best. Its KL to the start is the closed form ``log n - (n - 1) / n`` (Stiennon et al. 2020; an upper bound, Beirami
  et al. 2024).
- Why it is here: the no-training baseline of RLHF work: what a trained method must beat at the same KL. Its cost is
  inference, n samples and n reward-model forwards at every answer, instead of training once; the record counts them
  against a plain sample's.
- Sources: Stiennon et al., NeurIPS 2020 (arXiv:2009.01325); Gao et al., ICML 2023 (arXiv:2210.10760); Beirami et
  al., 2024 (arXiv:2401.01879).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-best_of_n (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-preference`: pref:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from techniques._preference import PreferenceMethod, fwd_flops, gen_flops, values
from techniques.base import Context, register


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n || base) = log n - (n - 1) / n (Stiennon et al. 2020, appendix; Beirami et al. 2024 show it is
    an upper bound, exact when the rewards of the n samples are distinct)."""
    return math.log(n) - (n - 1) / n


class BestOfN(nn.Module):
    """The policy evaluated as best-of-n: ``preference_sample`` is what the workload's evaluation samples with."""

    def __init__(self, policy: nn.Module, task: Any, n: int) -> None:
        super().__init__()
        self.policy = policy
        self.task = task  # not a submodule: the frozen reward model is not part of the evaluated module
        self.n = n

    def forward(self, idx: torch.Tensor) -> Any:
        return self.policy(idx)

    def preference_sample(self, prompts: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, float]:
        seqs = self.task.sample(self.policy, prompts.repeat_interleave(self.n, dim=0), generator)
        scores = self.task.proxy(seqs).view(-1, self.n)
        best = scores.argmax(dim=1) + torch.arange(len(prompts), device=scores.device) * self.n
        return seqs[best], best_of_n_kl(self.n)


@register
class BestOfNSampling(PreferenceMethod):
    name = "best_of_n"
    summary = "no training: sample n completions per prompt, keep the proxy's best (KL = log n - (n-1)/n)"
    own_flops = False  # it owns the step: flops_per_step counts a supervised step of its batch's shape, its own
    # estimate is in its results (techniques/_preference.py)
    hides_tensors = False
    tune_options = ("",)
    trains = False  # its steps are empty: the report gives them no speed or memory ratio
    uses_reference = False  # no loss against the start: only the reward model is held

    @dataclass(frozen=True)
    class Options:
        n: int = 4  # samples per prompt

        def __post_init__(self) -> None:
            if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
                raise ValueError(f"n must be an integer >= 1 (samples per prompt), got {self.n!r}")

    def draw(self, task: Any, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        x = torch.zeros(batch_size, task.seq_len, dtype=torch.long)
        while True:
            yield x, torch.zeros(batch_size, dtype=torch.long)

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Any,
                         ctx: Context) -> torch.Tensor:
        self.count(self.task(ctx))
        return torch.zeros((), device=x.device)

    def continuation_blocker(self, ctx: Context) -> str | None:
        return "best_of_n trains nothing: training on past the budget would change nothing"

    def eval_model(self, model: nn.Module, ctx: Context) -> nn.Module:
        return BestOfN(model, self.task(ctx), self.options.n)

    def results(self, ctx: Context) -> dict[str, Any] | None:
        out: dict[str, Any] = {"n": self.options.n, "kl_formula": round(best_of_n_kl(self.options.n), 6),
                               **self.found(ctx)}
        task = ctx.preference
        if task is not None:
            n_pol, n_rm = out["policy_params"], out["reward_model_params"]
            out["inference_flops_per_prompt"] = (gen_flops(task, n_pol, self.options.n)
                                                 + fwd_flops(task, n_rm, self.options.n))
            out["plain_sample_flops"] = gen_flops(task, n_pol, 1)
        return out

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """N and the proxy-best selection: the KL of best-of-n, log n - (n-1)/n, and the inference FLOPs per prompt against one plain sample."""
        first = found[0]
        plain = first.get("plain_sample_flops") or 0
        cost = first.get("inference_flops_per_prompt") or 0
        return (f"n {first.get('n')}: no training; KL to the start log n - (n-1)/n = {first.get('kl_formula')} nats; "
                f"each answer costs {cost / plain:.3g}x a plain sample's FLOPs at inference "
                f"(reward model {values([f.get('rm_heldout_accuracy') for f in found][:1])} held-out pair accuracy)"
                if plain else f"n {first.get('n')}: no training; KL formula {first.get('kl_formula')}")
