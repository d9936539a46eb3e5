"""Group relative policy optimisation: on-policy RL with advantages relative to k samples of the same prompt.

Method card
- What (Shao et al. 2024, DeepSeekMath, eq. 3 and the outcome-supervision advantage of section 4.1.2): every step
  draws ``batch / k`` training prompts, samples ``k`` completions of each from the current policy, scores them with
  the reward (``reward``: the proxy reward model, or the gold reward itself, the oracle), and normalises the rewards
  within each prompt's group, ``A_i = (r_i - mean(r)) / (std(r) + 1e-4)`` (``group_advantages``: they sum to zero per
  group). The loss is the mean over the group's completions and their characters of

      -(A_i * log pi(y_t) - beta * KL_t),    KL_t = pi_ref/pi - log(pi_ref/pi) - 1

  the per-character KL estimator of the paper (unbiased, always >= 0, Schulman 2020's k3) to the frozen starting
  policy. One gradient step per batch of samples, so the clipped importance ratio of the paper is 1 and its
  gradient is the plain policy gradient above (the clip matters only when a batch is reused, which costs more
  steps than it saves at this size).
- Options: ``k`` (4) completions per prompt; ``beta`` (0.04, DeepSeekMath's) the KL coefficient; ``reward`` =
  proxy | gold | zero: proxy is the method; gold is the oracle ceiling (what the same optimisation reaches when the
  reward cannot be gamed); zero is a control (only the KL term acts).
- What is measured: gold reward, proxy reward and KL to the start at every evaluation; in ``technique_results``
  the mean reward of the last group of samples, completions and characters generated, and an estimate of the FLOPs
  per step (sampling the k completions without KV cache, the policy's forward and backward, the reference's and the
  reward model's forwards). Over-optimisation (Gao et al. 2022) shows as proxy reward rising while gold falls.
- When it helps: no value network (the group is the baseline), so it is cheaper than PPO in memory and has one
  hyper-parameter fewer to tune; on-policy, so it reaches optima where the starting policy puts little mass
  (Tajwar et al. 2024). Each step pays generation, the largest part of its time on a CPU.
- Memory: the starting policy and (``reward=proxy``) the reward model are held beside the model (``held_parts``).
- Sources: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
  2024 (arXiv:2402.03300); Schulman, "Approximating KL Divergence", 2020 (http://joschu.net/blog/kl-approx.html);
  Gao, Schulman, Hilton, "Scaling Laws for Reward Model Overoptimization", ICML 2023 (arXiv:2210.10760).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from techniques._preference import GroupSampledMethod, check_group, reward_of, values
from techniques.base import Context, register


def group_advantages(rewards: torch.Tensor, k: int, eps: float = 1e-4) -> torch.Tensor:
    """Rewards (G * k,), consecutive groups of k, normalised within each group: (r - mean) / (std + eps)."""
    r = rewards.float().view(-1, k)
    centred = r - r.mean(dim=1, keepdim=True)
    return (centred / (r.std(dim=1, keepdim=True, unbiased=False) + eps)).view(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token estimator of KL(pi || pi_ref) on samples of pi: exp(ref - logp) - (ref - logp) - 1 (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@register
class GRPO(GroupSampledMethod):
    name = "grpo"
    summary = "group-relative policy optimisation: k on-policy samples per prompt, KL to the start (proxy or gold)"
    own_flops = False  # it owns the step: flops_per_step counts a supervised step of its batch's shape, its own
    # estimate is in its results (techniques/_preference.py)
    hides_tensors = False
    tune_options = ("",)

    @dataclass(frozen=True)
    class Options:
        k: int = 4  # completions per prompt (the group)
        beta: float = 0.04  # KL coefficient
        reward: Literal["proxy", "gold", "zero"] = "proxy"  # the reward model, the oracle gold, or none (control)

        def __post_init__(self) -> None:
            check_group(self.k, self.beta)

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Any,
                         ctx: Context) -> torch.Tensor:
        task = self.task(ctx)
        seqs = task.sample(model, x[:, : task.prompt_len], self.generator)
        rewards = reward_of(task, seqs, self.options.reward)
        adv = group_advantages(rewards, self.options.k)
        logp = task.logprobs(model, seqs)
        with torch.no_grad():
            ref = task.logprobs(task.start, seqs)
        kl = k3_kl(logp, ref)
        loss = -(adv[:, None] * logp - self.options.beta * kl).mean()
        loss.backward()
        self.last = {"reward_last": round(float(rewards.mean()), 4), "kl_last": round(float(kl.detach().sum(1).mean()), 4)}
        self.count(task, generated=seqs.shape[0], trained=seqs.shape[0])
        return loss.detach()

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The reward (proxy, gold oracle or zero), k and beta: the last batch's reward and its KL to the start, per seed."""
        first = found[0]
        return (f"{first.get('reward')} reward, k {first.get('k')}, beta {first.get('beta')}: last batch's reward "
                f"{values([f.get('reward_last') for f in found])}, its KL "
                f"{values([f.get('kl_last') for f in found])} nats; "
                f"{values([f.get('sequences_generated') for f in found])} completions sampled, "
                f"~{_flops(first.get('flops_per_step_est'))} per step")


def _flops(f: Any) -> str:
    if not f:
        return "-"
    return f"{f / 1e9:.3g} GFLOP"
