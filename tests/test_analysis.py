"""bench.analyze.analysis on small hand-made schema-2 records, with exact expected values."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from scipy import stats as sps

from bench.analyze import analysis, findings, stats
from bench.records import reader
from bench.records.frame import RECORD_COLUMNS, records_frame
from bench.records.reader import InputError, Source, Sweep
from bench.records.results import ResultStore, TrialRecord
from techniques.base import Claim
from tests.records import calibrated, curve_of, parity, record


def configs_of(records: list[TrialRecord], baseline: str = "baseline"):
    frame = records_frame(records)
    return analysis.configurations(frame, baseline).set_index("technique", drop=False)


def runs(label: str, values: list[float], **kw) -> list[TrialRecord]:
    return [record(label, seed=i, sps=v, **kw) for i, v in enumerate(values)]


# ---- the tidy frame -----------------------------------------------------------------------------------------


def test_records_frame_has_one_row_per_trial_and_none_for_missing_values():
    frame = records_frame([record(sps=100.0, peak=10),
                                    record("bf16+grad_accum:steps=4", status="failed", reason="boom")])
    assert list(frame.columns) == RECORD_COLUMNS
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["workload"] == "mlp:tiny" and first["samples_per_s"] == 100.0 and first["peak_bytes"] == 10
    assert first["components"] == () and first["peak_rss_bytes"] is None and first["key"] == ("", 0, 0)
    assert second["components"] == ("bf16", "grad_accum:steps=4") and second["names"] == ("bf16", "grad_accum")
    assert second["status"] == "failed" and second["reason"] == "boom" and second["samples_per_s"] is None


# ---- speed --------------------------------------------------------------------------------------------------


def test_speedup_is_paired_by_seed_with_a_t_interval():
    records = runs("baseline", [100, 120, 90]) + runs("bf16", [110, 132, 99])  # every pair exactly 1.1x
    c = configs_of(records)
    assert c.loc["baseline", "speedup"] is None and bool(c.loc["baseline", "is_reference"])
    bf = c.loc["bf16"]
    assert bf["speedup"] == pytest.approx(1.1) and bf["speedup_lo"] == pytest.approx(1.1)
    assert bf["speedup_paired"] and bf["speedup_n"] == 3 and bf["speedup_verdict"] == "faster"
    assert bf["sps_median"] == 110 and bf["sps_iqr"] == pytest.approx(16.5)
    # the unpaired Welch interval would not call it: the seeds' spread (90-120) is larger than the effect
    welch = sps.ttest_ind([math.log(v) for v in (110, 132, 99)], [math.log(v) for v in (100, 120, 90)],
                          equal_var=False).confidence_interval(0.95)
    assert welch.low < 0


def test_a_small_change_is_equivalent_and_an_uncertain_one_inconclusive():
    records = runs("baseline", [100, 101, 99]) + runs("bf16", [101, 103, 100])  # +1.3%, the pairs agree
    c = configs_of(records).loc["bf16"]
    assert c["speedup_verdict"] == stats.EQUIVALENT and 0.95 < c["speedup_lo"] and c["speedup_hi"] < 1.05
    records = runs("baseline", [100, 101, 99]) + runs("bf16", [101, 115, 92])  # the pairs disagree
    assert configs_of(records).loc["bf16", "speedup_verdict"] == stats.INCONCLUSIVE


def test_a_set_that_trains_nothing_gets_no_speed_mfu_or_memory_ratio():
    """best_of_n's steps are empty (its cost is at inference): 100x the samples/s of a training set is no speedup."""
    records = (runs("baseline", [100, 120, 90], mfu=0.2, peak=1000)
               + runs("best_of_n", [10_000, 12_000, 9_000], mfu=20.0, peak=100, kind="algorithmic"))
    c = configs_of(records).loc["best_of_n"]
    assert c["speedup"] is None and c["speedup_verdict"] == stats.NONE and "trains nothing" in c["speedup_why"]
    assert c["mem_ratio"] is None and c["mem_ratio_verdict"] == stats.NONE
    assert c["mfu"] is None and c["sps_median"] is None
    assert c["peak_bytes"] == 100  # its own peak is still what it is


