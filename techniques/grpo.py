"""Group relative policy optimisation: on-policy RL with advantages relative to k samples of the same prompt.

Method card
- What: each step samples ``k`` completions of each of ``batch / k`` prompts, scores them with ``reward`` (the proxy
  reward model; ``gold``, the oracle; ``zero``, a control), normalises the rewards within each prompt's group, and
  minimises ``-(A log pi - beta KL)`` per character, with the k3 estimator of the KL to the frozen start
  (DeepSeekMath, eq. 3). One gradient step per batch of samples, so the paper's clipped ratio is 1.
- ``beta`` (0.04, DeepSeekMath's). ``reward=gold`` is the ceiling: a reward that cannot be gamed.
- When it should pay: no value network (the group is the baseline), so less memory than PPO; on-policy, so it can
  reach optima the start puts little mass on. Each step pays generation. Not run on a GPU.
- Sources: Shao et al., "DeepSeekMath", 2024 (arXiv:2402.03300); Schulman, "Approximating KL Divergence", 2020; Gao
  et al., "Scaling Laws for Reward Model Overoptimization", ICML 2023 (arXiv:2210.10760).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-grpo (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-preference`: pref:tiny 0.21x [0.20, 0.22] slower, memory 0.80x less; pref:tiny grpo:reward=gold 0.22x [0.21, 0.22] slower, memory 0.76x less.
<!-- end generated -->
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
