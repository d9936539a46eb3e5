"""REINFORCE leave-one-out: on-policy RL from the proxy reward model with a KL penalty in the reward, no value head.

Method card
- What: each step samples ``k`` completions of each of ``batch / k`` prompts; a completion's reward is the reward
  model's score less ``beta`` x its sequence KL to the frozen start; its advantage is that reward less the mean of
  the other k - 1; the loss is REINFORCE's, ``-A log pi(y|x)``. Options: ``k`` (4), ``beta`` (0.05), ``reward`` as in
  ``grpo``.
- Why not PPO: its value head is a second network to train and tune; the leave-one-out baseline does its work for
  free. The KL sits in the reward, as in PPO-based RLHF; GRPO puts it in the loss.
- When it should pay: as GRPO: on-policy, no critic; each step pays generation. Not run on a GPU.
- Sources: Ahmadian et al., "Back to Basics", ACL 2024 (arXiv:2402.14740); Kool et al., "Buy 4 REINFORCE Samples,
  Get a Baseline for Free!", ICLR 2019 workshop; Ziegler et al., 2019 (arXiv:1909.08593).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-rloo (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-preference`: pref:tiny 0.21x [0.20, 0.22] slower, memory 0.80x less.
<!-- end generated -->
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from techniques._preference import GroupSampledMethod, check_group, reward_of, values
from techniques.base import Context, register


def rloo_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """Rewards (G * k,), consecutive groups of k: each less the mean of the other k - 1 of its group."""
    r = rewards.float().view(-1, k)
    others = (r.sum(dim=1, keepdim=True) - r) / (k - 1)
    return (r - others).view(-1)


@register
class RLOO(GroupSampledMethod):
    name = "rloo"
    summary = "REINFORCE leave-one-out: k on-policy samples per prompt, the KL penalty in the reward, no critic"
    own_flops = False  # it owns the step: flops_per_step counts a supervised step of its batch's shape, its own
    # estimate is in its results (techniques/_preference.py)
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        k: int = 4  # completions per prompt
        beta: float = 0.05  # KL coefficient of the reward's penalty
        reward: Literal["proxy", "gold", "zero"] = "proxy"

        def __post_init__(self) -> None:
            check_group(self.k, self.beta)

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Any,
                         ctx: Context) -> torch.Tensor:
        task = self.task(ctx)
        seqs = task.sample(model, x[:, : task.prompt_len], self.generator)
        logp = task.logprobs(model, seqs).sum(dim=1)
        with torch.no_grad():
            kl = logp.detach() - task.logprobs(task.start, seqs).sum(dim=1)
            score = reward_of(task, seqs, self.options.reward)
            rewards = score - self.options.beta * kl
            adv = rloo_advantages(rewards, self.options.k)
        loss = -(adv * logp).mean()
        loss.backward()
        self.last = {"reward_last": round(float(score.mean()), 4), "kl_last": round(float(kl.mean()), 4)}
        self.count(task, generated=seqs.shape[0], trained=seqs.shape[0])
        return loss.detach()

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The reward, k and the KL penalty in the reward: the last batch's reward and its KL to the start, per seed."""
        first = found[0]
        return (f"{first.get('reward')} reward, k {first.get('k')}, KL penalty {first.get('beta')} in the reward: "
                f"last batch's reward {values([f.get('reward_last') for f in found])}, its KL "
                f"{values([f.get('kl_last') for f in found])} nats; "
                f"{values([f.get('sequences_generated') for f in found])} completions sampled")