def test_the_breakdown_names_what_techniques_hold():
    held = {"reference policy": 400, "reward model": 300}
    bd = {"params": 10, "grads": 0, "optimizer": 0, "activations": 5, "other": 700, "peak_bytes": 715,
          "activation_peak_bytes": 5}
    records = runs("baseline", [100, 100, 100], peak=15,
                   breakdown={**bd, "other": 0, "peak_bytes": 15}) + runs(
        "grpo", [20, 20, 20], peak=715, breakdown={**bd, "held": held}, kind="algorithmic")
    c = configs_of(records)
    assert c.loc["grpo", "mem_held"] == held and c.loc["baseline", "mem_held"] is None
    from bench.report.cells import breakdown_cell

    assert breakdown_cell(c.loc["grpo"]).text.endswith("other holds reference policy 0.4, reward model 0.3")


def test_no_speed_verdict_below_three_repeats():
    records = runs("baseline", [100, 101]) + runs("bf16", [50, 51])
    bf = configs_of(records).loc["bf16"]
    assert bf["speedup"] == pytest.approx(0.5, abs=0.01)
    assert bf["speedup_verdict"] == stats.NONE and bf["speedup_why"] == "2 pairs: a verdict needs 3"


def test_noise_flag_follows_iqr_over_median():
    records = runs("baseline", [100, 101, 99])
    records += [record("bf16", seed=i, sps=v) for i, v in enumerate([700, 850, 900])]
    bf = configs_of(records).loc["bf16"]
    assert bf["sps_rel_iqr"] == pytest.approx(100 / 850) and bool(bf["noisy"]) and bf["n_contended"] == 0


def test_a_window_that_stayed_contended_is_counted_and_kept_out_of_speed():
    records = runs("baseline", [100, 101, 99, 100])
    records += [record("bf16", seed=i, sps=v, contended=i == 1) for i, v in enumerate([200, 50, 201, 199])]
    bf = configs_of(records).loc["bf16"]
    assert bf["n_contended"] == 1 and bf["n_speed"] == 3 and bf["n_ok"] == 4
    assert bf["speedup"] == pytest.approx(2.0, rel=0.01) and bf["speedup_verdict"] == "faster"
    assert bf["sps_median"] == pytest.approx(200)


# ---- memory -------------------------------------------------------------------------------------------------


def test_memory_ratio_uses_tensor_peaks_else_rss_and_ignores_sub_percent_changes():
    records = [record(seed=i, peak=100, rss=1000) for i in range(3)]
    records += [record("bf16", seed=i, peak=50, rss=900) for i in range(3)]
    records += [record("compile", seed=i, peak=None, rss=1100) for i in range(3)]
    records += [record("grad_accum", seed=i, peak=995, rss=1000) for i in range(3)]
    c = configs_of(records)
    assert (c.loc["bf16", "mem_ratio"], c.loc["bf16", "mem_ratio_source"]) == (pytest.approx(0.5), "tensors")
    assert c.loc["bf16", "mem_ratio_verdict"] == "less"
    assert c.loc["compile", "mem_ratio"] == pytest.approx(1.1) and c.loc["compile", "mem_ratio_source"] == "RSS"
    assert c.loc["compile", "mem_ratio_verdict"] == "more"
    assert c.loc["grad_accum", "mem_ratio"] == pytest.approx(9.95)
    records[-3:] = [record("grad_accum", seed=i, peak=100.5, rss=1000) for i in range(3)]
    assert configs_of(records).loc["grad_accum", "mem_ratio_verdict"] == stats.EQUIVALENT  # 0.5% < 1%


# ---- quality at equal samples -------------------------------------------------------------------------------


