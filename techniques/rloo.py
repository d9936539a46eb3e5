"""REINFORCE leave-one-out: on-policy RL from the proxy reward model with a KL penalty in the reward, no value head.

Method card
- What (Ahmadian et al. 2024, eq. 7; Kool et al. 2019): every step samples ``k`` completions of each of
  ``batch / k`` training prompts from the current policy; each completion's reward is the reward model's score
  minus the KL penalty to the frozen starting policy, ``r_i = R(x, y_i) - beta * sum_t [log pi(y_t) - log
  pi_ref(y_t)]`` (the sequence-level estimate, no gradient through it); its advantage is its reward less the mean
  of the *other* k - 1 completions' (``rloo_advantages``: an unbiased baseline, no learnt critic), and the loss is
  ``-mean_i A_i * log pi(y_i | x)``, the completion's summed log-probability.
- Why RLOO and not PPO: PPO's value head is a second network as large as its trunk, with its own loss, learning rate
  and clipping to tune, and at this size (a 2-layer character model, completions of 24 characters, one update per
  batch) the leave-one-out baseline of k samples does the value head's work for free. Ahmadian et al. find RLOO
  matching or beating PPO in RLHF at less memory and compute; it is also the "REINFORCE with a baseline" the issue
  allows. The KL penalty sits in the reward, as in PPO-based RLHF (Ziegler et al. 2019, Stiennon et al. 2020),
  where GRPO puts it in the loss: the two place the same regulariser differently.
- Options: ``k`` (4), ``beta`` (0.05) the KL coefficient, ``reward`` = proxy | gold | zero (zero: a control whose
  only signal is the KL penalty; from the start, where the policy equals the reference, it does not move at all).
- What is measured: gold reward, proxy reward and KL at every evaluation (the frontier); in ``technique_results``
  the last batch's mean reward and KL, completions generated, an estimate of the FLOPs per step.
- Memory: the starting policy and (``reward=proxy``) the reward model are held beside the model.
- Sources: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
  Feedback in LLMs", ACL 2024 (arXiv:2402.14740); Kool, van Hoof, Welling, "Buy 4 REINFORCE Samples, Get a Baseline
  for Free!", ICLR 2019 workshop; Ziegler et al., "Fine-Tuning Language Models from Human Preferences", 2019
  (arXiv:1909.08593).
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
