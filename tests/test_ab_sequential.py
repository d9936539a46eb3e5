"""`sweep --ab --repeats auto` (bench.run.ab's sequential phase) from hand-made records: which configurations get
speed-only trials, on which side first, within which budget, and what a resume completes."""

import dataclasses

import pytest
import torch

from bench.plan.config import build_config
from bench.plan.planner import plan
from bench.run import ab, adaptive
from tests.conftest import REPO, TINY_BUDGET
from tests.records import record


def _cfg(**over):
    return build_config("smoke", {"workloads": "mlp", "techniques": "baseline,bf16", "repeats": "auto", **over})


def _side(speeds: dict[str, list[float]], wall: float = 10.0):
    """Planned records of one side: each set's three repeats at the given throughputs."""
    return [dataclasses.replace(record(label, seed=r, sps=sps), wall_s=wall)
            for label, values in speeds.items() for r, sps in enumerate(values)]


def _planned():
    """A/A-like: the baseline identical on both sides (equivalent, closed), bf16 wobbling (inconclusive, open)."""
    return {"a": _side({"baseline": [100.0, 100.0, 100.0], "bf16": [100.0, 100.0, 100.0]}),
            "b": _side({"baseline": [100.0, 100.0, 100.0], "bf16": [90.0, 110.0, 100.0]})}


def _ran(trials, sps=100.0, wall=5.0):
    """The records of ``trials`` run on one side."""
    return [dataclasses.replace(record(t.techniques.label, seed=t.seed, repeat=t.repeat, sps=sps, mode="speed"),
                                trial_id=t.trial_id, position=t.position, wall_s=wall, added_by=t.added_by)
            for t in trials]


def test_only_open_configurations_get_a_speed_only_round():
    cfg = _cfg()
    records = _planned()
    opened = ab.open_configurations(cfg, records)
    assert [(o.techniques.label, o.what, o.pairs) for o in opened] == [("bf16", "speed", 3)]
    trials = ab.sequential_round(cfg, records, budget_left=1000.0)
    assert [(t.trial_id, t.seed, t.repeat, t.mode, t.added_by) for t in trials] == [
        ("mlp:tiny/bf16/seed0/r3/speed", 0, 3, "speed", "sequential")]
    assert trials == [adaptive.speed_trial(cfg, cfg.workloads[0], opened[0].techniques, 1, 3, 6)]


def test_a_decided_or_capped_configuration_is_closed():
    cfg = _cfg()
    decided = {"a": _side({"bf16": [100.0, 100.0, 100.0]}), "b": _side({"bf16": [70.0, 71.0, 69.0]})}
    assert ab.open_configurations(cfg, decided) == []  # slower, whatever more pairs would say
    capped = _cfg(repeats=3, max_repeats=4)
    records = _planned()
    more = ab.sequential_round(capped, records, 1000.0)
    records = {s: records[s] + _ran(more, sps=100.0 if s == "a" else 97.0) for s in ab.SIDES}
    assert ab.open_configurations(capped, records) == []  # 4 pairs: the cap
    failing = {s: records[s][:-1] + [dataclasses.replace(records[s][-1], status="failed", speed=None)]
               for s in ab.SIDES}
    assert ab.open_configurations(capped, failing) == []  # 4 trials tried: closed even though one failed


def test_rounds_alternate_which_side_goes_first_and_number_on_from_the_plan():
    cfg = _cfg()
    index = ab.config_index(plan(cfg, torch.device("cpu")))
    records = _planned()
    orders = []
    for _ in range(3):
        trials = ab.sequential_round(cfg, records, 1000.0)
        assert len(trials) == 1
        orders.append([sides for _, sides in ab.abba_order(trials, index)][0])
        records = {s: records[s] + _ran(trials, sps=100.0 if s == "a" else 104.0 - 8 * (len(orders) % 2))
                   for s in ab.SIDES}
    assert orders[0] != orders[1] and orders[0] == orders[2]  # ABBA from one round to the next
    planned_first = dict(ab.abba_order(plan(cfg, torch.device("cpu"))))
    last_planned = next(s for t, s in planned_first.items() if t.techniques.label == "bf16" and t.repeat == 2)
    assert orders[0] != last_planned  # the first round continues the planned alternation
    assert [r.repeat for r in records["a"] if r.added_by] == [3, 4, 5]