def test_an_exact_set_with_the_reference_curve_is_same_quality_exact():
    base = [record(seed=i, final=0.8 + i / 100, start=0.1) for i in range(3)]
    same = [record("checkpointing", seed=i, final=0.8 + i / 100, start=0.1) for i in range(3)]
    ck = configs_of(base + same).loc["checkpointing"]
    assert ck["quality_same_exact"] and ck["curve_max_rel_diff"] == 0.0 and ck["curve_pairs"] == 3
    assert ck["curve_points"] == 9  # 3 evaluations (before training and two after) x 3 seeds


def test_an_exact_set_whose_curve_drifts_is_judged_by_its_difference():
    base = [record(seed=i, final=0.8 + i / 100, start=0.1) for i in range(3)]
    drift = [record("compile", seed=i, final=0.8 + i / 100 + 0.02, start=0.1) for i in range(3)]
    c = configs_of(base + drift).loc["compile"]
    assert not c["quality_same_exact"] and c["curve_max_rel_diff"] == pytest.approx(0.02 / 0.7)  # of the range 0.1-0.8
    assert c["delta"] == pytest.approx(0.02) and c["delta_verdict"] == "better"
    assert c["exact_quality"] == "drift changes quality"


@pytest.mark.parametrize(("finals", "parity_result", "expected"), [
    ([0.82, 0.79, 0.81], parity(), "drift"),  # parity ok, no significant difference: rounding amplified
    ([0.82, 0.79, 0.81], parity(loss=0.02, note="expected mismatch: BatchNorm"), "expected mismatch"),
    ([0.82, 0.79, 0.81], parity(loss=0.02, distance=0.1), "bug"),
    ([0.80, 0.81, 0.82], parity(), "identical"),
])
def test_exact_sets_are_classified_by_how_their_quality_compares(finals, parity_result, expected):
    base = [record(seed=i, final=0.8 + i / 100, start=0.1) for i in range(3)]
    mine = [record("compile", seed=i, final=v, start=0.1, parity_result=parity_result) for i, v in enumerate(finals)]
    assert configs_of(base + mine).loc["compile", "exact_quality"] == expected
    assert configs_of(base + mine).loc["baseline", "exact_quality"] is None


def test_quality_difference_is_paired_by_seed_and_respects_the_metric_direction():
    base = [record(seed=i, final=v) for i, v in enumerate([0.80, 0.70, 0.75])]
    better = [record("bf16", seed=i, final=v) for i, v in enumerate([0.81, 0.71, 0.76])]
    c = configs_of(base + better).loc["bf16"]
    assert c["final_mean"] == pytest.approx(0.76) and c["final_std"] == pytest.approx(0.05)
    assert c["delta"] == pytest.approx(0.01) and c["delta_paired"] and c["delta_verdict"] == "better"
    base = [record(seed=i, final=v, higher=False) for i, v in enumerate([0.80, 0.70, 0.75])]
    more = [record("bf16", seed=i, final=v, higher=False) for i, v in enumerate([0.81, 0.71, 0.76])]
    assert configs_of(base + more).loc["bf16", "delta_verdict"] == "worse"


def test_an_exact_set_made_three_times_slower_keeps_its_quality_figures():
    # same curves at equal samples, three times the training clock
    base = [record(seed=i, sps=100, final=0.8, start=0.1, target=0.5, ttt=1.0, train_time=2.0) for i in range(3)]
    slow = [record("sleepy", seed=i, sps=100 / 3, final=0.8, start=0.1, target=0.5, ttt=3.0, train_time=6.0)
            for i in range(3)]
    c = configs_of(base + slow).loc["sleepy"]
    assert c["quality_same_exact"] and c["stt_median"] == configs_of(base + slow).loc["baseline", "stt_median"]
    assert c["ttt_ratio"] == pytest.approx(3.0) and c["ttt_ratio_verdict"] == "later"
    assert c["speedup"] == pytest.approx(1 / 3) and c["speedup_verdict"] == "slower"


