"""The preference workload: its gold reward, the Bradley-Terry labels, the cached starting policy and reward model,
evaluation, the refusal of preference methods elsewhere, and (slow) a sweep of the methods end to end."""

import math
import random

import pytest
import torch

from bench import workloads
from bench.workloads import pref
from bench.workloads.pref import VOWEL_TARGET, bt_labels, gold_parts, gold_reward_text

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def built():
    return workloads.get("pref").build("tiny", 0, CPU)


def encode(texts: list[str], vocab: list[str]) -> torch.Tensor:
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([[index[c] for c in t] for t in texts])


def test_the_gold_reward_is_its_formula_and_the_vectorised_form_agrees(built):
    vocab = built.preference.vocab
    mask = built.preference.vowel_mask
    rng = random.Random(0)
    letters = [c for c in vocab if c.isprintable()]
    texts = ["".join(rng.choice(letters) for _ in range(24)) for _ in range(50)]
    texts += ["a" * 24, "aeiou" * 4 + "aeio", "The value of x is an int", "ab" * 12]
    gold, frac, variety = gold_parts(encode(texts, vocab), mask, len(vocab))
    for t, g, f, v in zip(texts, gold.tolist(), frac.tolist(), variety.tolist(), strict=True):
        assert g == pytest.approx(gold_reward_text(t), abs=1e-6)
        vowels = sum(c in "aeiouAEIOU" for c in t)
        assert f == pytest.approx(vowels / 24)
        assert v == pytest.approx(len({t[i : i + 2] for i in range(23)}) / 23)
    # degenerate strings do not maximise it: all vowels overshoot (closeness 0); a short cycle repeats its bigrams
    assert gold_reward_text("a" * 24) == 0.0
    assert gold_reward_text("aeiou" * 4 + "aeio") == 0.0  # f = 1
    assert gold_reward_text("ab" * 12) == pytest.approx((1 - abs(0.5 - VOWEL_TARGET) / VOWEL_TARGET) * 2 / 23)
    assert gold_reward_text("bade" * 6) < 0.2 < gold_reward_text("The value of x is an int")
    assert gold_reward_text("The value of x is an int") == gold_reward_text("The value of x is an int")


