"""Quality at equal time: a faster numeric or algorithmic set trains on to the reference's clock (a continuation)
and is scored there; continuations stay out of every other statistic; blocked techniques say why."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from bench import cli
from bench.analyze import analysis
from bench.plan.config import build_config
from bench.records import reader
from bench.records.frame import records_frame
from bench.records.results import ContinuationResult, TrialRecord
from bench.report.cells import quality_cell
from bench.run.continuation import continuation_id, continuation_trials
from bench.trial import TrialSpec, run
from tests.conftest import TINY_BUDGET
from tests.records import record

# ---- scheduling (synthetic records) -------------------------------------------------------------------------------

BASE_CURVE = [[0, 0, 0.0, None, 0.1], [320, 5, 1.0, 2.0, 0.5], [640, 10, 2.0, 1.0, 0.8]]
FAST_CURVE = [[0, 0, 0.0, None, 0.1], [320, 5, 0.5, 2.0, 0.5], [640, 10, 1.0, 1.0, 0.8]]


def _cfg():
    return build_config("smoke", {"workloads": "mlp", "techniques": "bf16,lr_schedule,checkpointing,early_stopping"})


def _stopped(r: TrialRecord) -> TrialRecord:
    return dataclasses.replace(r, quality=dataclasses.replace(r.quality, stopped_by="early_stopping stopped the run "
                                                                                    "at step 5 of 10"))


def _sweep_records() -> list[TrialRecord]:
    base = [record(seed=i, curve=BASE_CURVE, position=i) for i in range(3)]
    bf16 = [record("bf16", seed=0, curve=FAST_CURVE, position=3),
            record("bf16", seed=1, curve=FAST_CURVE, position=4),
            record("bf16", seed=2, curve=[[0, 0, 0.0, None, 0.1], [640, 10, 3.0, 1.0, 0.8]], position=5)]  # slower
    cut = record("bf16", seed=3, curve=FAST_CURVE, cut="stopped at step 5 of 10", position=6)
    exact = [record("checkpointing", seed=i, curve=FAST_CURVE, position=7 + i) for i in range(3)]
    blocked = [record("lr_schedule", seed=i, kind="algorithmic", curve=FAST_CURVE, position=10 + i) for i in range(2)]
    stopped = [_stopped(record("early_stopping", seed=0, kind="algorithmic", curve=FAST_CURVE, position=12))]
    return base + bf16 + [cut] + exact + blocked + stopped


def test_continuations_go_to_faster_complete_numeric_and_algorithmic_runs_only():
    trials = continuation_trials(_cfg(), _sweep_records(), set())
    by_id = {t.trial_id: t for t in trials}
    assert set(by_id) == {"mlp:tiny/bf16/seed0/r0/continue", "mlp:tiny/bf16/seed1/r1/continue",
                          "mlp:tiny/lr_schedule/seed0/r0/continue", "mlp:tiny/lr_schedule/seed1/r1/continue",
                          "mlp:tiny/early_stopping/seed0/r0/continue"}  # not the slower seed, the cut run, exact sets
    t = by_id["mlp:tiny/bf16/seed1/r1/continue"]
    assert (t.mode, t.train_until_s, t.continues, t.seed, t.skip_reason) == ("quality", 2.0, "mlp:tiny/bf16/seed1/r1",
                                                                             1, None)
    assert t.techniques.label == "bf16" and t.workload.label == "mlp:tiny"
    assert all(t.position > 12 for t in trials) and len({t.position for t in trials}) == len(trials)
    assert "schedule ends at the planned steps" in by_id["mlp:tiny/lr_schedule/seed0/r0/continue"].skip_reason
    assert "complete where it stopped" in by_id["mlp:tiny/early_stopping/seed0/r0/continue"].skip_reason


def test_recorded_continuations_are_not_scheduled_again():
    records = _sweep_records()
    first = continuation_trials(_cfg(), records, set())
    done = {first[0].trial_id}
    again = continuation_trials(_cfg(), records, done)
    assert [t.trial_id for t in again] == [t.trial_id for t in first[1:]]
    # a continuation's own record never calls for a continuation of itself
    cont = dataclasses.replace(record("bf16", seed=0, curve=FAST_CURVE), trial_id=first[0].trial_id,
                               continues=first[0].continues)
    assert continuation_trials(_cfg(), [*records, cont], {t.trial_id for t in first}) == []


def test_a_constant_lr_schedule_and_a_curriculum_without_pacing_can_continue():
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "lr_schedule:schedule=constant,"
                                                                     "curriculum:warmup=0"})
    records = [record(seed=0, curve=BASE_CURVE),
               record("lr_schedule:schedule=constant", seed=0, kind="algorithmic", curve=FAST_CURVE),
               record("curriculum:warmup=0", seed=0, kind="algorithmic", curve=FAST_CURVE)]
    trials = continuation_trials(cfg, records, set())
    assert len(trials) == 2 and all(t.skip_reason is None for t in trials)


# ---- analysis (synthetic records) ---------------------------------------------------------------------------------


def _continued(r: TrialRecord, curve: list, beyond: int, reached: bool = True, why: str | None = None,
               status: str = "ok", reason: str | None = None) -> TrialRecord:
    """The continuation record of ``r``: its budget's curve, then ``curve``'s rows."""
    if status != "ok":
        return dataclasses.replace(r, trial_id=continuation_id(r.trial_id), continues=r.trial_id, status=status,
                                   reason=reason, quality=None, speed=None, mode="quality", position=100 + r.seed)
    info = ContinuationResult(until_s=2.0, reached=reached, samples_beyond_budget=beyond, steps_beyond_budget=beyond
                              // 64, train_time_s=curve[-1][2], why_not=why)
    q = dataclasses.replace(r.quality, curve=r.quality.curve + curve, continuation=info)
    return dataclasses.replace(r, trial_id=continuation_id(r.trial_id), continues=r.trial_id, quality=q, speed=None,
                               mode="quality", position=100 + r.seed)


def _configs(records):
    return analysis.configurations(records_frame(records)).set_index("technique", drop=False)


def test_a_faster_set_is_scored_on_its_continuation_at_the_reference_clock():
    base = [record(seed=i, sps=100, curve=BASE_CURVE, target=0.7, ttt=2.0) for i in range(3)]
    fast = [record("bf16", seed=i, sps=200, curve=FAST_CURVE, target=0.7, ttt=1.0) for i in range(3)]
    conts = [_continued(r, [[960, 15, 1.5, 0.8, 0.85], [1280, 20, 2.05, 0.7, 0.9 + 0.01 * r.seed]], 640)
             for r in fast]
    without = _configs(base + fast).loc["bf16"]
    assert without["delta_at_time"] == pytest.approx(0.0)  # scored at the end of its own shorter run
    assert without["equal_time_faster"] == 3 and without["equal_time_continued"] == 0
    c = _configs(base + fast + conts).loc["bf16"]
    # at the reference's clock (2.0 s) the continuation had reached 0.85 (its 1.5 s evaluation; 2.05 s is past it)
    assert c["delta_at_time"] == pytest.approx(0.85 - 0.8) and c["delta_at_time_verdict"] == "better"
    assert c["equal_time_continued"] == 3 and c["equal_time_beyond_samples"] == 640
    assert c["equal_time_until_s"] == pytest.approx(2.05) and c["equal_time_s"] == 2.0
    # every other statistic is the planned trials' alone
    for column in ("n_total", "n_ok", "n_final", "final_mean", "delta", "speedup", "n_speed", "ttt_median",
                   "ttt_ratio", "status"):
        assert c[column] == without[column], column
    text = quality_cell(c).text
    assert "at equal time (2.00 s): +0.0500" in text and "better (trained on to 2.05 s, +640 samples)" in text


def test_a_slower_set_is_scored_on_its_own_curve_and_exact_sets_ignore_continuations():
    base = [record(seed=i, curve=BASE_CURVE) for i in range(3)]
    slow = [record("curriculum", seed=i, kind="algorithmic",
                   curve=[[0, 0, 0.0, None, 0.1], [320, 5, 2.0, 2.0, 0.6], [640, 10, 4.0, 1.0, 0.85]])
            for i in range(3)]
    c = _configs(base + slow).loc["curriculum"]
    assert c["delta_at_time"] == pytest.approx(0.6 - 0.8) and c["equal_time_faster"] == 0
    exact = [record("checkpointing", seed=i, curve=FAST_CURVE) for i in range(3)]
    stray = [_continued(r, [[1280, 20, 2.0, 0.7, 0.99]], 640) for r in exact]
    assert _configs(base + exact + stray).loc["checkpointing", "equal_time_continued"] == 0


def test_the_blocker_reason_reaches_the_row_and_the_cell():
    base = [record(seed=i, curve=BASE_CURVE) for i in range(3)]
    sched = [record("lr_schedule", seed=i, kind="algorithmic", curve=FAST_CURVE) for i in range(3)]
    why = "lr_schedule's warmup_cosine schedule ends at the planned steps: a longer run would stretch it"
    skipped = [_continued(r, [], 0, status="skipped", reason=why) for r in sched]
    c = _configs(base + sched + skipped).loc["lr_schedule"]
    assert c["equal_time_blocked"] == why and c["equal_time_continued"] == 0 and c["n_total"] == 3
    assert f"(continuation not possible: {why})" in quality_cell(c).text


def test_continuations_are_kept_out_of_the_report_frame(tmp_path):
    base = [record(seed=i, curve=BASE_CURVE) for i in range(3)]
    fast = [record("bf16", seed=i, sps=200, curve=FAST_CURVE) for i in range(3)]
    conts = [_continued(r, [[1280, 20, 2.0, 0.7, 0.9]], 640) for r in fast]
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in base + fast + conts))
    result = analysis.analyze(reader.load([out]))
    assert len(result.frame) == 6 and len(result.continuations) == 3
    assert result.configs.set_index("technique").loc["bf16", "delta_at_time"] == pytest.approx(0.1)
    again = TrialRecord.from_dict(json.loads(conts[0].to_json()))  # the new fields read back
    assert again.continues == fast[0].trial_id and again.quality.continuation.samples_beyond_budget == 640


# ---- the trial (in process) ---------------------------------------------------------------------------------------


@pytest.fixture
def quality_spec(reference_dir):
    def make(techniques=(), **kw) -> TrialSpec:
        return TrialSpec(sweep_id="t", trial_id="mlp/x", workload="mlp", size="tiny", techniques=list(techniques),
                         seed=1, repeat=0, device="cpu", budget={**TINY_BUDGET, "memory": False}, mode="quality",
                         reference_dir=str(reference_dir), **kw)
    return make


def test_a_continuation_reproduces_the_budget_then_trains_on_at_the_same_cadence(quality_spec):
    original = run(quality_spec())
    assert original.status == "ok", original.reason
    assert original.quality.continuation is None and "train_until_s" not in quality_spec().to_json()
    until = 3 * original.quality.train_time_s
    rec = run(quality_spec(train_until_s=until))
    assert rec.status == "ok", rec.reason
    q, c = rec.quality, rec.quality.continuation
    n = len(original.quality.curve)
    assert [p[-1] for p in q.curve[:n]] == [p[-1] for p in original.quality.curve]  # the same metric, bit for bit
    assert [p[3] for p in q.curve[:n]] == [p[3] for p in original.quality.curve]  # and training losses
    assert q.final == original.quality.final and q.samples_trained == original.quality.samples_trained
    assert q.train_time_s == q.curve[n - 1][2]  # the budget's clock
    steps = [p[1] for p in q.curve[n:]]
    assert steps and steps == list(range(25, 25 + 5 * len(steps), 5))  # the budget's cadence (every 5 steps)
    assert c.steps_beyond_budget == steps[-1] - 20 and c.samples_beyond_budget == 64 * c.steps_beyond_budget
    assert c.until_s == until and c.train_time_s == q.curve[-1][2]
    if c.reached:
        assert q.curve[-1][2] >= until > q.curve[-2][2]  # stopped at the first evaluation past the clock
    else:  # a busy machine can make the budget's 4x cap come first
        assert "4x the budget's samples" in c.why_not and steps[-1] == 80


def test_a_blocked_technique_records_its_reason_and_trains_nothing_more(quality_spec):
    rec = run(quality_spec(["lr_schedule"], train_until_s=1e3))
    c = rec.quality.continuation
    assert rec.status == "ok" and not c.reached and c.samples_beyond_budget == 0
    assert "lr_schedule's warmup_cosine schedule ends at the planned steps" in c.why_not
    assert rec.quality.curve[-1][1] == 20


# ---- end to end: a set 2x faster by a sleep, through the real runner ---------------------------------------------

MODEL = '''
import time
import torch
import torch.nn.functional as F
from torch import nn

SLEEP_S = 0.05  # dominates the tiny step, so the 2x holds on a busy machine too


class Slow(nn.Module):
    """Sleeps in every training forward: 2 x SLEEP_S, or SLEEP_S once a technique has halved it."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.sleeps = 2

    def forward(self, x):
        if self.training:
            time.sleep(SLEEP_S * self.sleeps)
        return self.net(x)


