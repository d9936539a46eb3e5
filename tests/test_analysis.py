"""bench.analysis on small hand-made records, with exact expected values (fixed bootstrap seed)."""

from __future__ import annotations

import json

import pytest

from bench import analysis
from bench.analysis import InputError, Source, Sweep
from bench.results import ResultStore, TrialRecord
from techniques.base import Claim


def rec(label: str = "baseline", seed: int = 0, sps: float | None = 100.0, *, workload: str = "mlp",
        status: str = "ok", reason: str | None = None, final: float | None = None, higher: bool = True,
        peak: int | None = None, rss: int | None = None, ttt: float | None = None, target: float | None = None,
        first: float | None = None, step: float | None = None, steps: int | None = None,
        data_wait: float | None = None, contended: bool = False, mfu: float | None = None, dtype: str = "float32",
        parity: dict | None = None, breakdown: dict | None = None, cut: str | None = None) -> TrialRecord:
    """One record with only the fields a test sets; the rest empty, as a real record of that status would be."""
    techs = [] if label == "baseline" else [{"name": p.split(":")[0], "options": {}} for p in label.split("+")]
    base = dict(sweep_id="s", trial_id=f"{workload}:tiny/{label}/seed{seed}/r{seed}",
                workload={"name": workload, "size": "tiny", "metric": "acc", "higher_is_better": higher},
                techniques=techs, technique_label=label, seed=seed, repeat=seed, world_size=1, device="cpu",
                status=status, reason=reason)
    if status != "ok":
        return TrialRecord(**base)
    return TrialRecord(
        **base,
        timing={"samples_per_s": sps, "first_step_s": first, "step_time_s": {"median": step},
                "data_wait_frac": data_wait, "contended": contended},
        memory={"peak_bytes": peak, "peak_rss_bytes": rss, "breakdown": breakdown},
        compute={"mfu": mfu, "compute_dtype": dtype},
        accuracy={"metric": "acc", "higher_is_better": higher, "final": final, "time_to_target_s": ttt,
                  "target": target, "steps_trained": steps, "budget_cut": cut},
        parity=parity or {},
    )


def configs_of(records: list[TrialRecord], baseline: str = "baseline"):
    frame = analysis.records_frame(records)
    return analysis.configurations(frame, baseline).set_index("technique", drop=False)


# ---- the tidy frame -----------------------------------------------------------------------------------------


def test_records_frame_has_one_row_per_trial_and_none_for_missing_values():
    frame = analysis.records_frame([rec(sps=100.0, peak=10), rec("bf16+grad_accum:steps=4", status="failed",
                                                                  reason="boom")])
    assert list(frame.columns) == analysis.RECORD_COLUMNS
    assert len(frame) == 2
    first, second = frame.iloc[0], frame.iloc[1]
    assert first["workload"] == "mlp:tiny" and first["samples_per_s"] == 100.0 and first["peak_bytes"] == 10
    assert first["components"] == () and first["peak_rss_bytes"] is None
    assert second["components"] == ("bf16", "grad_accum:steps=4") and second["names"] == ("bf16", "grad_accum")
    assert second["status"] == "failed" and second["reason"] == "boom" and second["samples_per_s"] is None


# ---- per-configuration aggregates ---------------------------------------------------------------------------


def test_speedup_is_a_ratio_of_medians_with_a_bootstrap_interval():
    records = [rec(seed=i, sps=v) for i, v in enumerate([100, 101, 99])]
    records += [rec("bf16", seed=i, sps=v) for i, v in enumerate([110, 112, 108])]
    c = configs_of(records)
    assert c.loc["baseline", "speedup"] is None and bool(c.loc["baseline", "is_reference"])
    bf = c.loc["bf16"]
    assert bf["speedup"] == pytest.approx(1.1)
    # 3 x 3 values: percentile-bootstrap bounds of a ratio of medians are ratios of observed values
    assert bf["speedup_lo"] == pytest.approx(108 / 101) and bf["speedup_hi"] == pytest.approx(112 / 99)
    assert bf["speedup_verdict"] == "faster"
    assert bf["sps_median"] == 110 and bf["sps_iqr"] == 2.0 and bf["sps_rel_iqr"] == pytest.approx(2 / 110)
    assert not bf["noisy"] and bf["status"] == "3/3 ok"


