"""What the preference methods (dpo, grpo, rloo, best_of_n) share: the refusal on a workload without the preference
structure, the batches they draw from it, the compute they count, and the reference models they hold.

A preference method finds everything it trains on through the workload's ``preference`` attribute, the
``Preference`` interface of ``bench.workloads.base`` (prompts, pairs, the frozen starting policy and reward model, the
gold reward, samplers and what sampling costs), never by the workload's name nor from a workload's module. It owns
the step (``forward_backward``): its loss is not the workload's. Its batches replace the workload's (``wrap_data``)
and are ``(x, y)`` with ``x`` of shape (batch, prompt + completion): the pairs' sequences (DPO) or the prompts to
complete, zero-padded (RL), so the loop's token count is the tokens of the sequences trained. ``y`` holds the indices
drawn.

Compute is counted as well as timed: sequences and characters generated, sequences trained, and an estimate of the
FLOPs per step (2 x params per token of a forward, 6 x for forward and backward, Kaplan et al. 2020; generation
recomputes the whole prefix per character, no KV cache), since the harness's ``flops_per_step`` counts a supervised
step of the batch's shape, not the sampling or the reference and reward models' forwards.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from typing import Any

import torch

from techniques._model import module_tensors, n_params
from techniques.base import Context, Kind, Phase, Technique

if typing.TYPE_CHECKING:
    from bench.workloads.base import Preference

PREFERENCE_MISSING = ("has no preference structure (prompts, preference pairs, a gold reward and a reward model, "
                      "BuiltWorkload.preference)")


def preference_problem(ctx: Context) -> str | None:
    """Why a preference method cannot run in ``ctx``, or None."""
    if ctx.workload and not ctx.has_preferences:  # no workload: a device-level listing, no refusal
        return f"workload '{ctx.workload}' {PREFERENCE_MISSING}"
    if ctx.world_size > 1:
        return "runs on one process"
    return None


class PreferenceMethod(Technique):
    """Base of the preference methods: one per set (slot ``preference``), algorithmic, owner of the step."""

    kind = Kind.ALGORITHMIC
    phase = Phase.SURGERY
    slot = "preference"
    uses_proxy = True  # holds the reward model (for held_parts)
    uses_reference = True  # holds the starting policy as its reference (for held_parts)

    def check(self, ctx: Context) -> str | None:
        return preference_problem(ctx)

    def task(self, ctx: Context) -> Preference:
        if ctx.preference is None:
            raise ValueError(preference_problem(ctx) or f"workload {PREFERENCE_MISSING}")
        return ctx.preference

    def wrap_data(self, batches: Iterator[Any], ctx: Context) -> Iterator[Any]:
        task = self.task(ctx)
        # One of the workload's own batches is drawn, so the trial notes it as the full batch (the shape that FLOPs
        # per step of other shapes are cut from); the method's batches replace the rest.
        next(batches, None)
        self.counts = {"steps": 0, "sequences_generated": 0, "chars_generated": 0, "sequences_trained": 0}
        self.generator = torch.Generator().manual_seed(10_000 + ctx.seed)  # the method's samples
        self.n_policy = n_params(task.start)
        self.n_rm = n_params(task.reward_model)
        return self.draw(task, int(ctx.state.get("local_batch_size") or 16), ctx.seed)

    def draw(self, task: Preference, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless batches of ``batch_size`` sequences; the RL methods' default: ``batch_size / group`` training
        prompts per batch (an epoch's permutation at a time, from ``seed``), each repeated ``group`` times."""
        group = self.group_size()
        per = batch_size // group
        n = len(task.train_prompts)
        order = torch.Generator().manual_seed(seed)
        while True:
            perm = torch.randperm(n, generator=order)
            for i in range(0, n - per + 1, per):
                idx = perm[i : i + per].repeat_interleave(group)
                x = torch.zeros(len(idx), task.seq_len, dtype=torch.long)
                x[:, : task.prompt_len] = task.train_prompts[idx].cpu()
                yield x, idx

    def group_size(self) -> int:
        return 1

    def configure(self, cfg: Any) -> Any:
        group = self.group_size()
        if cfg.batch_size % group:
            raise ValueError(f"{self.name}: the batch of {cfg.batch_size} sequences does not split into groups of "
                             f"{group} completions per prompt")
        return cfg

    def held_parts(self, ctx: Context) -> dict[str, list[torch.Tensor]]:
        """The frozen starting policy (the reference of the KL term) and the proxy reward model, each by name; no
        method here has a value head (rloo's docstring says why)."""
        task = ctx.preference
        if task is None:
            return {}
        return {**({"reference policy": module_tensors(task.start)} if self.uses_reference else {}),
                **({"reward model": module_tensors(task.reward_model)} if self.uses_proxy else {})}

    # ---- counting ----------------------------------------------------------------------------------------------

    def count(self, task: Preference, generated: int = 0, trained: int = 0) -> None:
        c = self.counts
        c["steps"] += 1
        c["sequences_generated"] += generated
        c["chars_generated"] += generated * task.completion_len
        c["sequences_trained"] += trained

    def step_flops(self, task: Preference, batch: int) -> int:
        """Estimated FLOPs of one step of ``batch`` sequences (see the module docstring)."""
        return 0

    def found(self, ctx: Context) -> dict[str, Any]:
        """The counts and compute every preference method reports, and the workload's one-off artefacts."""
        task = ctx.preference
        out: dict[str, Any] = dict(getattr(self, "counts", {}))
        if task is not None:
            batch = int(ctx.state.get("local_batch_size") or 0)
            out["flops_per_step_est"] = self.step_flops(task, batch)
            out["policy_params"] = n_params(task.start)
            out["reward_model_params"] = n_params(task.reward_model) if self.uses_proxy else 0
            out["rm_heldout_accuracy"] = task.meta.get("rm_heldout_accuracy")
        return out


