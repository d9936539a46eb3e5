"""The report on sets that change how fast a model learns: what they found, early stops, the median's interval."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from bench.analyze import stats
from bench.records.results import ResultStore
from bench.report import build, markdown
from tests.records import record

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report"


def _sweep(tmp_path: Path, records) -> str:
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    for r in records:
        store.append(r)
    report = build([out])[1]
    return markdown.render(report), report.figures


def _quality_records():
    """5 seeds: the baseline reaches the target at 10 s; lr_finder (2 s probe) at 6 s; early stopping stops 3 runs
    at 40% of the samples with a worse metric."""
    out = []
    for seed in range(5):
        out.append(record("baseline", seed, mode="quality", kind="exact", final=0.8, start=0.1, target=0.5,
                          ttt=10.0 + seed, train_time=20.0, budget_samples=640))
        finder = record("lr_finder", seed, mode="quality", kind="algorithmic", final=0.82, start=0.1, target=0.5,
                        ttt=6.0 + seed, train_time=20.0, budget_samples=640)
        finder = dataclasses.replace(
            finder, build=dataclasses.replace(finder.build, probe_s=2.0),
            quality=dataclasses.replace(finder.quality, time_to_target_with_one_off_s=8.0 + seed),
            technique_results={"lr_finder": {"rule": "steepest", "chosen_lr": 0.004 + 0.001 * seed,
                                             "suggestions": {"steepest": 0.004 + 0.001 * seed, "valley": 0.001},
                                             "default_lr": 0.002, "fell_back": False, "steps": 3,
                                             "curve": [[1e-4, 2.0, 2.0], [1e-3, 1.5, 1.8], [1e-2, 9.0, 3.0]]}})
        out.append(finder)
        stops = seed < 3
        early = record("early_stopping", seed, mode="quality", kind="algorithmic", final=0.7 if stops else 0.8,
                       start=0.1, target=0.5, ttt=10.0 + seed, train_time=8.0 if stops else 20.0,
                       budget_samples=640)
        if stops:
            q = early.quality
            curve = [q.curve[0], [256, 4, 8.0, 1.0, 0.7]]
            early = dataclasses.replace(early, quality=dataclasses.replace(
                q, curve=curve, samples_trained=256, steps_trained=4, final=0.7, train_time_s=8.0,
                stopped_by="early_stopping stopped the run at step 4 of 10"))
        early = dataclasses.replace(early, technique_results={"early_stopping": {
            "stopped": stops, "steps_saved_frac": 0.6 if stops else None, "evaluations": 2}})
        out.append(early)
    return out


def test_findings_early_stops_and_the_interval_of_the_median(tmp_path):
    text, figures = _sweep(tmp_path, _quality_records())
    section = text.split("## What the techniques found", 1)[1].split("\n## ", 1)[0]
    assert ("chosen LR (steepest rule): 0.004, 0.005, 0.006, 0.007, 0.008; the valley rule would give "
            "0.001 (each of 5); the workload's default 0.002") in section
    assert "stopped 3/5 runs, saving 0.6 (each of 3) of the planned steps" in section
    assert "lr_range" in figures
    row = next(line for line in text.splitlines() if line.startswith("| lr_finder |"))
    # 5 seeds: the interval of the median is their range, which covers it with probability 1 - 2/32
    assert "8.00 s [6.00 s, 10.0 s] (94% interval; 10.0 s with one-off)" in row
    assert "- + probes 2.00 s" in row
    stopped = next(line for line in text.splitlines() if line.startswith("| early_stopping |"))
    assert ("stopped early in 3/5 runs (the stopped ones trained a median 40% of the samples; all runs: median "
            "8.00 s of training against the reference's 20.0 s): the metric at the stop against the full run of the "
            "same seed") in stopped


def test_median_interval_from_order_statistics():
    low, high, coverage = stats.median_interval([5, 1, 4, 2, 3])
    assert (low, high) == (1, 5) and coverage == pytest.approx(1 - 2 / 32)
    low, high, coverage = stats.median_interval(list(range(1, 11)))  # n=10: [x2, x9] covers 97.9%
    assert (low, high) == (2, 9) and coverage == pytest.approx(1 - 2 * 11 / 1024)
    assert stats.median_interval([1.0, None, None, 2.0, None])[1] == float("inf")  # a miss may be the median
    assert stats.median_interval([1.0]) is None


def test_each_finding_reads_plainly_and_edge_cases_do_not_break_the_report():
    import techniques

    summaries = {name: cls.summarize for name, cls in techniques.registry().items()}
    seq = {"order": "easy_first", "start": 0.125, "warmup": 0.3, "full_length": 64, "warmup_steps": 45,
           "warmup_lengths": {"8": 10, "32": 20, "56": 15}, "tokens_fraction_of_plan": 0.8}
    assert summaries["curriculum"]([seq]) == ("order easy_first: lengths 8-56 of 64 over 45 steps; 80% of the plan's "
                                              "tokens")
    none = {**seq, "warmup_steps": 0, "warmup_lengths": {}, "tokens_fraction_of_plan": None}
    assert "no length warm-up" in summaries["curriculum"]([none])
    pool = {"order": "random", "start": 0.125, "warmup": 0.3,
            "scorer": {"steps": 150, "scorer_train_s": 2.5, "cached": True}}
    assert "scorer trained 150 steps once (2.50 s, cached" in summaries["curriculum"]([pool])
    batch = {"mode": "noise", "batch_size": 256, "default_batch_size": 64, "lr_after": 0.004, "rule": "sqrt",
             "b_simple": 198.3}
    assert summaries["batch_size"]([batch]) == ("mode noise: trained at batch 256 (default 64), LR 0.004 (sqrt rule); "
                                                "critical batch size B_simple 198")
    assert summaries["early_stopping"]([{"evaluations": 0, "stopped": False}]).startswith("no evaluation")
    assert summaries["lr_schedule"]([{"schedule": "one_cycle", "peak_lr": 0.003, "planned_steps": 150}]) == \
        "one_cycle, peak LR 0.003 over 150 steps"


def test_a_technique_without_a_summary_of_its_own_shows_its_result_keys(tmp_path):
    """A plugin technique not registered where the report renders (or one without summarize) is seen, not skipped."""
    records = [dataclasses.replace(record("baseline", seed), technique_results={"not_here": {"found": seed, "n": 1}})
               for seed in range(2)]
    text, _ = _sweep(tmp_path, records)
    section = text.split("## What the techniques found", 1)[1].split("\n## ", 1)[0]
    assert "| not_here | 2 result(s) with keys found, n (no summary of its own: see technique_results in the " \
           "records) |" in section
