"""The report's reading of a workload that records a proxy reward and KL beside its metric: the Summary's compute to
target and over-optimisation sentences (verdicts from bench.analyze.stats) and the gold-against-KL frontier figure."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from bench.records.results import ResultStore
from bench.report import build, markdown
from tests.records import record

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report"
BATCH, SAMPLES = 16, 160  # 10 steps, evaluated every 2


def _trial(label: str, seed: int, gold: list[float], proxy: list[float], kl: list[float], flops: float | None,
           target: float = 0.6):
    curve = [[i * 2 * BATCH, i * 2, i * 1.0, None if i == 0 else 2.0, g] for i, g in enumerate(gold)]
    hit = next((row for row in curve[1:] if row[4] >= target), None)
    rec = record(label, seed, workload="pref", mode="quality", kind="exact" if label == "baseline" else "algorithmic",
                 batch=BATCH, metric="gold_reward", higher=True, curve=curve, target=target,
                 ttt=hit[2] if hit else None, stt=hit[0] if hit else None, budget_samples=SAMPLES)
    q = dataclasses.replace(rec.quality, curve_extra={"proxy_reward": proxy, "kl": kl}, margin=0.02,
                            steps_to_target=hit[1] if hit else None)
    found = {label: {"flops_per_step_est": flops}} if flops is not None else {}
    return dataclasses.replace(rec, quality=q, technique_results=found)


def _records():
    out = []
    for seed in range(3):
        e = 0.01 * seed
        out.append(_trial("baseline", seed, [0.45, 0.45 + e, 0.46, 0.45, 0.46, 0.45 + e],
                          [0.0, 0.0, 0.01, 0.0, 0.01, 0.0], [0, 0.1, 0.2, 0.3, 0.4, 0.5], None))
        # reaches 0.6 at step 4 and keeps rising: the cheapest
        out.append(_trial("grpo", seed, [0.45, 0.55, 0.62 + e, 0.66, 0.7, 0.72 - e],
                          [0.0, 0.5, 0.8, 1.0, 1.1, 1.2], [0, 1, 2, 3, 4, 5], 1e9))
        # reaches 0.6 at step 4 too, at 3x the FLOPs per step, then over-optimises: proxy up, gold down
        out.append(_trial("rloo", seed, [0.45, 0.55, 0.64 + e, 0.58, 0.52, 0.47 + e],
                          [0.0, 0.5, 0.9, 1.4, 1.9, 2.5 + e], [0, 2, 4, 6, 8, 10], 3e9))
        out.append(_trial("best_of_n", seed, [0.61] * 6, [0.9] * 6, [0.636] * 6, 0.0))
        out.append(_trial("dpo", seed, [0.45, 0.47, 0.5, 0.52, 0.55 + e, 0.57], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5],
                          [0, 0.5, 1, 1.5, 2, 2.5], 5e8))
    return out


def test_the_summary_names_the_cheapest_to_target_and_the_over_optimiser(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    for r in _records():
        store.append(r)
    report = build([out])[1]
    text = markdown.render(report)
    summary = text[text.index("## Summary"):text.index("## ", text.index("## Summary") + 5)]
    assert "least compute to reach gold_reward 0.6: grpo (median 4 GFLOP estimated, 3/3 seeds reached it)" in summary
    assert "next rloo (12 GFLOP): grpo needs 0.33x [0.33, 0.33] of its compute, less" in summary
    assert "median run misses the target: " in summary and "dpo" in summary.split("median run misses")[1]
    assert "without training (the cost is at inference, every answer): best_of_n" in summary
    over = summary[summary.index("over-optimised the proxy"):]
    assert over.count("rloo (gold_reward") == 1 and "lower" in over and "higher" in over
    assert "grpo (gold_reward" not in over and "baseline (gold_reward" not in over
    assert "frontier" in report.figures
    assert "figures/frontier.png" in text