def build(size: str = "small", seed: int = 0):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(16, 4, generator=g)
    x = torch.randn(1200, 16, generator=g)
    y = (x @ w).argmax(1)

    def evaluate(m):
        return {"val_loss": F.cross_entropy(m(x[1000:]), y[1000:]).item()}

    return dict(model=Slow(), train_data=(x[:1000], y[:1000]), loss=F.cross_entropy, evaluate=evaluate,
                metric="val_loss", higher_is_better=False, batch_size=32, lr=2e-3, quality_steps=12, eval_points=4)
'''

TECHNIQUE = '''
from techniques.base import Kind, Technique


class Quick(Technique):
    """The same math without half of the model's sleep: a step twice as fast."""

    name = "quick"
    kind = Kind.NUMERIC
    own_flops = hides_tensors = False
    tune_options = ()

    def transform_model(self, model, ctx):
        model.sleeps = 1
        return model
'''


@pytest.mark.slow
def test_a_set_twice_as_fast_reaches_a_better_metric_at_equal_time(tmp_path, capsys):
    (tmp_path / "slowmodel.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "quick.py").write_text(textwrap.dedent(TECHNIQUE))
    out = tmp_path / "sweep"
    args = ["sweep", "--preset", "smoke", "--model", f"{tmp_path / 'slowmodel.py'}:build",
            "--technique", f"{tmp_path / 'quick.py'}:Quick", "--techniques", "quick,quick+lr_schedule",
            "--repeats", "3", "--mode", "quality", "--steps", "12", "--eval-points", "4", "--threads", "1",
            "--no-memory", "--out", str(out)]
    assert cli.main(args) == 0, capsys.readouterr().err[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    conts = {r["trial_id"]: r for r in records if r["continues"]}
    planned = {r["trial_id"]: r for r in records if not r["continues"]}
    assert len(planned) == 9 and all(r["status"] == "ok" for r in planned.values())
    quick = {r["seed"]: r for r in conts.values() if r["technique_label"] == "quick"}
    blocked = [r for r in conts.values() if r["technique_label"] == "quick+lr_schedule"]
    assert sorted(quick) == [0, 1, 2] and len(blocked) == 3 and len(conts) == 6
    assert all(r["status"] == "skipped" and "schedule ends at the planned steps" in r["reason"] for r in blocked)
    for cont in quick.values():
        original = planned[cont["continues"]]
        budget = len(original["quality"]["curve"])
        assert [p[-1] for p in cont["quality"]["curve"][:budget]] == [p[-1] for p in original["quality"]["curve"]]
        info = cont["quality"]["continuation"]
        assert info["reached"] and info["samples_beyond_budget"] > 0, info
        assert cont["quality"]["curve"][-1][-1] < original["quality"]["final"]  # trained on: a lower loss
    row = analysis.analyze(reader.load([out])).configs.set_index("technique").loc["quick"]
    assert row["n_total"] == 3 and row["equal_time_continued"] == 3
    assert row["delta"] == pytest.approx(0.0, abs=1e-3)  # the same math at equal samples
    assert row["delta_at_time"] < 0 and row["delta_at_time_verdict"] == "better"
    report = (out / "report.md").read_text()
    assert "trained on to" in report and "continuation not possible: lr_schedule's" in report
    # resumed, nothing runs again: the continuations are recorded
    lines = (out / "results.jsonl").read_text()
    assert cli.main([*args, "--resume"]) == 0
    assert (out / "results.jsonl").read_text() == lines



def test_each_blocker_says_why_and_the_rest_continue():
    import torch

    from bench.plan.config import TechniqueSpec
    from techniques.base import Context

    ctx = Context(device=torch.device("cpu"))

    def why(label: str) -> str | None:
        return TechniqueSpec.parse(label).resolve().continuation_blocker(ctx)

    assert "one_cycle schedule ends at the planned steps" in why("lr_schedule:schedule=one_cycle")
    assert "pacing grows over 0.3 of the planned steps" in why("curriculum")
    assert "pruning events at fractions" in why("prune") and "its shrink" in why("prune:mode=structured")
    assert [why(t) for t in ("bf16", "lr_finder", "batch_size", "lr_schedule:schedule=constant", "early_stopping",
                             "curriculum:warmup=0")] == [None] * 6
    ctx.state["early_stopping_stop"] = {"reason": "no improvement in 3 evaluations", "step": 40, "evaluation": 8}
    assert why("early_stopping") == ("early_stopping stopped the run at step 40 (no improvement in 3 evaluations): "
                                     "it ends where it stopped")
