"""Best-of-n: its KL formula, that it trains nothing, that n=1 is the plain sampler, and reproducibility."""

import math

import pytest
import torch

from bench.plan.config import Budget
from techniques.base import Context, OptionError
from techniques.best_of_n import BestOfNSampling, best_of_n_kl
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("best_of_n", "pref")

CPU = torch.device("cpu")


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_the_kl_formula_is_the_limit_of_the_exact_kl(n):
    """For a base distribution uniform over m outcomes with distinct rewards, best-of-n puts (i/m)^n - ((i-1)/m)^n
    on the i-th ranked one; its KL to the base tends to log n - (n - 1)/n as m grows."""
    assert best_of_n_kl(n) == pytest.approx(math.log(n) - (n - 1) / n)
    m = 20000
    i = torch.arange(1, m + 1, dtype=torch.float64)
    p = (i / m) ** n - ((i - 1) / m) ** n
    exact = float((p * torch.log(p * m)).sum())
    assert exact == pytest.approx(best_of_n_kl(n), abs=2e-3)
    assert exact <= best_of_n_kl(n) + 1e-9  # an upper bound (Beirami et al. 2024)


@pytest.mark.slow  # generates and scores on the preference workload (16 s on 2 cores)
def test_it_trains_nothing_and_evaluates_the_best_of_n():
    loop, batches, built = build_loop("pref", "best_of_n:n=4", budget=Budget(train_steps=3))
    before = [p.detach().clone() for p in loop.model.parameters()]
    for _ in range(3):
        assert float(loop.step(next(batches))) == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, loop.model.parameters(), strict=True))
    tech = loop.techniques[0]
    module = tech.eval_model(loop.model, loop.ctx).eval()
    with torch.no_grad():
        best = built.evaluate(module)
        plain = built.evaluate(loop.model.eval())
    assert best["kl"] == pytest.approx(math.log(4) - 0.75)
    assert best["proxy_reward"] > plain["proxy_reward"]  # the proxy's best of 4 beats one sample, on the proxy
    found = tech.results(loop.ctx)
    assert found["kl_formula"] == pytest.approx(math.log(4) - 0.75, abs=1e-6)
    assert found["sequences_trained"] == 0 and found["steps"] == 3
    assert found["inference_flops_per_prompt"] > 4 * found["plain_sample_flops"]  # n samples and n proxy scores
    held = {id(t) for ts in tech.held_parts(loop.ctx).values() for t in ts}
    assert held >= {id(p) for p in built.preference.reward_model.parameters()}
    assert "n 4: no training" in BestOfNSampling.summarize([found])


def test_n_1_is_the_plain_sampler():
    loop, _, built = build_loop("pref", "best_of_n:n=1", budget=Budget(train_steps=1))
    with torch.no_grad():
        one = built.evaluate(loop.techniques[0].eval_model(loop.model, loop.ctx).eval())
        plain = built.evaluate(loop.model.eval())
    assert one == plain  # the same draws, kept whatever their score; KL 0 both ways


def test_evaluation_is_reproducible():
    loop, _, built = build_loop("pref", "best_of_n", budget=Budget(train_steps=1))
    module = loop.techniques[0].eval_model(loop.model, loop.ctx).eval()
    with torch.no_grad():
        assert built.evaluate(module) == built.evaluate(module)


def test_check_and_options():
    assert "no preference structure" in BestOfNSampling().check(Context(device=CPU, workload="mlp"))
    with pytest.raises(OptionError, match="n must be"):
        BestOfNSampling.parse_options({"n": "0"})
