"""The sequential phase of ``--repeats auto`` (bench.run.adaptive): which configurations are open, which go first,
and the speed-only pairs a round adds, from hand-made records."""

import dataclasses

from bench.plan.config import build_config
from bench.records.frame import records_frame
from bench.run import adaptive
from tests.records import record


def _cfg(**over):
    return build_config("quick", {"workloads": "mlp", "techniques": "bf16,grad_accum:steps=4", **over})


def _planned(speedups: dict[str, list[float]], wall: float = 10.0):
    """Three planned repeats per set: the baseline at 100 samples/s, each set at its three speedups."""
    out = []
    for seed in range(3):
        out.append(dataclasses.replace(record(seed=seed, sps=100.0, final=0.8), wall_s=wall))
        for label, values in speedups.items():
            out.append(dataclasses.replace(record(label, seed=seed, sps=100.0 * values[seed], final=0.8), wall_s=wall))
    return out


def test_auto_is_the_quick_presets_default_and_a_fixed_count_is_a_fixed_design():
    cfg = _cfg()
    assert cfg.repeats == 3 and cfg.max_repeats == 8 and cfg.sequential
    fixed = _cfg(repeats=5)
    assert fixed.repeats == 5 and fixed.max_repeats == 0 and not fixed.sequential
    assert _cfg(repeats=5, max_repeats=12).sequential
    assert not _cfg(mode="quality").sequential  # nothing to time: no speed-only pairs


def test_a_decided_configuration_is_closed_and_an_open_one_gets_a_paired_speed_only_round():
    cfg = _cfg()
    records = _planned({"bf16": [0.30, 0.31, 0.29], "grad_accum:steps=4": [1.12, 1.06, 1.18]})  # a few pairs short
    opened = adaptive.open_configurations(cfg, records)
    assert [o.techniques.label for o in opened] == ["grad_accum:steps=4"] and opened[0].what == "speed"
    trials = adaptive.next_round(cfg, records, budget_left=100.0)
    assert [(t.techniques.label, t.seed, t.repeat, t.mode) for t in trials] == [
        ("baseline", 0, 3, "speed"), ("grad_accum:steps=4", 0, 3, "speed")]
    assert all(t.added_by == "sequential" and t.trial_id.endswith("/r3/speed") for t in trials)


def test_rounds_alternate_their_order_and_stop_when_the_budget_is_spent():
    cfg = _cfg()
    records = _planned({"grad_accum:steps=4": [1.12, 1.06, 1.18]})
    first = adaptive.next_round(cfg, records, budget_left=100.0)
    done = [dataclasses.replace(record(t.techniques.label, seed=t.seed, repeat=t.repeat,
                                       sps=112.0 if t.techniques.label != "baseline" else 100.0, mode="speed"),
                                wall_s=5.0, added_by="sequential") for t in first]
    second = adaptive.next_round(cfg, records + done, budget_left=100.0)
    assert [t.techniques.label for t in second] == ["grad_accum:steps=4", "baseline"]  # ABBA
    assert second[0].repeat == 4 and second[0].seed == 1
    assert adaptive.spent_s(records + done) == 10.0
    assert adaptive.next_round(cfg, records + done, budget_left=4.0) == []  # one pair costs about 10 s


def test_the_default_budget_is_half_the_planned_trials_wall_time():
    records = _planned({"bf16": [0.3, 0.3, 0.3]}, wall=10.0)
    assert adaptive.budget_s(_cfg(), records) == 0.5 * 60.0
    assert adaptive.budget_s(_cfg(decide_within=12.5), records) == 12.5


def test_the_closest_to_a_decision_goes_first_and_a_hopeless_one_last():
    cfg = _cfg(techniques="bf16,grad_accum:steps=4,checkpointing")
    records = _planned({"bf16": [1.00, 0.80, 1.25],  # centred on 1 with a 20% spread: futile at a cap of 8
                        "grad_accum:steps=4": [1.12, 1.06, 1.18],  # beyond 5%, a few pairs short
                        "checkpointing": [0.97, 1.0, 1.03]})
    order = [o.techniques.label for o in adaptive.open_configurations(cfg, records)]
    assert order[-1] == "bf16" and order.index("grad_accum:steps=4") < order.index("bf16")
    # a sweep gives the futile one no pairs, however much budget is left; a larger cap makes room
    chosen = {t.techniques.label for t in adaptive.next_round(cfg, records, budget_left=1e9)}
    assert "grad_accum:steps=4" in chosen and "bf16" not in chosen
    roomy = {t.techniques.label for t in adaptive.next_round(_cfg(techniques="bf16,grad_accum:steps=4,checkpointing",
                                                                  max_repeats=20), records, budget_left=1e9)}
    assert "bf16" in roomy


def test_speed_only_pairs_count_in_the_speed_verdict_but_not_in_quality():
    from bench.analyze import analysis

    records = _planned({"grad_accum:steps=4": [1.10, 1.12, 1.08]})
    extra = [dataclasses.replace(record(label, seed=r % 3, repeat=r, sps=100.0 * (1.10 if label != "baseline" else 1),
                                        mode="speed"), added_by="sequential")
             for r in range(3, 8) for label in ("baseline", "grad_accum:steps=4")]
    frame = records_frame(records + extra, max_looks=20)
    c = analysis.configurations(frame).set_index("technique").loc["grad_accum:steps=4"]
    assert c["speedup_n"] == 8 and c["n_added"] == 5 and c["n_final"] == 3
    assert c["speedup_verdict"] == "faster"
    fixed = analysis.configurations(records_frame(records + extra)).set_index("technique")
    assert c["speedup_lo"] < fixed.loc["grad_accum:steps=4", "speedup_lo"]  # the repeated interval is wider


def test_a_configuration_whose_added_trials_keep_failing_is_closed_at_last():
    cfg = _cfg(max_repeats=4)
    records = _planned({"grad_accum:steps=4": [1.02, 0.90, 1.10]})
    failed = [dataclasses.replace(record("grad_accum:steps=4", seed=r % 3, repeat=r, status="failed", reason="boom",
                                         mode="speed"), added_by="sequential", wall_s=1.0) for r in range(3, 7)]
    assert adaptive.open_configurations(cfg, records)  # 3 trials, 3 pairs: open
    assert adaptive.open_configurations(cfg, records + failed[:1]) == []  # 4 trials = the cap: no more rounds


def test_the_report_counts_the_undecided_configurations_the_cap_could_not_decide():
    """The committed default sweep of example-cpu-trial-cost stopped 5 configurations as futile; its summary says
    how many of the undecided are, so a reader knows more of the same pairs would not have decided them."""
    from bench.analyze.analysis import analyze
    from bench.core.files import REPO_DIR
    from bench.records.reader import load
    from bench.report.sections import summary

    line = summary.decisions(analyze(load([REPO_DIR / "reports" / "example-cpu-trial-cost" / "default-after"])))[0]
    assert "5 of the 5 undecided are futile" in line and "--max-repeats" in line