def test_bradley_terry_labels_are_deterministic_for_a_seed_and_follow_the_scale():
    gen = torch.Generator().manual_seed(5)
    a, b = torch.rand(4000, generator=gen), torch.rand(4000, generator=gen)
    first = bt_labels(a, b, 0.05, torch.Generator().manual_seed(1))
    assert torch.equal(first, bt_labels(a, b, 0.05, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, bt_labels(a, b, 0.05, torch.Generator().manual_seed(2)))
    agree = lambda s: float((bt_labels(a, b, s, torch.Generator().manual_seed(1)) == (a > b)).float().mean())  # noqa: E731
    assert agree(1e-4) > 0.99 and 0.45 < agree(100.0) < 0.55 and agree(1e-4) > agree(0.05) > agree(0.5)
    # the draw's probability is sigmoid((a - b) / scale): its mean over pairs, within the binomial noise
    p = torch.sigmoid((a - b) / 0.1)
    drawn = bt_labels(a, b, 0.1, torch.Generator().manual_seed(3)).float()
    assert abs(float(drawn.mean() - p.mean())) < 4 * math.sqrt(0.25 / len(a))


def test_the_start_is_the_supervised_policy_and_the_pairs_come_from_it(built):
    task = built.preference
    meta = task.meta
    assert meta["sft_steps"] == built.params["sft_steps"] and meta["sft_train_s"] > 0 and meta["sft_val_loss"] < 3.0
    start = task.start.state_dict()
    assert all(torch.equal(v, start[k]) for k, v in built.model.state_dict().items())  # every set starts there
    assert not task.start.training and not any(p.requires_grad for p in task.start.parameters())
    assert not set(task.start.parameters()) & set(built.model.parameters())
    n_train = built.params["n_pairs"] - built.params["heldout_pairs"]
    assert task.chosen.shape == task.rejected.shape == (n_train, task.seq_len)
    assert task.heldout_chosen.shape == (built.params["heldout_pairs"], task.seq_len)
    # every pair's two sequences share their prompt, a training prompt, and differ in the completion
    P = task.prompt_len
    assert torch.equal(task.chosen[:, :P], task.rejected[:, :P])
    assert torch.equal(task.chosen[:, :P], task.train_prompts[torch.arange(n_train) % len(task.train_prompts)])
    assert 0.6 < meta["label_agreement"] < 1.0  # the documented label noise: neither none nor all
    assert built.dataset["preference"]["rm_heldout_accuracy"] == meta["rm_heldout_accuracy"]
    # the evaluation prompts come from the other half of the held-out text (a few all-blank prefixes may coincide)
    train = {tuple(r) for r in task.train_prompts.tolist()}
    assert len(train & {tuple(r) for r in task.eval_prompts.tolist()}) < len(task.eval_prompts) // 4


def test_the_reward_model_beats_chance_on_held_out_pairs(built):
    meta = built.preference.meta
    n = built.params["heldout_pairs"]
    # chance is 0.5 with a binomial sd of sqrt(0.25 / n) (0.044 at 128 pairs): 0.6 is more than 2 sd above it
    assert meta["rm_heldout_accuracy"] > 0.6, meta
    assert meta["rm_heldout_accuracy"] <= meta["rm_train_accuracy"] + 4 * math.sqrt(0.25 / n)
    assert meta["gold_heldout_accuracy"] >= 0.6  # the labels' own agreement with the gold order: the ceiling


def test_evaluation_is_deterministic_and_the_start_has_no_kl(built):
    with torch.no_grad():
        first = built.evaluate(built.model.eval())
        again = built.evaluate(built.model)
    assert first == again
    assert first["kl"] == 0.0  # the policy is the start: the same log-probabilities, exactly
    assert 0 < first["gold_reward"] < built.target  # the start scores poorly: there is something to learn
    assert set(first) == {"gold_reward", "proxy_reward", "kl", "vowel_frac", "variety"}
    assert first["vowel_frac"] < VOWEL_TARGET
    assert built.metric == "gold_reward" and built.higher_is_better and built.margin == pref.GOLD_MARGIN
    assert built.curve_metrics == ("proxy_reward", "kl")


def test_the_artefacts_are_cached_in_the_sweeps_directory(built, tmp_path, monkeypatch):
    monkeypatch.setattr(pref, "_MEMO", dict(pref._MEMO))
    workloads.use_artefact_dir(tmp_path)
    try:
        workloads.get("pref").build("tiny", 1, CPU)  # from this process's memory: written to the cache too
        files = list(tmp_path.glob("pref-*.pt"))
        assert [f.name for f in files] == [f"pref-{built.preference.meta['key']}.pt"]
        pref._MEMO.clear()
        loaded = workloads.get("pref").build("tiny", 2, CPU).preference  # from the file, nothing trained
    finally:
        workloads.use_artefact_dir(None)
    assert loaded.meta["cached"] is True and loaded.meta["sft_train_s"] == built.preference.meta["sft_train_s"]
    assert torch.equal(loaded.chosen, built.preference.chosen)
    a, b = loaded.reward_model.state_dict(), built.preference.reward_model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_preference_methods_refuse_workloads_without_the_structure():
    from bench.plan.config import TechniqueSet, WorkloadSpec
    from bench.plan.planner import incompatibility

    for name in ("dpo", "grpo", "rloo", "best_of_n"):
        reason = incompatibility(TechniqueSet.parse(name), WorkloadSpec.parse("gpt:tiny"), CPU, 1)
        assert reason is not None and "no preference structure" in reason and "\n" not in reason, reason
        assert reason.startswith(f"{name}: workload 'gpt'")
        assert incompatibility(TechniqueSet.parse(name), WorkloadSpec.parse("pref:tiny"), CPU, 1) is None
    reason = incompatibility(TechniqueSet.parse("dpo+grpo"), WorkloadSpec.parse("pref:tiny"), CPU, 1)
    assert reason is not None and "preference" in reason  # one preference method per set


@pytest.mark.slow
def test_a_sweep_of_the_methods_runs_and_reports(tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "sweep"
    proc = run_cli("sweep", "--workloads", "pref:tiny", "--techniques", "baseline,dpo,grpo,best_of_n",
                   "--repeats", "1", "--steps", "8", "--eval-points", "2", "--window-steps", "2",
                   "--window-seconds", "0.05", "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from bench.records.results import ResultStore

    every = ResultStore(out / "results.jsonl").read()
    records = [r for r in every if not r.continues]  # the planned trials; continuations train faster sets on
    assert {r.technique_label for r in records} == {"baseline", "dpo", "grpo", "best_of_n"}
    assert all(r.status == "ok" for r in records), [(r.technique_label, r.reason) for r in records]
    # best_of_n trains nothing, so its equal-time continuation is skipped with that reason
    assert all(r.status == "ok" or "trains nothing" in (r.reason or "") for r in every if r.continues)
    for r in records:
        assert set(r.quality.curve_extra) == {"proxy_reward", "kl"}
        assert len(r.quality.curve_extra["kl"]) == len(r.quality.curve) == 3
    assert list((out / "references").glob("pref-*.pt"))
    text = (out / "report.md").read_text()
    assert "gold_reward" in text
