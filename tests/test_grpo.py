"""GRPO: group-relative advantages, the KL estimator, the step it trains (proxy, gold and zero rewards),
reproducibility for a seed, and the refusal elsewhere."""

import pytest
import torch

from bench.plan.config import Budget
from techniques.base import Context, OptionError
from techniques.grpo import GRPO, group_advantages, k3_kl
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("grpo", "pref")

CPU = torch.device("cpu")


def test_advantages_sum_to_zero_per_group_and_are_normalised():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen) * 5
    for k in (2, 4, 6):
        adv = group_advantages(rewards, k).view(-1, k)
        torch.testing.assert_close(adv.sum(dim=1), torch.zeros(24 // k), atol=1e-5, rtol=0)
        r = rewards.view(-1, k)
        expected = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True, unbiased=False) + 1e-4)
        torch.testing.assert_close(adv, expected)
    assert torch.equal(group_advantages(torch.full((8,), 3.0), 4), torch.zeros(8))  # a tied group teaches nothing
    # invariant to a shift and (up to eps) a scale of the rewards: only the order within the group matters
    torch.testing.assert_close(group_advantages(rewards * 10 + 7, 4), group_advantages(rewards, 4), atol=1e-3, rtol=0)


def test_the_kl_estimator_is_non_negative_zero_at_the_reference_and_unbiased():
    logp = torch.log(torch.tensor([0.1, 0.5, 0.9]))
    assert torch.equal(k3_kl(logp, logp), torch.zeros(3))
    assert (k3_kl(logp, logp.flip(0)) >= 0).all()
    # unbiased: over samples of p, the mean of exp(q/p) - log(q/p) - 1 is KL(p || q), here for two categoricals
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.4, 0.4, 0.2])
    exact = float((p * (p / q).log()).sum())
    estimate = float((p * k3_kl(p.log(), q.log())).sum())  # the expectation taken exactly over p's outcomes
    assert estimate == pytest.approx(exact, rel=1e-6)


def params(loop) -> list[torch.Tensor]:
    return [p.detach().clone() for p in loop.model.parameters()]


def test_a_step_samples_groups_and_trains():
    loop, batches, built = build_loop("pref", "grpo:k=4", budget=Budget(train_steps=4))
    x, y = next(batches)
    task = built.preference
    assert x.shape == (built.batch_size, task.seq_len)
    assert torch.equal(y.view(-1, 4), y.view(-1, 4)[:, :1].expand(-1, 4))  # k copies of each prompt
    assert torch.equal(x[:, : task.prompt_len], task.train_prompts[y])
    before = params(loop)
    assert torch.isfinite(loop.step((x, y)))
    assert any(not torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))
    tech = loop.techniques[0]
    found = tech.results(loop.ctx)
    assert found["sequences_generated"] == found["sequences_trained"] == built.batch_size
    assert found["chars_generated"] == built.batch_size * task.completion_len
    held = {id(t) for ts in tech.held_parts(loop.ctx).values() for t in ts}
    assert held >= {id(p) for p in task.start.parameters()} | {id(p) for p in task.reward_model.parameters()}
    assert set(tech.held_parts(loop.ctx)) == {"reference policy", "reward model"}
    assert "proxy reward, k 4" in GRPO.summarize([found])
    gold = build_loop("pref", "grpo:reward=gold", budget=Budget(train_steps=4))[0].techniques[0]
    assert not {id(t) for ts in gold.held_parts(loop.ctx).values() for t in ts} & {id(p) for p in task.reward_model.parameters()}


def test_with_zero_reward_the_policy_stays_at_the_start():
    """The advantages are 0 and the KL term's gradient is 0 where the policy equals the reference: no update."""
    loop, batches, _ = build_loop("pref", "grpo:reward=zero", budget=Budget(train_steps=3))
    before = params(loop)
    for _ in range(3):
        loop.step(next(batches))
    assert all(torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))


def test_a_run_is_reproducible_for_a_seed():
    def run(seed: int) -> list[torch.Tensor]:
        loop, batches, _ = build_loop("pref", "grpo", seed=seed, budget=Budget(train_steps=2))
        for _ in range(2):
            loop.step(next(batches))
        return params(loop)

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_check_and_options():
    reason = GRPO().check(Context(device=CPU, workload="gpt"))
    assert reason is not None and "no preference structure" in reason
    assert GRPO().check(Context(device=CPU, workload="pref", has_preferences=True)) is None
    for raw, match in (({"k": "1"}, "k must be"), ({"beta": "-1"}, "beta must be"), ({"reward": "x"}, "proxy, gold")):
        with pytest.raises(OptionError, match=match):
            GRPO.parse_options(raw)
    with pytest.raises(ValueError, match="groups of 3"):
        GRPO(GRPO.Options(k=3)).configure(type("C", (), {"batch_size": 16})())