def test_runs_cut_by_the_safety_cap_are_never_compared_as_complete():
    base = [record(seed=i, final=0.8) for i in range(3)]
    cut = [record("bf16", seed=i, final=0.5, cut="stopped at step 5 of 10") for i in range(3)]
    c = configs_of(base + cut).loc["bf16"]
    assert c["n_cut"] == 3 and c["n_final"] == 0 and c["delta"] is None and c["final_mean"] is None


def test_metric_at_equal_training_time():
    curve = [[0, 0, 0.0, None, 0.1], [320, 5, 1.0, 2.0, 0.5], [640, 10, 2.0, 1.0, 0.8]]
    assert analysis.metric_at_time(curve, 1.5) == 0.5 and analysis.metric_at_time(curve, 2.0) == 0.8
    assert analysis.metric_at_time(curve, 0.5) == 0.1
    base = [record(seed=i, curve=curve) for i in range(3)]
    slow = [record("curriculum", seed=i, kind="algorithmic",
                   curve=[[0, 0, 0.0, None, 0.1], [320, 5, 2.0, 2.0, 0.6], [640, 10, 4.0, 1.0, 0.85]])
            for i in range(3)]
    c = configs_of(base + slow).loc["curriculum"]
    assert c["equal_time_s"] == 2.0 and c["delta_at_time"] == pytest.approx(0.6 - 0.8)
    assert c["delta"] == pytest.approx(0.05)  # better at equal samples, worse at equal time


# ---- time to target -----------------------------------------------------------------------------------------


def test_time_to_target_is_a_censored_median_with_misses_counted():
    base = [record(seed=i, final=0.8, target=0.5, ttt=4.0) for i in range(3)]
    bf = [record("bf16", seed=0, final=0.8, target=0.5, ttt=2.0), record("bf16", seed=1, final=0.8, target=0.5,
                                                                        ttt=3.0),
          record("bf16", seed=2, final=0.4, target=0.5, ttt=None)]
    c = configs_of(base + bf).loc["bf16"]
    assert c["ttt_median"] == 3.0 and c["ttt_miss_rate"] == pytest.approx(1 / 3) and c["n_ttt"] == 3
    assert c["ttt_ratio"] is None and "misses on one side" in c["ttt_ratio_why"]
    bf[1] = record("bf16", seed=1, final=0.4, target=0.5, ttt=None)
    assert configs_of(base + bf).loc["bf16", "ttt_median"] == math.inf  # two of three missed: the median missed


def test_time_to_target_ratio_when_nobody_missed():
    base = [record(seed=i, final=0.8, target=0.5, ttt=v) for i, v in enumerate([4.0, 4.4, 3.6])]
    fast = [record("compile", seed=i, final=0.8, target=0.5, ttt=v / 2) for i, v in enumerate([4.0, 4.4, 3.6])]
    c = configs_of(base + fast).loc["compile"]
    assert c["ttt_ratio"] == pytest.approx(0.5) and c["ttt_ratio_verdict"] == "sooner"


# ---- status, parity, reference ------------------------------------------------------------------------------


def test_status_counts_failures_and_skips_with_reasons():
    records = [record(seed=i) for i in range(3)]
    records += [record("bf16", seed=0), record("bf16", seed=1),
                record("bf16", seed=2, status="oom", reason="out of memory")]
    records += [record("checkpointing", status="skipped", reason="no blocks", position=9)]
    c = configs_of(records)
    assert c.loc["bf16", "status"] == "2/3 ok, 1 oom" and c.loc["bf16", "problems"] == ["oom: out of memory"]
    assert c.loc["checkpointing", "status"] == "0/1 ok, 1 skipped"
    assert c.loc["checkpointing", "skip_reason"] == "no blocks" and c.loc["checkpointing", "speedup"] is None
    assert list(c["technique"]) == ["baseline", "bf16", "checkpointing"]  # reference first, then run order


