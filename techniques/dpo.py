"""Direct preference optimisation: the policy trained offline on the workload's preference pairs, no reward model.

Method card
- What: for a pair (prompt, preferred, dispreferred) and the frozen starting policy, ``h`` is the preferred minus the
  dispreferred completion's log-ratio against the start; the loss is ``-log sigmoid(beta h)`` (DPO) or
  ``(h - 1/(2 beta))^2`` (``loss=ipo``). A batch of B sequences is B/2 fixed pairs: DPO never samples.
- ``beta`` (0.1) weighs the implicit KL regularisation. IPO's loss has a finite optimum where DPO's keeps pushing
  pairs it already orders: how DPO over-fits deterministic preferences (Azar et al.).
- When it should pay: pairs exist and sampling is expensive: the cheapest step of the preference methods, on any
  device. It learns only where the pairs are, so an optimum far from the start is reached slower than on-policy.
- The record keeps the implicit-reward accuracy and estimated FLOPs per step. With TRL installed, a test checks the
  loss against ``trl.DPOTrainer``'s.
- Sources: Rafailov et al., NeurIPS 2023 (arXiv:2305.18290); Azar et al., AISTATS 2024 (arXiv:2310.12036); Tajwar et
  al., ICML 2024 (arXiv:2404.14367); Xu et al., ICML 2024 (arXiv:2404.10719).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-dpo (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-preference`: pref:tiny dpo:loss=ipo 1.06x [1.04, 1.09] inconclusive (the whole interval above 1, not clear of the threshold), memory 0.76x less; pref:tiny 1.05x [1.03, 1.07] inconclusive (the whole interval above 1, not clear of the threshold), memory 0.76x less.
<!-- end generated -->
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