def test_a_ratio_whose_interval_contains_one_is_no_significant_difference():
    records = [rec(seed=i, sps=v) for i, v in enumerate([100, 101, 99])]
    records += [rec("bf16", seed=i, sps=v) for i, v in enumerate([99, 102, 100])]
    assert configs_of(records).loc["bf16", "speedup_verdict"] == "no significant difference"


def test_noise_flag_follows_iqr_over_median_and_contention_is_counted():
    records = [rec(seed=i, sps=v) for i, v in enumerate([100, 101, 99])]
    records += [rec("bf16", seed=i, sps=v, contended=i == 1) for i, v in enumerate([700, 850, 900])]
    bf = configs_of(records).loc["bf16"]
    assert bf["sps_rel_iqr"] == pytest.approx(100 / 850) and bool(bf["noisy"]) and bf["n_contended"] == 1


def test_memory_ratio_uses_tensor_peaks_else_rss_and_ignores_sub_percent_changes():
    records = [rec(seed=i, peak=100, rss=1000) for i in range(3)]
    records += [rec("bf16", seed=i, peak=50, rss=900) for i in range(3)]
    records += [rec("compile", seed=i, peak=None, rss=1100) for i in range(3)]
    records += [rec("grad_accum", seed=i, peak=995, rss=1000) for i in range(3)]
    c = configs_of(records)
    assert (c.loc["bf16", "mem_ratio"], c.loc["bf16", "mem_ratio_source"]) == (0.5, "tensors")
    assert c.loc["bf16", "mem_ratio_lo"] == c.loc["bf16", "mem_ratio_hi"] == 0.5
    assert c.loc["bf16", "mem_ratio_verdict"] == "less"
    assert c.loc["compile", "mem_ratio"] == pytest.approx(1.1) and c.loc["compile", "mem_ratio_source"] == "RSS"
    assert c.loc["compile", "mem_ratio_verdict"] == "more"
    assert c.loc["grad_accum", "mem_ratio"] == pytest.approx(9.95)  # against the tensor peak of 100
    records[-3:] = [rec("grad_accum", seed=i, peak=99.5, rss=1000) for i in range(3)]
    assert configs_of(records).loc["grad_accum", "mem_ratio_verdict"] == "no significant difference"


def test_final_metric_mean_std_and_difference_respect_the_metric_direction():
    ref = [rec(seed=i, final=v) for i, v in enumerate([0.8, 0.8, 0.81])]
    better = [rec("bf16", seed=i, final=v) for i, v in enumerate([0.9, 0.91, 0.92])]
    c = configs_of(ref + better).loc["bf16"]
    assert c["final_mean"] == pytest.approx(0.91) and c["final_std"] == pytest.approx(0.01)
    assert c["delta"] == pytest.approx(0.91 - 0.81 / 3 - 1.6 / 3)
    assert c["delta_lo"] > 0 and c["delta_verdict"] == "better"
    # the same numbers for a loss (lower is better) are worse
    ref = [rec(seed=i, final=v, higher=False) for i, v in enumerate([0.8, 0.8, 0.81])]
    more = [rec("bf16", seed=i, final=v, higher=False) for i, v in enumerate([0.9, 0.91, 0.92])]
    assert configs_of(ref + more).loc["bf16", "delta_verdict"] == "worse"


def test_time_to_target_counts_trials_that_reached_it_and_compares_medians():
    records = [rec(seed=i, ttt=4.0, target=0.5) for i in range(3)]
    records += [rec("bf16", seed=0, ttt=2.0, target=0.5), rec("bf16", seed=1, ttt=2.0, target=0.5),
                rec("bf16", seed=2, ttt=None, target=0.5)]
    bf = configs_of(records).loc["bf16"]
    assert (bf["n_reached"], bf["ttt_median"], bf["target"]) == (2, 2.0, 0.5)
    assert bf["ttt_speedup"] == 2.0 and bf["ttt_speedup_verdict"] == "sooner"


