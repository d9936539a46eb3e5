"""gpu_check.sh's plan (bench.plan.gpu): every stage the code runs is priced, from the H200 run's figures or the
last check's stage times, with a margin of at least 20%; the sets run in priority order so the comparisons asked
about first complete first; a resumed check prices only what is left; the sequential phase prices its first round
from the planned trials' own cost when they were speed-only already; a cut and a resume are told apart."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from bench import reference as reference_mod
from bench.dev import gpu_check
from bench.measure.phases import BUSY_STEPS
from bench.plan import gpu
from bench.plan.config import GPU_CHECK, Budget, ConfigError, TechniqueSet, WorkloadSpec, build_config
from bench.plan.planner import ReferenceKey, run_order
from bench.records import reader
from bench.records.results import PARITY_HARMLESS
from bench.run import adaptive, sweepdir

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "reports" / "example-h200-first"
W = WorkloadSpec("gpt", "gpt2-124m-b32")


def costs(**over) -> gpu.Costs:
    """Round figures, every step 0.5 s: the arithmetic shows."""
    base = dict(name="test", device="cuda", fixed_s=3.0, eager_one_off_s=0.5, compile_cold_s=20.0, compile_warm_s=4.0,
                busy_setup_s=1.0, startup_s=10.0, report_s=30.0, tests_s=30.0, reference_process_s=5.0,
                reference_first_s=10.0, reference_build_s=1.0, rates={("float32", False): 1.0},
                step_s={label: 0.5 for label in ["baseline", *GPU_CHECK["techniques"]]})
    return gpu.Costs(**{**base, **over})


# ---- the order ---------------------------------------------------------------------------------------------------


def test_the_check_runs_bf16_against_the_baseline_first_then_compile_then_tf32_each_set_complete():
    cfg = gpu.check_config()
    order = [(r, t.label) for r, _, t in run_order(cfg)]
    assert order[:6] == [(0, "baseline"), (0, "bf16"), (1, "bf16"), (1, "baseline"), (2, "baseline"), (2, "bf16")]
    assert [label for _, label in order[6:]] == ["bf16+compile"] * 3 + ["tf32"] * 3 + ["bf16+compile+fused_adamw"] * 3
    assert [r for r, _ in order[6:]] == [0, 1, 2] * 3


def test_the_default_order_is_the_seeded_shuffle_it_always_was():
    cfg = build_config("quick")
    sets = [TechniqueSet(()), *cfg.techniques] if TechniqueSet(()) not in cfg.techniques else list(cfg.techniques)
    old = []
    for repeat in range(cfg.repeats):
        configs = [(w, t) for w in cfg.workloads for t in sets]
        random.Random(f"{cfg.seed}:{repeat}").shuffle(configs)
        old += [(repeat, w, t) for w, t in configs]
    assert run_order(cfg) == old


def test_the_order_changes_no_measurement_so_a_resume_may_change_it(tmp_path):
    cfg = gpu.check_config()
    shuffled = dataclasses.replace(cfg, order="shuffled")
    assert sweepdir.settings_hash(cfg) == sweepdir.settings_hash(shuffled)
    assert 'order = "priority"' in cfg.to_toml() and "order" not in shuffled.to_toml()
    with pytest.raises(ConfigError, match="order must be one of shuffled, priority; got 'random'"):
        build_config("quick", {"order": "random"})


# ---- a trial, stage by stage ---------------------------------------------------------------------------------------


def test_a_trial_is_priced_stage_by_stage_as_the_trial_runs_them():
    budget = Budget(warmup_steps=3, min_steps=10, min_seconds=2.0, max_seconds=10.0, parity_steps=8)
    plain, compiled = TechniqueSet(()), TechniqueSet.parse("bf16+compile")
    stages = gpu.trial_stages(W, plain, budget, "speed", costs(), cold=True)
    # warm-up covers the 8 parity steps; the window 10 steps (5 s, past 2 s); the phase pass 10 steps; the busy
    # pass its profiler's warm-up step and BUSY_STEPS with the profiler's set-up; the memory passes 4 steps
    assert stages == {"fixed": 3.0, "one-off": 0.5, "warm-up": 4.0, "window": 5.0, "phase pass": 5.0,
                      "busy pass": (BUSY_STEPS + 1) * 0.5 + 1.0, "memory passes": 2.0}
    assert gpu.trial_stages(W, compiled, budget, "speed", costs(), cold=True)["one-off"] == 20.0
    assert gpu.trial_stages(W, compiled, budget, "speed", costs(), cold=False)["one-off"] == 4.0
    cpu = gpu.trial_stages(W, plain, dataclasses.replace(budget, memory=False), "speed", costs(device="cpu"), True)
    assert "busy pass" not in cpu and "memory passes" not in cpu  # CUDA only; memory passes off
    q = gpu.trial_stages(W, plain, Budget(max_train_seconds=30.0, timeout_s=300.0), "quality", costs(), cold=True)
    assert q["quality run"] == pytest.approx(30 + 11 * 0.5 / 3)  # the safety cap stops its training clock


def test_the_references_are_priced_as_bench_reference_runs_them(monkeypatch):
    """4 runs (the plain one, a harmless jitter per kind, the learning-rate bug), each on a model it builds, and one
    counted step, per seed: the plan's REFERENCE_RUNS is what compute() does."""
    runs = []

    def train(key, device, scale=0.0, lr_factor=1.0, count=False):
        runs.append((scale, lr_factor, count))
        return reference_mod._Run([1.0] * key.steps, [0.1] * key.steps, 10 if count else None, "sha", 0)

    monkeypatch.setattr(reference_mod, "_train", train)
    reference_mod.compute(ReferenceKey("mlp", "tiny", 0, 64, 8), torch.device("cpu"))
    assert len(runs) == gpu.REFERENCE_RUNS == 2 + len(PARITY_HARMLESS) and sum(c for *_, c in runs) == 1
    plan = gpu.check_plan(costs=costs())
    refs = next(p for p in plan.before if p.name.startswith("references"))
    per_seed = gpu.REFERENCE_RUNS * (1.0 + 8 * 0.5) + 0.5  # builds and parity steps, and the counted step
    assert refs.name == "references (3 seeds)" and refs.stages == {"process": 5.0, "first use": 10.0,
                                                                    "runs": pytest.approx(3 * per_seed)}


