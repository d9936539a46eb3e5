"""The one pairing of trials (bench/analyze/pairs.py): which trials count, which pair, and that the report, the A/B
gate and tune read the same samples and reach the same verdicts from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.analyze import analysis, compare, findings, pairs, stats
from bench.records import reader
from bench.records.frame import design_cap, records_frame
from bench.records.reader import Source, Sweep
from bench.run import tune
from tests.records import record


def _frame(records, max_looks=None):
    return records_frame(records, max_looks=max_looks)


def _set(frame, label):
    return frame[frame["technique"] == label]


def test_a_trial_is_keyed_by_its_directory_seed_and_repeat():
    frame = _frame([record(seed=1, repeat=4, sps=90.0)])
    assert pairs.samples(frame, pairs.THROUGHPUT) == {("", 1, 4): 90.0}


def test_a_contended_window_is_left_out_of_throughput_but_not_of_memory():
    recs = [record(seed=s, sps=100.0 + s, peak=1000, contended=s == 1) for s in range(3)]
    frame = _frame(recs)
    assert set(pairs.samples(frame, pairs.THROUGHPUT)) == {("", 0, 0), ("", 2, 2)}
    assert list(pairs.timed(frame)["seed"]) == [0, 2]
    mem = pairs.pair(frame, frame, pairs.PEAK_MEMORY)
    assert mem.source == "tensors" and len(mem.mine) == 3  # memory is measured in its own pass, after the window


def test_a_quality_run_cut_by_the_safety_cap_is_left_out_of_quality_quantities():
    recs = [record(seed=s, final=0.5, target=0.4, ttt=2.0, cut="max_train_seconds" if s == 2 else None)
            for s in range(3)]
    frame = _frame(recs)
    assert list(pairs.quality_runs(frame)["seed"]) == [0, 1]
    assert set(pairs.samples(frame, pairs.FINAL_METRIC)) == {("", 0, 0), ("", 1, 1)}
    p = pairs.pair(frame, frame, pairs.TIME_TO_TARGET)
    assert len(p.mine) == 2 and p.misses == (0, 0)  # cut: not a miss, not a run at all
    assert len(pairs.samples(frame, pairs.THROUGHPUT)) == 3  # its timed window still counts


def test_a_failed_trial_drops_its_pair():
    base = [record(seed=s, sps=100.0) for s in range(4)]
    new = [record("bf16", seed=s, sps=80.0, status="failed" if s == 2 else "ok",
                  reason="boom" if s == 2 else None) for s in range(4)]
    frame = _frame(base + new)
    p = pairs.pair(_set(frame, "bf16"), _set(frame, "baseline"), pairs.THROUGHPUT)
    assert ("", 2, 2) not in p.mine and ("", 2, 2) in p.ref
    est = stats.ratio(p.mine, p.ref)
    assert est.paired and est.n == 3  # the failed trial's reference trial is out of the comparison too


def test_two_directories_never_pair():
    a = [record(seed=s, sps=100.0) for s in range(3)]
    b = [record("bf16", seed=s, sps=50.0 + s) for s in range(3)]
    sweep = Sweep([Source(path=Path("one"), records=a, env={}), Source(path=Path("two"), records=b, env={})])
    frame = records_frame(sweep)
    p = pairs.pair(_set(frame, "bf16"), _set(frame, "baseline"), pairs.THROUGHPUT)
    assert set(p.mine) == {("two", s, s) for s in range(3)} and set(p.ref) == {("one", s, s) for s in range(3)}
    assert not stats.ratio(p.mine, p.ref).paired  # the same seeds, but not the same sweep: independent samples


def test_sequential_speed_only_pairs_count_in_speed_and_memory_only():
    planned = [record(label, seed=s, sps=sps, peak=1000, final=0.5) for s in range(3)
               for label, sps in (("baseline", 100.0), ("bf16", 120.0))]
    added = [dataclasses.replace(record(label, seed=r % 3, repeat=r, sps=sps, peak=1000, mode="speed"),
                                 added_by="sequential")
             for r in range(3, 5) for label, sps in (("baseline", 100.0), ("bf16", 120.0))]
    frame = _frame(planned + added, max_looks=8)
    mine, ref = _set(frame, "bf16"), _set(frame, "baseline")
    speed = pairs.pair(mine, ref, pairs.THROUGHPUT)
    assert set(speed.mine) == set(speed.ref) == {("", 0, 0), ("", 1, 1), ("", 2, 2), ("", 0, 3), ("", 1, 4)}
    assert speed.cap == 8 and len(pairs.pair(mine, ref, pairs.PEAK_MEMORY).mine) == 5
    assert len(pairs.pair(mine, ref, pairs.FINAL_METRIC).mine) == 3  # the planned quality runs alone


def test_a_continuation_is_no_repeat():
    original = record(seed=0, sps=100.0, final=0.5)
    continued = dataclasses.replace(record(seed=0, sps=100.0, final=0.6), continues=original.trial_id)
    frame = _frame([original, continued])
    assert len(pairs.trials(frame)) == 1 and pairs.samples(frame, pairs.FINAL_METRIC) == {("", 0, 0): 0.5}


def test_memory_compares_tensor_peaks_where_every_trial_has_one_else_rss_else_nothing():
    def pair(base_peak, base_rss):
        base = [record(seed=s, peak=base_peak, rss=base_rss) for s in range(3)]
        new = [record("checkpointing", seed=s, peak=500, rss=4000) for s in range(3)]
        frame = _frame(base + new)
        return pairs.pair(_set(frame, "checkpointing"), _set(frame, "baseline"), pairs.PEAK_MEMORY)

    assert pair(1000, 5000).source == "tensors" and set(pair(1000, 5000).mine.values()) == {500.0}
    rss = pair(None, 5000)
    assert rss.source == "RSS" and set(rss.mine.values()) == {4000.0} and set(rss.ref.values()) == {5000.0}
    assert pair(None, None).source is None and pair(None, None).mine == {}


def test_time_to_target_counts_the_runs_that_missed():
    recs = [record(seed=s, final=0.5, target=0.4, ttt=None if s == 0 else 2.0 + s) for s in range(3)]
    p = pairs.pair(_frame(recs), None, pairs.TIME_TO_TARGET)
    assert p.mine == {("", 1, 1): 3.0, ("", 2, 2): 4.0} and p.misses == (1, 0) and p.ref == {}


# ---- one verdict on the same records ------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parent.parent / "reports" / "example-cpu-auto"  # a sequential design (cap 8)


def _answer(value, lo, hi, word):
    """(estimate, interval, verdict word), or nothing at all where no estimate was made."""
    return None if value is None else (pytest.approx(value, rel=1e-12), (pytest.approx(lo, rel=1e-12),
                                       pytest.approx(hi, rel=1e-12)), word)


def test_analysis_compare_and_tune_give_the_same_verdict_on_the_same_records():
    sweep = reader.load([EXAMPLE])
    cap = design_cap(sweep.sources[0].settings)
    assert cap == 8  # so every speed and memory interval below is the design's repeated one
    th = analysis.Thresholds()
    configs = analysis.configurations(records_frame(sweep), analysis.BASELINE, th)
    records = [r for r in sweep.records if r.continues is None]
    found = []
    for c in configs[~configs["is_reference"].astype(bool)].itertuples():
        mine = [r for r in records if (r.workload_label, r.technique_label) == (c.workload, c.technique)]
        ref = [r for r in records if (r.workload_label, r.technique_label) == (c.workload, analysis.BASELINE)]
        gate = compare.compare_config(compare.ConfigKey.of(mine[0]), ref, mine, th.speed, cap)  # BASE, NEW
        rows = records_frame(mine + ref, max_looks=cap)
        for column, q, objective in (("speedup", gate.throughput, "throughput"), ("mem_ratio", gate.memory, "memory")):
            est, v = tune.compare(rows[rows["technique"] == c.technique], rows[rows["technique"] == analysis.BASELINE],
                                  tune.objective_of(objective), cap)
            report = (getattr(c, column), getattr(c, f"{column}_lo"), getattr(c, f"{column}_hi"),
                      getattr(c, f"{column}_verdict"))
            gated = (q.estimate.value, q.estimate.lo, q.estimate.hi, q.verdict) if q.estimate else (None,) * 4
            assert _answer(*report) == _answer(*gated) == _answer(est.value, est.lo, est.hi, v.word), \
                f"{c.workload} {c.technique} {objective}"
            found.append(report[-1])
    assert len(found) == 2 * 12  # 3 workloads x 4 sets, speed and memory
    assert found.count("slower") == 5 and None not in found  # decided verdicts among them (docs/methodology.md)


def test_a_claim_over_the_rest_reads_the_sequential_designs_interval_as_the_speedup_does():
    from techniques.base import Claim

    sets = {"baseline": [100, 104, 97, 101], "compile": [120, 118, 125, 121], "bf16+compile": [160, 150, 170, 158]}
    records = [record(label, seed=s, sps=v) for label, values in sets.items() for s, v in enumerate(values)]
    frame = records_frame(records, max_looks=8)
    claim = Claim("speedup", 1.2, 1.5, "test", "test", over_rest=True)
    row = findings.claims_check(analysis.configurations(frame), {}, {"bf16": (claim,)}, frame)
    row = row.set_index("technique").loc["bf16+compile"]
    p = pairs.pair(_set(frame, "bf16+compile"), _set(frame, "compile"), pairs.THROUGHPUT)
    repeated, fixed = stats.ratio(p.mine, p.ref, 8), stats.ratio(p.mine, p.ref)
    assert row["against"] == "compile" and p.cap == 8
    assert (row["measured"], row["measured_lo"], row["measured_hi"]) == (repeated.value, repeated.lo, repeated.hi)
    assert repeated.lo < fixed.lo  # wider than the fixed-n interval its pairs would give read once
