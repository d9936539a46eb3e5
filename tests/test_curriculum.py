"""Curriculum: the order on items of known difficulty, sequence-length pacing, and tokens/FLOPs of short steps."""

import collections

import pytest
import torch

from bench.loop import plain_loop
from bench.plan.config import Budget
from bench.trial import TrialSpec, run
from techniques.base import Context, Probe
from techniques.curriculum import Curriculum, difficulty_scores, length_schedule, paced_fraction, pool_order
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("curriculum", "gpt")


def test_length_schedule_grows_linearly_in_multiples_of_step_len():
    easy = length_schedule(64, 8, 0.125, 8, "easy_first", seed=0)
    assert easy == [8, 8, 16, 24, 32, 40, 48, 56]  # 8 + 7 s, rounded down to a multiple of 8
    assert easy == sorted(easy) and all(n % 8 == 0 for n in easy)
    assert length_schedule(64, 8, 0.125, 8, "hard_first", seed=0) == easy[::-1]
    shuffled = length_schedule(64, 8, 0.125, 8, "random", seed=0)
    assert sorted(shuffled) == easy and shuffled != easy  # the same lengths, another order


def test_pool_order_on_items_of_known_difficulty():
    difficulty = torch.tensor([0.5, 0.1, 0.9, 0.3])
    assert pool_order(difficulty, "easy_first", 0).tolist() == [1, 3, 0, 2]
    assert pool_order(difficulty, "hard_first", 0).tolist() == [2, 0, 3, 1]
    assert sorted(pool_order(difficulty, "random", 0).tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("order", ["easy_first", "hard_first"])
def test_paced_batches_come_from_the_easiest_or_hardest_items_first(order):
    """1000 items whose difficulty is their index: at step 0 the pool is the 10% easiest (or hardest), at the end
    of the warm-up it is everything."""
    n, batch = 1000, 50
    tech = Curriculum(Curriculum.parse_options({"order": order, "start": "0.1", "warmup": "0.5"}))
    x = torch.arange(n).float()[:, None]
    tech._difficulty, tech._train_data = torch.arange(n).float(), (x, torch.zeros(n, dtype=torch.long))
    ctx = Context(device=torch.device("cpu"), total_steps=100)
    upstream = iter([(torch.zeros(batch, 1), torch.zeros(batch, dtype=torch.long))])
    batches = tech.wrap_data(upstream, ctx)
    first = next(batches)[0].flatten()
    assert len(first) == batch and len(set(first.tolist())) == batch
    assert (first < 100).all() if order == "easy_first" else (first >= 900).all()
    ctx.step = 25  # half-way through the warm-up: the pool holds 55% of the items
    mid = torch.cat([next(batches)[0].flatten() for _ in range(20)])
    assert ((mid < 550) if order == "easy_first" else (mid >= 450)).all()
    assert paced_fraction(25, 50, 0.1) == pytest.approx(0.55)
    ctx.step = 50
    late = torch.cat([next(batches)[0].flatten() for _ in range(40)])
    assert late.min() < 100 and late.max() >= 900  # all of it


def test_sequence_warmup_trains_short_sequences_and_counts_their_tokens():
    loop, batches, built = build_loop("gpt", "curriculum:start=0.25:warmup=0.5:step_len=8",
                                      budget=Budget(train_steps=20))
    seen = []
    for _ in range(12):
        x, y = next(batches)
        seen.append(x.shape[1])
        assert y.shape == x.shape
        loop.step((x, y))
    expected = length_schedule(64, 10, 0.25, 8, "easy_first", 0) + [64, 64]
    assert seen == expected and seen[0] == 16
    assert loop.tokens == 16 * sum(expected)  # batch 16: the real tokens, not 12 x 16 x 64
    assert loop.shapes == collections.Counter((16, n) for n in expected)


def test_the_scorer_is_trained_once_and_cached(tmp_path):
    from bench import workloads

    wl = workloads.get("mlp")
    probe = Probe(lambda seed=None: wl.build("tiny", 0 if seed is None else seed, torch.device("cpu")),
                  torch.device("cpu"), 0, make_loop=plain_loop)
    scores, meta, (x, _) = difficulty_scores(probe, tmp_path)
    shared = probe.shared_s
    again, meta2, _ = difficulty_scores(probe, tmp_path)
    assert shared == pytest.approx(meta["scorer_train_s"], abs=1e-3) and shared > 0  # kept out of probe_s
    assert probe.shared_s == shared  # a cached scorer costs nothing
    assert len(scores) == len(x) and torch.equal(scores, again)
    assert meta["cached"] is False and meta2["cached"] is True and meta2["scorer_train_s"] == meta["scorer_train_s"]
    assert scores.min() >= 0 and scores.std() > 0


def test_speed_is_timed_past_the_warm_up_in_every_mode():
    """mode=speed times the same steady-state step as mode=both (past the planned run): full-length sequences."""
    spec = TrialSpec(sweep_id="t", trial_id="t", workload="gpt", size="tiny", techniques=["curriculum"], seed=0,
                     repeat=0, device="cpu", mode="speed",
                     budget={"min_steps": 5, "min_seconds": 0.0, "warmup_steps": 1, "memory": False,
                             "parity_steps": 0})
    rec = run(spec)
    assert rec.status == "ok", rec.reason
    assert rec.speed.shapes is None and rec.speed.tokens_per_s == pytest.approx(rec.speed.samples_per_s * 64)


def test_flops_follow_the_shapes_trained_each_counted_once():
    from bench import workloads
    from bench.loop import plain_loop
    from bench.measure.flops import count_flops
    from bench.plan.config import Budget as TrialBudget
    from bench.trial import build, window_flops

    spec = TrialSpec(sweep_id="t", trial_id="t", workload="gpt", size="tiny", techniques=["curriculum"], seed=0,
                     repeat=0, device="cpu", budget={})
    session = build(spec, TrialBudget(), torch.device("cpu"))
    session.loop.step(next(session.batches))  # notes the workload's full batch (16 x 64)
    fresh = workloads.get("gpt").build("tiny", 0, torch.device("cpu"))  # the reference's count: an eager step
    loop = plain_loop(fresh, fresh.lr, torch.device("cpu"))
    full_flops = count_flops(lambda: loop.step(next(fresh.batches(16, 0))))
    mean, shapes = window_flops(session, full_flops, collections.Counter({(16, 64): 2, (16, 8): 2}))
    assert shapes == {"16x64": 2, "16x8": 2}
    short = 2 * mean - full_flops  # the mean of two full steps (the reference's count) and two short ones
    assert 0 < short < full_flops / 4  # 8 of 64 positions: about an eighth of the matmul FLOPs
    assert window_flops(session, full_flops, collections.Counter({(16, 64): 5})) == (full_flops, None)