# ---- the check's plan --------------------------------------------------------------------------------------------


def test_the_plan_keeps_a_20_percent_margin_and_says_which_groups_the_slot_completes():
    plan = gpu.check_plan(costs=gpu.H200)
    assert plan.margin >= 0.2 and [g.name for g in plan.groups] == [
        "baseline and bf16", "bf16+compile", "tf32", "bf16+compile+fused_adamw"]
    fixed = sum(p.seconds for p in (*plan.before, *plan.after))
    total = fixed
    for group, reached in zip(plan.groups, plan.reached(), strict=True):
        total += group.seconds
        assert reached == (total * 1.2 <= 480)
    assert plan.reached()[0] and not plan.fits and plan.decide_within_s == 0  # today's costs: the first group only
    lines = gpu.describe(plan)
    assert any("baseline and bf16 (6 trials)" in line and "within the slot" in line for line in lines)
    assert any("probably cut by the cap" in line for line in lines)
    roomy = gpu.check_plan(costs=costs(), budget_s=2000.0)
    assert roomy.fits and roomy.decide_within_s == pytest.approx(2000 / 1.2 - roomy.total_s)


def test_a_resumed_check_prices_only_what_is_left():
    cfg = gpu.check_config()
    ids = gpu_check.planned_ids_of(cfg)
    done = ids[:7]  # the first group, and bf16+compile's repeat 0 (its cache filled)
    full, resumed = gpu.check_plan(costs=costs()), gpu.check_plan(costs=costs(), done=done,
                                                                   cached=[f"gpt-gpt2-124m-b32-seed{s}-b32-k8"
                                                                           for s in range(3)])
    assert [g.name for g in resumed.groups] == ["bf16+compile", "tf32", "bf16+compile+fused_adamw"]
    assert resumed.groups[0].trials == 2 and resumed.groups[0].stages["one-off"] == 2 * 4.0  # warm: cache filled
    assert full.groups[1].stages["one-off"] == 20.0 + 2 * 4.0
    assert not any(p.name.startswith("references") for p in resumed.before)  # cached


def _staged(records, **stages):
    return [dataclasses.replace(r, stages={**stages, "one_off": r.build.one_off_s},
                                caches={"inductor": "cold" if r.repeat == 0 else "warm"} if "compile" in
                                r.technique_label else None) for r in records]