def test_the_budget_stops_the_rounds_and_is_counted_from_both_sides_records():
    cfg = _cfg()
    records = _planned()  # 12 planned trials of 10 s: the default budget is half of 120 s
    both = records["a"] + records["b"]
    assert adaptive.budget_s(cfg, both) == 60.0
    assert ab.sequential_round(cfg, records, budget_left=9.0) == []  # a pair costs 2 x half a full trial: 10 s
    trials = ab.sequential_round(cfg, records, budget_left=10.0)
    records = {s: records[s] + _ran(trials, wall=29.0) for s in ab.SIDES}
    assert adaptive.spent_s(records["a"] + records["b"]) == 58.0  # both sides' speed-only trials count
    assert ab.sequential_round(cfg, records, budget_left=60.0 - 58.0) == []  # the next pair costs 58 s
    assert ab.sequential_round(_cfg(decide_within=1000), records, budget_left=1000.0 - 58.0)


def test_a_resume_first_runs_the_other_side_of_a_half_done_trial():
    cfg = _cfg()
    records = _planned()
    trials = ab.sequential_round(cfg, records, 1000.0)
    records["b"] += _ran(trials)  # interrupted after B ran it, before A did
    assert ab.half_done(cfg, records) == [(trials[0], "a")]
    records["a"] += _ran(trials)
    assert ab.half_done(cfg, records) == []
    nxt = ab.sequential_round(cfg, records, 1000.0)
    assert [t.repeat for t in nxt] == [4]  # the next round numbers on: nothing already recorded runs again



class _Launcher:
    """Stands in for the trial process in the phase's bookkeeping test: A at 100 samples/s, B 10% off either way
    (inconclusive at any number of pairs up to the cap), 5 s of wall time per trial."""

    def __init__(self, side: str, calls: list):
        self.side, self.calls = side, calls

    def run(self, trial, env):
        self.calls.append((self.side, trial.trial_id))
        sps = 100.0 if self.side == "a" else 100.0 * (1.1 if trial.repeat % 2 else 0.9)
        return dataclasses.replace(_ran([trial], sps=sps)[0], sweep_id=self.side)


def _phase(tmp_path, monkeypatch, cfg, planned, calls):
    """An A/B runner whose sides hold ``planned``, its trial processes stood in for by ``_Launcher``."""
    from bench.run.runner import SweepRunner

    launchers = {side: _Launcher(side, calls) for side in ab.SIDES}
    monkeypatch.setattr(SweepRunner, "launcher", property(lambda self: launchers[self.out_dir.name]))
    runner = ab.AbRunner(cfg, tmp_path / "ab", torch.device("cpu"), ab.Checkout(REPO, ".", None))
    for side, recs in planned.items():
        for r in recs:
            runner.runners[side].store.append(r)
    return runner


def test_the_phase_runs_each_trial_on_both_sides_until_the_budget_is_spent(tmp_path, monkeypatch):
    cfg = _cfg(max_repeats=20)  # room beyond the budget's six rounds (the default cap, 8, would end at five)
    index = ab.config_index(plan(cfg, torch.device("cpu")))
    calls: list = []
    runner = _phase(tmp_path, monkeypatch, cfg, _planned(), calls)
    runner._sequential_phase({"a": {}, "b": {}}, index, 0, 0, None)
    # The budget: half of the 12 planned trials' 120 s; each pair costs 10 s, so six rounds of the one open set.
    assert len(calls) == 12 and all(tid.startswith("mlp:tiny/bf16/") for _, tid in calls)
    pairs = [calls[i:i + 2] for i in range(0, len(calls), 2)]
    assert all(x[1] == y[1] and {x[0], y[0]} == {"a", "b"} for x, y in pairs)
    assert [p[0][0] for p in pairs] == ["b", "a", "b", "a", "b", "a"]  # ABBA, on from the planned order
    records = runner._records()
    assert adaptive.spent_s(records["a"] + records["b"]) == 60.0
    # A resume of the finished phase (its budget spent) adds nothing; one with a half-done pair completes
    # it first, and runs nothing that is recorded.
    calls.clear()
    runner._sequential_phase({"a": {}, "b": {}}, index, 0, 0, None)
    assert calls == []
    lines = runner.runners["a"].store.path.read_text().splitlines(keepends=True)
    runner.runners["a"].store.path.write_text("".join(lines[:-1]))  # A's side of the last pair was lost
    runner._sequential_phase({"a": {}, "b": {}}, index, 0, 0, None)
    assert calls == [("a", pairs[-1][0][1])]


