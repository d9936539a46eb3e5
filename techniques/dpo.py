"""Direct preference optimisation: the policy trained offline on the workload's preference pairs, no reward model.

Method card
- What: for a pair (prompt x, preferred y_w, dispreferred y_l) and the frozen starting policy pi_ref, with
  ``h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]`` (sequence log-probabilities,
  summed over the completion's characters), the loss of every step is the mean over its pairs of

      sigmoid (DPO, Rafailov et al. 2023, eq. 7):  -log sigmoid(beta * h)
      ipo     (IPO, Azar et al. 2023, eq. 17):     (h - 1 / (2 * beta))^2

  computed in float32 (``dpo_loss``, usable without the harness). A batch of B sequences is B/2 pairs (both sides
  are trained sequences), drawn without replacement from the workload's training pairs, a permutation per epoch from
  the trial's seed. The pairs are fixed (sampled once from the starting policy): DPO is offline and never samples.
- Options: ``beta`` (0.1, the paper's default): the strength of the implicit KL regularisation (the optimum of
  the KL-regularised objective it solves is pi_ref * exp(r / beta)); large beta keeps the policy near the start.
  ``loss`` = sigmoid | ipo: IPO's squared loss has a finite optimum (h = 1 / (2 beta)) where DPO's logistic loss
  keeps pushing h up on pairs it already orders, which is how DPO over-fits deterministic preferences (Azar et al.).
- What is measured: the workload's gold reward, proxy reward and KL(policy || start) at every evaluation (the
  frontier); in ``technique_results`` the implicit-reward accuracy and margin of the last batch (the fraction of its
  pairs with h > 0, the mean beta * h), the pairs trained and epochs, and an estimate of the FLOPs per step (policy
  forward and backward of the 2 x B/2 sequences, the reference's forward of them).
- When it helps: when pairs exist and sampling is expensive (no generation in the loop: the cheapest step of the
  methods here). Its limit is the data: it learns only where the starting policy's samples put the pairs, so an
  optimum far from them is reached more slowly than by an on-policy method (Tajwar et al. 2024); Xu et al. 2024
  find a tuned PPO ahead of DPO on harder tasks.
- Memory: the starting policy (the reference) is held beside the model (``held_parts``); no reward model.
- Cross-check: with TRL installed (``pip install trl``), the loss on fixed log-probabilities equals
  ``trl.DPOTrainer``'s (tests/test_dpo.py); without it that test skips with the reason.
- Sources: Rafailov, Sharma, Mitchell, Ermon, Manning, Finn, "Direct Preference Optimization: Your Language Model
  is Secretly a Reward Model", NeurIPS 2023 (arXiv:2305.18290); Azar et al., "A General Theoretical Paradigm to
  Understand Learning from Human Preferences", AISTATS 2024 (arXiv:2310.12036); Tajwar et al., "Preference
  Fine-Tuning of LLMs Should Leverage Suboptimal, On-Policy Data", ICML 2024 (arXiv:2404.14367); Xu et al., "Is DPO
  Superior to PPO for LLM Alignment?", ICML 2024 (arXiv:2404.10719).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from techniques._preference import PreferenceMethod, fwd_flops, values
from techniques.base import Context, register


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, loss: str = "sigmoid") -> torch.Tensor:
    """Mean DPO (``sigmoid``) or IPO (``ipo``) loss of pairs from their sequence log-probabilities (each (N,))."""
    h = (policy_chosen.float() - ref_chosen.float()) - (policy_rejected.float() - ref_rejected.float())
    if loss == "sigmoid":
        return -F.logsigmoid(beta * h).mean()
    if loss == "ipo":
        return ((h - 1.0 / (2.0 * beta)) ** 2).mean()
    raise ValueError(f"unknown DPO loss {loss!r} (valid: sigmoid, ipo)")


@register
class DPO(PreferenceMethod):
    name = "dpo"
    summary = "direct preference optimisation on the workload's fixed pairs (offline; beta; or IPO's loss)"
    own_flops = False  # it owns the step: flops_per_step counts a supervised step of its batch's shape, its own
    # estimate is in its results (techniques/_preference.py)
    hides_tensors = False
    tune_options = ("",)
    uses_proxy = False

    @dataclass(frozen=True)
    class Options:
        beta: float = 0.1  # strength of the implicit KL regularisation to the starting policy
        loss: Literal["sigmoid", "ipo"] = "sigmoid"  # DPO's logistic loss or IPO's squared loss

        def __post_init__(self) -> None:
            if not (math.isfinite(self.beta) and self.beta > 0):
                raise ValueError(f"beta must be a finite number > 0, got {self.beta}")

    def group_size(self) -> int:
        return 2  # a batch of B sequences is B/2 pairs

    def draw(self, task: Any, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        per = batch_size // 2
        n = len(task.chosen)
        order = torch.Generator().manual_seed(seed)
        self.epochs = 0
        while True:
            perm = torch.randperm(n, generator=order)
            self.epochs += 1
            for i in range(0, n - per + 1, per):
                idx = perm[i : i + per]
                yield torch.cat([task.chosen[idx], task.rejected[idx]]).cpu(), idx

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Any,
                         ctx: Context) -> torch.Tensor:
        task = self.task(ctx)
        n = x.shape[0] // 2
        logp = task.logprobs(model, x).sum(dim=1)
        with torch.no_grad():
            ref = task.logprobs(task.start, x).sum(dim=1)
        loss = dpo_loss(logp[:n], logp[n:], ref[:n], ref[n:], self.options.beta, self.options.loss)
        loss.backward()
        with torch.no_grad():
            h = (logp[:n] - ref[:n]) - (logp[n:] - ref[n:])
            self.last = {"implicit_accuracy": round(float((h > 0).float().mean()), 4),
                         "implicit_margin": round(float(self.options.beta * h.mean()), 4)}
        self.count(task, trained=x.shape[0])
        return loss.detach()

    def step_flops(self, task: Any, batch: int) -> int:
        n = getattr(self, "n_policy", 0)
        return 3 * fwd_flops(task, n, batch) + fwd_flops(task, n, batch)  # policy fwd+bwd, reference fwd

    def results(self, ctx: Context) -> dict[str, Any] | None:
        out = {"beta": self.options.beta, "loss": self.options.loss, **self.found(ctx),
               **getattr(self, "last", {})}
        if ctx.preference is not None:
            out["train_pairs"] = len(ctx.preference.chosen)
            out["epochs_started"] = getattr(self, "epochs", 0)
        return out

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The loss (sigmoid DPO or IPO) and beta: the implicit-reward accuracy and margin on the last batch, per seed."""
        first = found[0]
        return (f"{first.get('loss')} loss, beta {first.get('beta')}: implicit-reward accuracy on the last batch "
                f"{values([f.get('implicit_accuracy') for f in found])}, margin "
                f"{values([f.get('implicit_margin') for f in found])}; {first.get('train_pairs')} fixed pairs, "
                f"{values([f.get('epochs_started') for f in found])} epoch(s) started; no sampling")