def test_the_last_check_on_the_same_machine_prices_the_next(tmp_path):
    out = tmp_path / "example-h200"
    out.mkdir()
    env = json.loads((H200 / "env.json").read_text())
    (out / "env.json").write_text(json.dumps(env))
    records = _staged(reader.read_records(H200 / "results.jsonl"), imports=2.0, build=1.0, warmup=1.5, window=2.0,
                      phases=1.0, memory=0.5)
    (out / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    (out / "gpu-check.json").write_text(json.dumps({"script": {"checks": 3, "GPU tests": 41}}))
    machine = gpu.machine_key(env)
    measured = gpu.measured_costs(out, gpu.H200, machine)
    assert measured.stages_s["bf16"] == {"fixed": 3.0, "warm-up": 1.5, "window": 2.0, "phase pass": 1.0,
                                         "memory passes": 0.5}
    assert measured.tests_s == 41 and measured.compile_cold_s == pytest.approx(24.9, abs=2.0)
    stages = gpu.trial_stages(W, TechniqueSet.parse("bf16"), Budget(), "speed", measured, cold=True)
    assert sum(stages.values()) == pytest.approx(8.0 + measured.eager_one_off_s)
    unmeasured = gpu.trial_stages(W, TechniqueSet.parse("bf16+compile+fused_adamw"), Budget(), "speed", measured, True)
    assert unmeasured["fixed"] == 3.0 and unmeasured["one-off"] == measured.compile_cold_s  # its fixed cost measured
    assert gpu.measured_costs(out, gpu.H200, "1 x NVIDIA H100, torch 2.11.0+cu130") is gpu.H200  # another machine
    moved = tmp_path / "example-h200.prev-20261205-120000"  # a run moved aside by GPU_CHECK_FRESH still counts
    out.rename(moved)
    assert gpu.measured_costs(out, gpu.H200, machine).stages_s["bf16"]["window"] == 2.0


def test_the_plan_reaches_the_script_as_shell_assignments(tmp_path):
    plan = gpu.check_plan(costs=gpu.H200)
    values = dict(line.split("=", 1) for line in gpu.shell(plan, str(tmp_path / "c.toml")).splitlines())
    assert values["CHECK_TECHNIQUES"] == ",".join(GPU_CHECK["techniques"]) and values["CHECK_FITS"] == "0"
    assert values["CHECK_DECIDE_WITHIN"] == "0" and int(values["CHECK_REPORT_S"]) >= 36
    assert int(values["CHECK_ESTIMATE_S"]) >= 1.2 * plan.total_s
    toml = gpu.sweep_toml(plan.cfg)
    # the script gives the device as a flag, the rest as this file
    assert build_config(None, {"device": "cuda"}, _write(tmp_path / "c.toml", toml)).to_toml() == plan.cfg.to_toml()


def _write(path: Path, data: dict) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(data))
    return path


# ---- the sequential phase's first round ----------------------------------------------------------------------------


def test_the_first_sequential_round_prices_speed_only_planned_trials_at_their_own_cost():
    records = reader.read_records(H200 / "results.jsonl")  # speed mode: every planned trial is speed-only already
    walls = sorted(r.wall_s for r in records if r.technique_label == "tf32")
    assert adaptive.trial_cost(records, "gpt:gpt2-124m", "tf32") == pytest.approx(walls[1])  # not half of it
    warm = [dataclasses.replace(r, caches={"inductor": "warm"}) if r.repeat == 1 else r for r in records]
    compiled = next(r.wall_s for r in warm if r.technique_label == "bf16+compile" and r.repeat == 1)
    assert adaptive.trial_cost(warm, "gpt:gpt2-124m", "bf16+compile") == compiled  # a warm cache, as an added one
    both = [dataclasses.replace(r, mode="both") for r in records]
    assert adaptive.trial_cost(both, "gpt:gpt2-124m", "tf32") == pytest.approx(0.5 * walls[1])  # a quality run in


# ---- a cut, and a resume -----------------------------------------------------------------------------------------


def test_a_cut_is_said_in_the_report_and_a_resume_that_measured_twice_is_caught(tmp_path):
    out = tmp_path / "check"
    out.mkdir()
    cfg = gpu.check_config()
    (out / "sweep.toml").write_text(cfg.to_toml())
    ids = gpu_check.planned_ids(out)
    template = reader.read_records(H200 / "results.jsonl")[0]
    lines = [dataclasses.replace(template, trial_id=i).to_json() for i in ids[:8]]
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    (out / "report.md").write_text("# report\n")
    said = gpu_check.note_cut(out)
    assert said[0].startswith("cut by the cap: 7 of the 15 planned trials did not run (bf16+compile 1 of 3; tf32 3 "
                              "of 3; bf16+compile+fused_adamw 3 of 3)")
    gpu_check.note_cut(out)  # said once, however often asked
    assert (out / "report.md").read_text().count(gpu_check.CUT_HEADING) == 1
    first = tmp_path / "first.jsonl"
    first.write_text((out / "results.jsonl").read_text())
    rest = [dataclasses.replace(template, trial_id=i).to_json() for i in ids[8:]]
    (out / "results.jsonl").write_text("\n".join(lines + rest) + "\n")
    ok, said = gpu_check.resumed(out, first)
    assert ok and said == ["resume: the 8 trials of the cut pass kept as they were, 7 measured after it, none twice; "
                           "every planned trial recorded"]
    (out / "results.jsonl").write_text("\n".join(lines + rest + lines[-1:]) + "\n")
    ok, said = gpu_check.resumed(out, first)
    assert not ok and said[0] == f"resume: measured twice: {ids[7]}"