def test_status_counts_failures_and_skips_with_reasons():
    records = [rec(seed=i) for i in range(3)]
    records += [rec("bf16", seed=0), rec("bf16", seed=1), rec("bf16", seed=2, status="oom", reason="out of memory")]
    records += [rec("checkpointing", status="skipped", reason="no blocks")]
    c = configs_of(records)
    assert c.loc["bf16", "status"] == "2/3 ok, 1 oom" and c.loc["bf16", "problems"] == ["oom: out of memory"]
    assert c.loc["bf16", "n_ok"] == 2
    assert c.loc["checkpointing", "status"] == "0/1 ok, 1 skipped"
    assert c.loc["checkpointing", "skip_reason"] == "no blocks" and c.loc["checkpointing", "speedup"] is None
    assert list(c["technique"]) == ["baseline", "bf16", "checkpointing"]  # reference first, then run order


def test_parity_is_ok_only_when_every_trial_matched():
    good = {"kind": "exact", "ok": True, "max_rel_loss_diff": 1e-7, "tolerance": 1e-3}
    bad = {"kind": "exact", "ok": False, "max_rel_loss_diff": 2e-2, "tolerance": 1e-3}
    records = [rec(seed=0), rec("grad_accum", seed=0, parity=good), rec("grad_accum", seed=1, parity=bad)]
    ga = configs_of(records).loc["grad_accum"]
    assert ga["parity_ok"] is False and ga["parity_diff"] == 2e-2 and ga["parity_tol"] == 1e-3


def test_another_reference_set_can_be_chosen():
    records = [rec(seed=i, sps=100) for i in range(2)] + [rec("bf16", seed=i, sps=200) for i in range(2)]
    c = configs_of(records, baseline="bf16")
    assert list(c["technique"]) == ["bf16", "baseline"] and c.loc["baseline", "speedup"] == 0.5


# ---- machines -----------------------------------------------------------------------------------------------


def _sweep(*parts: tuple[str, dict, list[TrialRecord]]) -> Sweep:
    sources = [Source(path=__import__("pathlib").Path(name), records=recs, env=env,
                      machine=analysis.machine_label(env, "cpu")) for name, env, recs in parts]
    return Sweep(sources, {s.machine: s.env for s in sources})


def test_machines_are_kept_apart():
    env_a = {"hostname": "a", "cpu_model": "Xeon", "cpu_logical": 2, "torch": "2.13.0"}
    env_b = {"hostname": "b", "cpu_model": "EPYC", "cpu_logical": 4, "torch": "2.13.0"}
    a = [rec(seed=i, sps=100) for i in range(2)] + [rec("bf16", seed=i, sps=200) for i in range(2)]
    b = [rec(seed=i, sps=400) for i in range(2)] + [rec("bf16", seed=i, sps=300) for i in range(2)]
    result = analysis.analyze(_sweep(("A", env_a, a), ("B", env_b, b)))
    assert result.machines == ["cpu, Xeon (2 cores), host a, torch 2.13.0", "cpu, EPYC (4 cores), host b, torch 2.13.0"]
    speedups = [s for s in result.configs["speedup"] if s is not None]
    assert speedups == [2.0, 0.75]  # never 200 / 400
    assert analysis.machine_label({}, "cuda") == "cuda, unknown machine (no env.json)"


