"""RLOO: leave-one-out advantages, zero reward moves the policy only by the KL term, reproducibility."""

import pytest
import torch

from bench.plan.config import Budget
from techniques.base import Context, OptionError
from techniques.rloo import RLOO, rloo_advantages
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("rloo", "pref")

CPU = torch.device("cpu")


def test_leave_one_out_advantages():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0])
    adv = rloo_advantages(r, 3)
    # each less the mean of the other two of its group
    torch.testing.assert_close(adv, torch.tensor([1 - 2.5, 2 - 2.0, 3 - 1.5, 6 - 0.0, 0 - 3.0, 0 - 3.0]))
    torch.testing.assert_close(adv.view(-1, 3).sum(1), torch.zeros(2))  # also zero-sum per group


def params(loop) -> list[torch.Tensor]:
    return [p.detach().clone() for p in loop.model.parameters()]


def test_zero_reward_moves_the_policy_only_by_the_kl_term():
    # from the start the KL penalty is exactly 0 (the policy is the reference): nothing moves
    loop, batches, _ = build_loop("pref", "rloo:reward=zero", budget=Budget(train_steps=3))
    before = params(loop)
    for _ in range(3):
        loop.step(next(batches))
    assert all(torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))

    # away from the start the gradient is the KL penalty's alone: -mean(A_i * grad log pi(y_i)), A = LOO(-beta KL)
    loop, batches, built = build_loop("pref", "rloo:reward=zero:beta=0.5", budget=Budget(train_steps=3))
    task, tech = built.preference, loop.techniques[0]
    with torch.no_grad():
        for p in loop.model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.02)
    x, y = next(batches)
    gen_state = tech.generator.get_state()
    loop.optimizer.zero_grad(set_to_none=True)
    tech.forward_backward(loop.model, x, y, None, loop.ctx)
    got = [p.grad.clone() for p in loop.model.parameters()]
    tech.generator.set_state(gen_state)
    seqs = task.sample(loop.model, x[:, : task.prompt_len], tech.generator)
    logp = task.logprobs(loop.model, seqs).sum(1)
    kl = logp.detach() - task.logprobs(task.start, seqs).sum(1).detach()
    assert float(kl.abs().max()) > 0  # the penalty acts here
    loop.optimizer.zero_grad(set_to_none=True)
    (-(rloo_advantages(-0.5 * kl, 4) * logp).mean()).backward()
    for a, b in zip(got, loop.model.parameters(), strict=True):
        torch.testing.assert_close(a, b.grad, rtol=1e-4, atol=1e-7)
    # with no KL coefficient either, nothing acts: the gradient is exactly zero
    loop, batches, _ = build_loop("pref", "rloo:reward=zero:beta=0", budget=Budget(train_steps=3))
    with torch.no_grad():
        for p in loop.model.parameters():
            p.add_(0.01)
    before = params(loop)
    loop.step(next(batches))
    assert all(torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))


def test_a_step_trains_and_reports():
    loop, batches, built = build_loop("pref", "rloo", budget=Budget(train_steps=2))
    before = params(loop)
    assert torch.isfinite(loop.step(next(batches)))
    assert any(not torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))
    found = loop.techniques[0].results(loop.ctx)
    assert found["sequences_generated"] == built.batch_size and found["flops_per_step_est"] > 0
    assert "KL penalty 0.05 in the reward" in RLOO.summarize([found, found])


def test_a_run_is_reproducible_for_a_seed():
    def run(seed: int) -> list[torch.Tensor]:
        loop, batches, _ = build_loop("pref", "rloo", seed=seed, budget=Budget(train_steps=2))
        for _ in range(2):
            loop.step(next(batches))
        return params(loop)

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_check_and_options():
    assert "no preference structure" in RLOO().check(Context(device=CPU, workload="cnn"))
    with pytest.raises(OptionError, match="k must be"):
        RLOO.parse_options({"k": "1"})