def test_parity_is_ok_only_when_every_trial_matched():
    records = [record(seed=0), record("grad_accum", seed=0, parity_result=parity(loss=1e-7)),
               record("grad_accum", seed=1, parity_result=parity(loss=2e-2, distance=0.1))]
    ga = configs_of(records).loc["grad_accum"]
    assert ga["parity_ok"] is False and ga["parity_loss_diff"] == 2e-2 and ga["parity_distance_diff"] == 0.1
    assert ga["parity_loss_tol"] == 1e-3


def test_a_set_s_parity_is_its_worst_trial_s_answer_with_that_trial_s_calibration():
    records = [record(seed=0), record("bf16", seed=0, parity_result=calibrated(loss=0.1, harmless=0.03)),
               record("bf16", seed=1, parity_result=calibrated(loss=0.3, harmless=0.08, bug=(0.3, 0.01))),
               record("bf16", seed=2, parity_result=calibrated(loss=1e-3))]
    frame = records_frame(records)
    assert list(frame["parity_answer"]) == [None, "ok", "inconclusive", "ok"]
    assert list(frame["parity_ok"]) == [None, True, None, True]  # inconclusive is neither a match nor a mismatch
    bf = configs_of(records).loc["bf16"]
    assert bf["parity_answer"] == "inconclusive" and bf["parity_ok"] is None
    assert bf["parity_answers"] == {"inconclusive": 1, "ok": 2}
    assert (bf["parity_loss_diff"], bf["parity_loss_tol"]) == (0.3, pytest.approx(0.4))  # the deciding trial's
    assert (bf["parity_harmless_drift"], bf["parity_bug_loss_drift"], bf["parity_k_tol"]) == (0.08, 0.3, 5.0)
    assert "parity" not in {f.topic for f in findings.diagnose(configs_of(records).reset_index(drop=True))}
    records.append(record("bf16", seed=3, parity_result=calibrated(loss=0.2, harmless=0.01)))
    bf = configs_of(records).loc["bf16"]
    assert bf["parity_answer"] == "mismatch" and bf["parity_ok"] is False and bf["parity_loss_diff"] == 0.2


def test_records_before_calibration_keep_their_fixed_tolerance_answer():
    records = [record(seed=0), record("bf16", seed=0, parity_result=parity("numeric", loss=0.06, tol=(5e-2, 2e-2)))]
    row = records_frame(records).iloc[1]
    assert row["parity_answer"] == "mismatch" and row["parity_ok"] is False and row["parity_harmless_drift"] is None


def test_another_reference_set_can_be_chosen():
    records = runs("baseline", [100, 100, 100]) + runs("bf16", [200, 200, 200])
    c = configs_of(records, baseline="bf16")
    assert list(c["technique"]) == ["bf16", "baseline"] and c.loc["baseline", "speedup"] == pytest.approx(0.5)


# ---- machines -----------------------------------------------------------------------------------------------


def _sweep(*parts: tuple[str, dict, list[TrialRecord]]) -> Sweep:
    sources = [Source(path=__import__("pathlib").Path(name), records=recs, env=env,
                      machine=reader.machine_label(env, "cpu")) for name, env, recs in parts]
    return Sweep(sources, {s.machine: s.env for s in sources})


def test_machines_are_kept_apart():
    env_a = {"hostname": "a", "cpu_model": "Xeon", "cpu_logical": 2, "torch": "2.13.0"}
    env_b = {"hostname": "b", "cpu_model": "EPYC", "cpu_logical": 4, "torch": "2.13.0"}
    a = runs("baseline", [100, 100]) + runs("bf16", [200, 200])
    b = runs("baseline", [400, 400]) + runs("bf16", [300, 300])
    result = analysis.analyze(_sweep(("A", env_a, a), ("B", env_b, b)))
    assert result.machines == ["cpu, Xeon (2 cores), host a, torch 2.13.0", "cpu, EPYC (4 cores), host b, torch 2.13.0"]
    speedups = [s for s in result.configs["speedup"] if s is not None]
    assert speedups == [pytest.approx(2.0), pytest.approx(0.75)]  # never 200 / 400
    assert reader.machine_label({}, "cuda") == "cuda, unknown machine (no env.json)"