def test_load_reads_records_env_and_settings(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(rec())
    (tmp_path / "env.json").write_text(json.dumps({"hostname": "h", "cpu_model": "C", "torch": "2"}))
    (tmp_path / "sweep.toml").write_text("repeats = 3\n[budget]\nmin_steps = 5\n")
    sweep = analysis.load([tmp_path])
    assert len(sweep.records) == 1 and sweep.sources[0].settings == {"repeats": 3, "budget": {"min_steps": 5}}
    assert list(sweep.machines) == ["cpu, C, host h, torch 2"]
    with pytest.raises(InputError, match="has no results.jsonl"):
        analysis.load([tmp_path / "missing"])
    with pytest.raises(InputError, match=r"reference technique set 'nope' is not in these records \(sets here: "
                                         r"baseline\)"):
        analysis.analyze(sweep, baseline="nope")


# ---- combined techniques ------------------------------------------------------------------------------------


def test_interactions_compare_observed_with_the_product_of_parts():
    records = [rec(seed=i, sps=v) for i, v in enumerate([100, 101, 99])]
    records += [rec("a", seed=i, sps=v) for i, v in enumerate([200, 202, 198])]  # 2.0x
    records += [rec("b", seed=i, sps=v) for i, v in enumerate([150, 151, 149])]  # 1.5x
    records += [rec("a+b", seed=i, sps=v) for i, v in enumerate([300, 303, 297])]  # 3.0x: multiply
    records += [rec("a+c", seed=i, sps=v) for i, v in enumerate([120, 121, 119])]  # c never ran alone
    inter = analysis.interactions(configs_of(records).reset_index(drop=True)).set_index("technique")
    ab = inter.loc["a+b"]
    assert ab["parts"] == [2.0, 1.5] and ab["product"] == 3.0 and ab["observed"] == 3.0
    assert ab["ratio"] == 1.0 and ab["verdict"] == "gains multiply"
    assert inter.loc["a+c", "verdict"] == "cannot tell: c has no speedup measured"
    records[-6:-3] = [rec("a+b", seed=i, sps=v) for i, v in enumerate([200, 202, 198])]  # 2.0x < 3.0x
    inter = analysis.interactions(configs_of(records).reset_index(drop=True)).set_index("technique")
    assert inter.loc["a+b", "verdict"] == "gains partly cancel"
    assert inter.loc["a+b", "ratio"] == pytest.approx(2 / 3)


# ---- claims check -------------------------------------------------------------------------------------------

ENV = {"cpu_model": "EPYC", "cpu_flags": {"avx512_bf16": False, "amx_bf16": False},
       "peak_flops": {"float32": {"flops": 1e11}, "bfloat16": {"flops": 5e9}}}
CLAIMS = {"bf16": (Claim("speedup", 1.5, 2.0, "NVIDIA A100", "a paper"),)}


def _claims(values: list[float], mfu: float = 0.5):
    records = [rec(seed=i, sps=v, mfu=mfu) for i, v in enumerate([100, 101, 99])]
    records += [rec("bf16", seed=i, sps=v, dtype="bfloat16") for i, v in enumerate(values)]
    configs = analysis.configurations(analysis.records_frame(records))
    configs["machine"] = "cpu, EPYC (2 cores)"
    return analysis.claims_check(configs, {"cpu, EPYC (2 cores)": ENV}, CLAIMS).iloc[0]


def test_a_claim_met_is_within():
    row = _claims([180, 182, 178])
    assert (row["verdict"], row["certain"], row["why"]) == ("within", True, [])
    assert row["measured"] == pytest.approx(1.8) and (row["low"], row["high"]) == (1.5, 2.0)


def test_a_claim_missed_says_why_this_hardware_differs():
    row = _claims([110, 112, 108], mfu=0.01)
    assert row["verdict"] == "below" and row["certain"] is True
    assert row["why"] == [
        "bfloat16 matmul peaks at 5 GFLOP/s here vs 100 for float32 (0.05x): no fast bfloat16 matmul units "
        "(no avx512_bf16 / amx_bf16)",
        "the claim comes from GPUs; this ran on a CPU (EPYC)",
        "the reference reaches 1.0% MFU: a model this small is bound by per-op overhead, so faster arithmetic "
        "helps less",
    ]


def test_a_claim_missed_inside_the_noise_is_not_certain():
    row = _claims([100, 160, 140])
    assert row["verdict"] == "below" and row["certain"] is False


# ---- diagnosis ----------------------------------------------------------------------------------------------


def test_diagnosis_finds_one_off_costs_slowdowns_data_wait_and_memory_categories():
    bd = {"params": 10, "grads": 10, "optimizer": 20, "activations": 60, "other": 0}
    records = [rec(seed=i, sps=100, first=0.1, step=0.1, steps=150, data_wait=0.3, mfu=0.01, peak=100,
                   breakdown=bd) for i in range(3)]
    records += [rec("compile", seed=i, sps=111, first=5.1, step=0.09, steps=150, data_wait=0.3) for i in range(3)]
    records += [rec("grad_accum", seed=i, sps=v, first=0.1, step=0.14, steps=150, data_wait=0.1, peak=50)
                for i, v in enumerate([70, 71, 69])]
    found = analysis.diagnose(configs_of(records).reset_index(drop=True))
    texts = {(f.topic, f.technique): f.text for f in found}
    assert texts[("data", None)] == (
        "mlp:tiny waits for data 30% of the timed window (baseline, compile): the input pipeline limits throughput; "
        "prefetch or cache batches before tuning the model")
    assert texts[("overhead", None)].startswith("mlp:tiny reaches 1.0% MFU at baseline")
    assert texts[("memory", None)].startswith("activations are 60% of mlp:tiny's tensor peak")
    assert texts[("compile", "compile")] == (
        "compile's first step on mlp:tiny takes 5.0 s longer than baseline's, more than the 1.5 s it saves over "
        "the 150 steps trained here; it pays off after about 500 steps")
    assert texts[("slower", "grad_accum")] == (
        "grad_accum is 30% slower than baseline on mlp:tiny (0.70x); it cuts peak memory to 0.50x (tensors), so "
        "use it only when memory is the limit")
    assert ("noise", None) not in texts


def test_diagnosis_flags_parity_accuracy_and_noise():
    bad = {"kind": "exact", "ok": False, "max_rel_loss_diff": 0.02, "tolerance": 1e-3}
    records = [rec(seed=i, sps=100, final=0.8 + i / 100) for i in range(3)]
    records += [rec("x", seed=i, sps=v, final=0.6 + i / 100, parity=bad) for i, v in enumerate([70, 100, 130])]
    texts = {f.topic: f.text for f in analysis.diagnose(configs_of(records).reset_index(drop=True))}
    assert texts["parity"] == ("x on mlp:tiny: the first losses differ from the fp32 reference by 0.02 (tolerance "
                               "1e-03): it does not compute the same thing here; check it before trusting its speed")
    # percentile bounds of a difference of means over 3 x 3 values: (0.6 + 0.6 + 0.61) / 3 - (0.82 + 0.82 + 0.81) / 3
    assert texts["accuracy"] == ("x changes acc on mlp:tiny by -0.2 [-0.2133, -0.1867]: check its numerics before "
                                 "adopting it")
    assert texts["noise"].startswith("timings are noisy for 1 of 2 configurations")


def test_a_worse_metric_after_fewer_steps_is_blamed_on_time_not_numerics():
    exact = {"kind": "exact", "ok": True, "max_rel_loss_diff": 0.0, "tolerance": 1e-3}
    records = [rec("baseline", s, 100.0 + s, final=0.9 + s / 100, steps=150) for s in range(3)]
    records += [rec("zero3", s, 40.0 + s, final=0.7 + s / 100, steps=60, cut="max_train_seconds", parity=exact)
                for s in range(3)]
    records += [rec("bf16", s, 40.0 + s, final=0.7 + s / 100, steps=60, cut="max_train_seconds",
                    parity={**exact, "kind": "numeric"}) for s in range(3)]
    records += [rec("fp16", s, 99.0 + s, final=0.7 + s / 100, steps=150, parity=exact) for s in range(3)]
    configs = configs_of(records)
    text = {f.technique: f.text for f in analysis.diagnose(configs) if f.topic == "accuracy"}
    assert "trained 60 of the reference's 150 steps" in text["zero3"] and "not numerics" in text["zero3"]
    assert "compare at equal steps" in text["bf16"] and "not numerics" not in text["bf16"]
    assert text["fp16"].endswith("check its numerics before adopting it")  # same steps: nothing to blame but it