@pytest.mark.slow
def test_an_aa_run_with_repeats_auto_end_to_end(tmp_path):
    """The real thing on the smoke preset with tiny windows: this checkout on both sides (A/A), compared at
    threshold 0 so that an A/A throughput verdict stays open (no equivalence short of identical timings)."""
    out = tmp_path / "aa"
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": "auto", "max_repeats": 5,
                                 "threads": 1, "mode": "speed", "decide_within": 600,
                                 "budget": {**TINY_BUDGET, "memory": False, "parity_steps": 0,
                                            "contention_retries": 0}})
    seen = []

    def run(resume: bool):
        runner = ab.AbRunner(cfg, out, torch.device("cpu"), ab.Checkout(REPO, ".", None), resume=resume,
                             threshold=0.0)
        return runner.run(lambda p: seen.append((p.side, p.trial.trial_id, p.trial.added_by, p.record)))

    result = run(resume=False)
    a, b = result.records["a"], result.records["b"]
    assert [r.status for r in a + b] == ["ok"] * len(a + b), [(r.trial_id, r.reason) for r in a + b]
    added = [(side, tid) for side, tid, by, _ in seen if by == "sequential"]
    assert sorted(r.trial_id for r in a if r.added_by) == sorted(r.trial_id for r in b if r.added_by)
    assert all(r.mode == "speed" and r.trial_id.endswith("/speed") for r in a + b if r.added_by)
    pairs = [added[i:i + 2] for i in range(0, len(added), 2)]
    assert all(x[1] == y[1] and {x[0], y[0]} == {"a", "b"} for x, y in pairs)  # both sides, back to back
    firsts = [p[0][0] for p in pairs]
    assert all(f != g for f, g in zip(firsts, firsts[1:], strict=False))  # ABBA from one round to the next
    assert ab.open_configurations(cfg, result.records) == []  # it stopped: decided, or the cap of 5 pairs
    planned = {s: [r for r in recs if not r.added_by] for s, recs in result.records.items()}
    if ab.open_configurations(cfg, planned):  # open after the planned trials (all but a chance first look)
        assert pairs, "an open configuration got no speed-only pair"
    est = result.comparison.rows[0].throughput.estimate
    if est is not None:  # None when every window was contended by other processes (a shared machine)
        assert est.max_looks == 5 and "repeated interval" in est.method
    assert "95% repeated confidence interval" in (out / "compare.md").read_text()
    if not pairs:
        return
    # Interrupted after one side of the last speed-only trial: the resume runs its other side, nothing twice.
    results_b = out / "b" / "results.jsonl"
    lines = results_b.read_text().splitlines(keepends=True)
    results_b.write_text("".join(lines[:-1]))
    recorded = {side: {r.trial_id for r in recs} for side, recs in result.records.items()}
    seen.clear()
    again = run(resume=True)
    launched = [(side, tid) for side, tid, _, rec in seen if rec is not None]
    assert launched[0] == ("b", pairs[-1][0][1] if pairs[-1][1][0] == "a" else pairs[-1][1][1])
    assert all(tid not in recorded[side] for side, tid in launched[1:])
    assert len(again.records["a"]) >= len(a) and len(again.records["b"]) >= len(b)