def test_load_reads_records_env_and_settings(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(record())
    (tmp_path / "env.json").write_text(json.dumps({"hostname": "h", "cpu_model": "C", "torch": "2"}))
    (tmp_path / "sweep.toml").write_text("repeats = 3\n[budget]\nmin_steps = 5\n")
    sweep = reader.load([tmp_path])
    assert len(sweep.records) == 1 and sweep.sources[0].settings == {"repeats": 3, "budget": {"min_steps": 5}}
    assert list(sweep.machines) == ["cpu, C, host h, torch 2"]
    with pytest.raises(InputError, match="has no results.jsonl"):
        reader.load([tmp_path / "missing"])
    with pytest.raises(InputError, match=r"reference technique set 'nope' is not in these records \(sets here: "
                                         r"baseline\)"):
        analysis.analyze(sweep, baseline="nope")


# ---- combined techniques ------------------------------------------------------------------------------------


def test_interactions_are_one_paired_contrast_per_seed():
    records = runs("baseline", [100, 110, 90])
    records += runs("a", [200, 220, 180])  # 2.0x
    records += runs("b", [150, 165, 135])  # 1.5x
    records += runs("a+b", [300, 330, 270])  # 3.0x: multiply
    records += runs("a+c", [120, 130, 110])  # c never ran alone
    configs = configs_of(records).reset_index(drop=True)
    inter = analysis.interactions(records_frame(records), configs).set_index("technique")
    ab = inter.loc["a+b"]
    assert ab["parts"] == [pytest.approx(2.0), pytest.approx(1.5)] and ab["product"] == pytest.approx(3.0)
    assert ab["ratio"] == pytest.approx(1.0) and ab["verdict"] == analysis.MULTIPLY
    assert inter.loc["a+c", "verdict"] == stats.NONE and inter.loc["a+c", "why"] == "c has no speedup measured"
    records[9:12] = runs("a+b", [200, 221, 179])  # about 2.0x < 3.0x in every seed
    configs = configs_of(records).reset_index(drop=True)
    inter = analysis.interactions(records_frame(records), configs).set_index("technique")
    assert inter.loc["a+b", "verdict"] == "gains partly cancel"
    assert inter.loc["a+b", "ratio"] == pytest.approx(2 / 3, rel=0.01)


# ---- claims check -------------------------------------------------------------------------------------------

ENV = {"cpu_model": "EPYC", "cpu_flags": {"avx512_bf16": False, "amx_bf16": False},
       "peak_flops": {"float32": {"flops": 1e11}, "bfloat16": {"flops": 5e9}}}
CLAIMS = {"bf16": (Claim("speedup", 1.5, 2.0, "NVIDIA A100", "a paper"),)}


def _claims(values: list[float], mfu: float = 0.5):
    records = runs("baseline", [100, 101, 99], mfu=mfu) + runs("bf16", values, dtype="bfloat16")
    configs = analysis.configurations(records_frame(records))
    configs["machine"] = "cpu, EPYC (2 cores)"
    return findings.claims_check(configs, {"cpu, EPYC (2 cores)": ENV}, CLAIMS).iloc[0]


def test_a_claim_met_is_within():
    row = _claims([180, 182, 178])
    assert (row["verdict"], row["why"]) == ("within", [])
    assert row["measured"] == pytest.approx(1.8, rel=1e-4) and (row["low"], row["high"]) == (1.5, 2.0)  # geometric mean


def test_a_claim_missed_says_why_this_hardware_differs():
    row = _claims([110, 112, 108], mfu=0.01)
    assert row["verdict"] == "below"
    assert row["why"] == [
        "bfloat16 matmul peaks at 5 GFLOP/s here vs 100 for float32 (0.05x): no fast bfloat16 matmul units "
        "(no avx512_bf16 / amx_bf16)",
        "the claim comes from GPUs; this ran on a CPU (EPYC)",
        "the reference reaches 1.0% MFU: a model this small is bound by per-op overhead, so faster arithmetic "
        "helps less",
    ]


def test_a_claim_missed_inside_the_noise_is_inconclusive():
    row = _claims([100, 160, 140])
    assert row["verdict"] == "inconclusive" and row["why_not"].startswith("the estimate lies below the claimed range")


def test_a_claim_needs_three_repeats_like_every_verdict():
    records = runs("baseline", [100, 101], mfu=0.5) + runs("bf16", [180, 181], dtype="bfloat16")
    configs = analysis.configurations(records_frame(records))
    row = findings.claims_check(configs, {}, CLAIMS).iloc[0]
    assert row["verdict"] == stats.NONE and "a verdict needs 3" in row["why_not"]


# ---- diagnosis ----------------------------------------------------------------------------------------------


def test_diagnosis_finds_one_off_costs_slowdowns_data_wait_and_memory_categories():
    bd = {"params": 10, "grads": 10, "optimizer": 20, "activations": 60, "other": 0}
    records = [record(seed=i, sps=100, one_off=0.01, step=0.1, data_wait=0.3, mfu=0.01, peak=100, breakdown=bd,
                      final=0.8, train_time=15.0) for i in range(3)]
    records += [record("compile", seed=i, sps=111, one_off=5.0, step=0.09, data_wait=0.3, final=0.8,
                       train_time=13.5) for i in range(3)]
    records += [record("grad_accum", seed=i, sps=v, step=0.14, data_wait=0.1, peak=50, final=0.8, train_time=21.0)
                for i, v in enumerate([70, 71, 69])]
    found = findings.diagnose(configs_of(records).reset_index(drop=True))
    texts = {(f.topic, f.technique): f.text for f in found}
    assert texts[("data", None)] == (
        "mlp:tiny waits for data 30% of the timed window (baseline, compile): the input pipeline limits throughput; "
        "try loader:workers=2 (a DataLoader with worker processes), or cache the transformed batches, before tuning "
        "the model")
    assert ("overhead", None) not in texts  # its 1% MFU is the data wait's, which the data finding names
    assert texts[("memory", None)].startswith("activations are 60% of mlp:tiny's tensor peak")
    assert texts[("one-off", "compile")] == (
        "compile costs 5.0 s once on mlp:tiny (its first step beyond a steady one), more than the 1.50 s it saves "
        "over the quality budget (13.50 vs 15.00 s): it pays off only for runs about 4x longer")
    assert texts[("slower", "grad_accum")] == (
        "grad_accum is 30% slower than baseline on mlp:tiny (0.70x); it cuts peak memory to 0.50x (tensors), so "
        "use it only when memory is the limit")
    assert ("noise", None) not in texts


def test_diagnosis_flags_parity_quality_and_noise():
    bad = parity(loss=0.02, distance=0.1)
    records = [record(seed=i, sps=100, final=0.8 + i / 100) for i in range(3)]
    records += [record("x", seed=i, sps=v, final=0.6 + i / 100, parity_result=bad, kind="numeric")
                for i, v in enumerate([70, 100, 130])]
    texts = {f.topic: f.text for f in findings.diagnose(configs_of(records).reset_index(drop=True))}
    assert texts["parity"] == (
        "x on mlp:tiny: its first steps differ from the fp32 reference (losses by 0.02, parameter distance by 0.1; "
        "tolerances for exact sets 1e-03 and 1e-03): it does not compute the same thing here; check it "
        "before trusting its speed")
    assert texts["quality"] == ("x changes acc on mlp:tiny by -0.2 [-0.2, -0.2] at equal samples: check its "
                                "numerics before adopting it")
    assert texts["noise"].startswith("timings are noisy for 1 of 2 configurations")


def test_curve_of_builds_a_monotone_curve():
    curve = curve_of(0.8, 0.1, 640, 64, 2.0)
    assert curve[0] == [0, 0, 0.0, None, 0.1] and curve[-1][:3] == [640, 10, 2.0] and curve[-1][-1] == 0.8


def test_a_data_wait_finding_does_not_suggest_a_loader_this_sweep_measured_slower():
    records = [record(seed=i, sps=100, data_wait=0.6) for i in range(3)]
    records += [record("loader:workers=2", seed=i, sps=v, data_wait=0.12) for i, v in enumerate([74, 75, 73])]
    texts = [f.text for f in findings.diagnose(configs_of(records).reset_index(drop=True)) if f.topic == "data"]
    assert len(texts) == 1 and "worker processes did not pay here (loader:workers=2 0.74x" in texts[0]
    assert "try loader:workers=2" not in texts[0]
    slowdown = [f.text for f in findings.diagnose(configs_of(records).reset_index(drop=True)) if f.topic == "slower"]
    assert slowdown and "cuts peak memory" not in slowdown[0]


def test_low_mfu_is_called_per_op_overhead_only_when_the_step_does_not_wait_for_data():
    fed = [record(seed=i, sps=100, mfu=0.01, data_wait=0.01) for i in range(3)]
    starved = [record(seed=i, sps=100, mfu=0.01, data_wait=0.5) for i in range(3)]
    topics = [{f.topic for f in findings.diagnose(configs_of(r).reset_index(drop=True))} for r in (fed, starved)]
    assert "overhead" in topics[0] and "overhead" not in topics[1] and "data" in topics[1]


def test_holm_turns_a_chance_better_among_many_null_quality_comparisons_into_inconclusive():
    base = [record(seed=i, final=v) for i, v in enumerate([0.800, 0.810, 0.790])]
    lucky = [record("lucky", seed=i, kind="numeric", final=v) for i, v in enumerate([0.806, 0.817, 0.795])]
    nulls = [record(f"null{k}", seed=i, kind="numeric", final=v + (0.002 if (k + i) % 2 else -0.002))
             for k in range(29) for i, v in enumerate([0.800, 0.810, 0.790])]
    alone = analysis.configurations(records_frame(base + lucky)).set_index("technique").loc["lucky"]
    assert alone["delta_verdict"] == "better"  # +0.006 in every seed, with no margin: a change
    many = analysis.configurations(records_frame(base + lucky + nulls)).set_index("technique")
    c = many.loc["lucky"]
    assert c["delta_verdict"] == stats.INCONCLUSIVE and c["delta_holm_dropped"]
    assert "not after Holm's correction over the 30 comparisons" in c["delta_why"]
    assert many.loc["baseline", "delta_family"] == 30


def test_a_baseline_that_does_not_reproduce_its_reference_is_a_finding_that_says_where_it_parts():
    """The reference set failing its own parity makes every equal-samples comparison on the workload suspect; a
    first loss (before any update) that differs points at the build (an RNG draw in some processes only, as a
    per-process cached probe makes), equal first losses at the training steps."""
    apart = dataclasses.replace(parity(loss=0.06, distance=0.02), losses=[2.1] + [2.0] * 7)
    records = [record(seed=i, sps=100, final=0.8, parity_result=apart if i else parity()) for i in range(3)]
    configs = configs_of(records).reset_index(drop=True)
    assert configs.loc[0, "parity_start_diff"] == pytest.approx(0.05)
    text = {f.topic: f.text for f in findings.diagnose(configs)}["parity"]
    assert text.startswith("baseline on mlp:tiny does not reproduce its own eager fp32 reference (same seed, a fresh "
                           "process): losses differ by 0.06, already at the first loss, before any update (0.05)")
    later = [record(seed=i, sps=100, final=0.8, parity_result=parity(loss=0.06, distance=0.02)) for i in range(3)]
    text = {f.topic: f.text for f in findings.diagnose(configs_of(later).reset_index(drop=True))}["parity"]
    assert "after equal first losses: its training steps are not deterministic" in text
    clean = [record(seed=i, sps=100, final=0.8, parity_result=parity()) for i in range(3)]
    assert "parity" not in {f.topic for f in findings.diagnose(configs_of(clean).reset_index(drop=True))}