class GroupSampledMethod(PreferenceMethod):
    """Base of the on-policy methods (grpo, rloo): ``k`` completions of each prompt sampled from the current policy,
    scored by the ``reward`` option (proxy, gold or zero), one gradient step per batch of samples. The subclass owns
    the loss (``forward_backward``) and its ``Options`` (``k``, ``beta``, ``reward``, checked by ``check_group``)."""

    @property
    def uses_proxy(self) -> bool:  # type: ignore[override]
        return self.options.reward == "proxy"

    def group_size(self) -> int:
        return self.options.k

    def step_flops(self, task: Preference, batch: int) -> int:
        """Sampling the batch, the policy's forward and backward (3 forwards), the reference's and the reward
        model's forwards."""
        n = getattr(self, "n_policy", 0)
        rm = getattr(self, "n_rm", 0) if self.uses_proxy else 0
        return gen_flops(task, n, batch) + 4 * fwd_flops(task, n, batch) + fwd_flops(task, rm, batch)

    def results(self, ctx: Context) -> dict[str, Any] | None:
        o = self.options
        return {"k": o.k, "beta": o.beta, "reward": o.reward, **self.found(ctx), **getattr(self, "last", {})}


def check_group(k: Any, beta: float) -> None:
    """The group methods' option checks: ``k`` completions per prompt (an integer >= 2), ``beta`` >= 0."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ValueError(f"k must be an integer >= 2 (completions per prompt), got {k!r}")
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")


def reward_of(task: Preference, seqs: torch.Tensor, reward: str) -> torch.Tensor:
    """The ``reward`` option's score of whole sequences: the proxy reward model, the gold reward, or zeros."""
    if reward == "proxy":
        return task.proxy(seqs)
    if reward == "gold":
        return task.gold(seqs)
    return torch.zeros(seqs.shape[0], device=seqs.device)


def gen_flops(task: Preference, n_params_: int, sequences: int) -> int:
    """Forward FLOPs of sampling ``sequences`` completions, as the workload samples them."""
    return sequences * task.generation_flops(n_params_)


def fwd_flops(task: Preference, n_params_: int, sequences: int) -> int:
    """Forward FLOPs of scoring ``sequences`` whole sequences."""
    return 2 * n_params_ * sequences * task.seq_len


def values(xs: list[Any]) -> str:
    """Seeds' values side by side, 3 significant digits."""
    got = [x for x in xs if x is not None]
    if not got:
        return "-"
    return ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in got)
