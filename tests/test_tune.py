"""`bench tune`: the search as a pure function of the records (synthetic records, the real planner), its options,
and (slow) real searches through the runner: one shared small search, a kill -9 and --resume, an impossible
memory limit."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import cli
from bench.plan.config import TechniqueSet, WorkloadSpec
from bench.plan.planner import incompatibility, world_size_for
from bench.report import tune as tune_report
from bench.run import tune
from tests.records import record

MLP = WorkloadSpec("mlp", "tiny")
CPU = torch.device("cpu")
MIB = 2**20


def refuse(techs: TechniqueSet, world: int = 1) -> str | None:
    return incompatibility(techs, MLP, CPU, world_size_for(techs, world))


def sets(*labels: str) -> tuple[TechniqueSet, ...]:
    return tuple(TechniqueSet.parse(label) for label in labels)


def settings(*labels: str, **over) -> tune.Settings:
    return tune.Settings(MLP, sets(*labels), **over)


@dataclasses.dataclass
class Truth:
    """What synthetic trials measure: speed factors multiply per technique, peaks add per technique, finals add."""

    speed: dict[str, float]
    peak: dict[str, int] = dataclasses.field(default_factory=dict)
    final: dict[str, float] = dataclasses.field(default_factory=dict)
    noise: float = 0.01
    failing: tuple[str, ...] = ()
    ttt: dict[str, float] = dataclasses.field(default_factory=dict)  # time-to-target factors

    def measure(self, trial) -> object:  # a TrialRecord for the trial, as the launcher would return it
        label = trial.techniques.label
        names = trial.techniques.names
        rng = random.Random(f"{label}:{trial.repeat}")
        sps = 1000.0
        for n in names:
            sps *= self.speed.get(n, 1.0)
        sps *= 1 + self.noise * (rng.random() - 0.5)
        peak = 100 * MIB + sum(self.peak.get(n, 0) for n in names)
        final = 0.8 + sum(self.final.get(n, 0.0) for n in names) + 0.001 * (trial.seed % 3)
        status = "failed" if any(n in self.failing for n in names) else "ok"
        ttt = 10.0 * (1 + self.noise * (rng.random() - 0.5))
        for n in names:
            ttt *= self.ttt.get(n, 1.0)
        r = record(label, seed=trial.seed, repeat=trial.repeat, mode=trial.mode, sps=sps, peak=peak,
                   final=final if trial.mode != "speed" else None, status=status,
                   reason="boom" if status != "ok" else None, target=0.5, ttt=ttt if trial.mode != "speed" else None)
        return dataclasses.replace(r, trial_id=trial.trial_id, wall_s=2.0, added_by=trial.added_by,
                                   position=trial.position, world_size=trial.world_size)


def simulate(s: tune.Settings, truth: Truth, refuse_fn=refuse, stop_after: int | None = None):
    """Run the search on synthetic trials: every batch of pending trials is 'measured' and appended."""
    records: list = []
    proposed: list = []
    for _ in range(500):
        step = tune.next_step(s, records, refuse_fn)
        if step.done:
            return step, records, proposed
        proposed.append([t.techniques for t in step.pending])
        for t in step.pending:
            records.append(truth.measure(t))
            if stop_after is not None and len(records) >= stop_after:
                return step, records, proposed
    raise AssertionError("the search did not end")


# ---- options ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("512MiB", 512 * MIB), ("8GiB", 8 * 2**30), ("1.5GB", 1_500_000_000),
                                                ("2000000", 2_000_000), ("64 kB", 64_000), ("2G", 2 * 2**30)])
def test_sizes_parse_in_binary_and_decimal_units(text, expected):
    assert tune.parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 parsecs", "GiB", "-1MiB", "", "0", "1e999GiB"])
def test_a_bad_size_is_a_config_error(text):
    with pytest.raises(cli.ConfigError, match="--memory-limit"):
        tune.parse_size(text)


def test_quality_rules():
    assert tune.Quality.parse("same") == tune.Quality("same", 0.0)
    assert tune.Quality.parse("within=0.01") == tune.Quality("within", 0.01)
    assert tune.Quality.parse("any").label == "any"
    for bad in ("within=", "within=-1", "within=x", "close", "within=nan"):
        with pytest.raises(cli.ConfigError, match="--quality"):
            tune.Quality.parse(bad)


@pytest.mark.parametrize("argv", [
    ["tune", "--workloads", "mlp", "--memory-limit", "8 parsecs"],
    ["tune", "--workloads", "mlp", "--quality", "within=much"],
    ["tune", "--workloads", "mlp", "--objective", "fastest"],
    ["tune", "--workloads", "mlp,gpt"],
    ["tune", "--workloads", "mlp", "--techniques", "bf16+compile"],
    ["tune", "--workloads", "mlp", "--budget", "-5"],
    ["tune", "--workloads", "mlp", "--max-repeats", "2"],
    ["tune"],
    ["tune", "--resume"],
    ["tune", "--workloads", "nosuch"],
])
def test_bad_options_are_one_line_and_exit_2(argv, capsys, tmp_path):
    assert cli.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_a_dry_run_plans_lists_what_it_does_not_try_and_writes_nothing(capsys, tmp_path):
    out_dir = tmp_path / "t"
    assert cli.main(["tune", "--workloads", "mlp", "--out", str(out_dir), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "candidates (" in text and "grad_accum:steps=2" in text and "grad_accum:steps=4" in text
    assert "not tried: channels_last" in text  # the MLP has no convolution
    assert "not tried: ddp" in text  # one process
    assert "not tried: fedavg: not offered" in text
    assert "exhaustive space:" in text
    assert not out_dir.exists()


# ---- candidates -----------------------------------------------------------------------------------------------


def test_candidates_are_the_registry_techniques_the_planner_accepts_here():
    singles, skipped = tune.candidate_singles(MLP, refuse)
    labels = {s.label for s in singles}
    assert {"bf16", "checkpointing", "grad_accum:steps=2", "grad_accum:steps=4", "fused_adamw"} <= labels
    assert all(refuse(s) is None for s in singles)
    why = dict(skipped)
    assert "channels_last" in why and "ddp" in why and "tf32" in why
    assert all(refuse(TechniqueSet.parse(label)) for label in why if label != "fedavg")


def test_the_exhaustive_space_holds_only_sets_the_planner_accepts():
    space, cut = tune.exhaustive(sets("bf16", "fp16", "grad_accum:steps=2", "grad_accum:steps=4"), refuse)
    labels = {s.label for s in space}
    assert not cut
    assert "bf16+fp16" not in labels  # one precision slot
    assert "bf16+grad_accum:steps=2" in labels and "fp16+grad_accum:steps=4" in labels
    assert not any("steps=2" in label and "steps=4" in label for label in labels)
    assert len(space) == 8  # the 4 singles, and precision x accumulation: 2 x 2


# ---- the search on synthetic records --------------------------------------------------------------------------


def test_the_search_never_proposes_a_set_the_plan_would_refuse():
    s = settings("bf16", "fp16", "grad_accum:steps=4", "fused_adamw", "checkpointing")
    truth = Truth({"bf16": 1.5, "fp16": 1.4, "fused_adamw": 1.3, "grad_accum": 0.8, "checkpointing": 0.7})
    step, records, proposed = simulate(s, truth)
    every = {t.label for batch in proposed for t in batch}
    assert "bf16+fused_adamw" in every  # the greedy stage ran
    assert all(refuse(TechniqueSet.parse(label)) is None for label in every)
    assert not any("bf16" in label and "fp16" in label for label in every)
    assert step.recommended == "bf16+fused_adamw"


def test_singles_then_greedy_keeps_an_addition_only_when_it_helps():
    s = settings("bf16", "fused_adamw", "checkpointing", quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.3, "checkpointing": 0.6})
    step, records, _ = simulate(s, truth)
    assert step.recommended == "bf16+fused_adamw"
    o = step.outcomes
    assert o["bf16"].status == "faster" and o["fused_adamw"].status == "faster" and o["checkpointing"].status == "slower"
    assert o["bf16+fused_adamw"].reference == "bf16" and o["bf16+fused_adamw"].status == "faster"
    assert "bf16+checkpointing" not in o  # decided slower alone: not offered as an addition
    assert step.runner_up == "bf16"
    stages = [e for e in step.trace if e["what"] == "stage"]
    assert [e["set"] for e in stages] == ["baseline", "bf16"]  # then nothing is left to add


def test_a_candidate_decided_worse_is_not_measured_again():
    s = settings("bf16", "fused_adamw", "checkpointing", "grad_accum:steps=4", quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.3, "checkpointing": 0.6, "grad_accum": 0.5})
    step, records, proposed = simulate(s, truth)
    for label, o in step.outcomes.items():
        if o.status != "slower":
            continue
        rounds = [i for i, batch in enumerate(proposed) if any(t.label == label for t in batch)]
        trials = [r for r in records if r.technique_label == label]
        assert len(trials) == o.pairs == tune.QUALITY_SEEDS  # decided at the first look, then never again
        assert rounds == list(range(rounds[0], rounds[0] + len(rounds)))  # consecutive rounds of one stage
        assert not any(label in t.label.split("+") and t.label != label for b in proposed for t in b)


def test_the_search_is_a_function_of_the_records_so_its_resume_continues_where_it_stopped():
    s = settings("bf16", "fused_adamw", "checkpointing", quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.3, "checkpointing": 0.6})
    full, all_records, _ = simulate(s, truth)
    for cut in (1, 4, 7, 11):  # killed mid-round: the next step asks for exactly the trials not yet recorded
        partial = all_records[:cut]
        step = tune.next_step(s, partial, refuse)
        assert [t.trial_id for t in step.pending] == [r.trial_id for r in all_records[cut:cut + len(step.pending)]]
        again = tune.next_step(s, partial, refuse)
        assert [t.trial_id for t in again.pending] == [t.trial_id for t in step.pending]
    done = tune.next_step(s, all_records, refuse)
    assert done.done and done.recommended == full.recommended and done.trace == full.trace
    assert len({r.trial_id for r in all_records}) == len(all_records)


def test_rounds_are_paired_alternate_their_order_and_carry_the_baseline():
    s = settings("bf16", "fused_adamw", quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.3})
    _, records, proposed = simulate(s, truth)
    first, second = proposed[0], proposed[1]
    assert [t.label for t in first] == ["baseline", "bf16", "fused_adamw"]
    assert [t.label for t in second] == ["fused_adamw", "bf16", "baseline"]  # ABBA
    greedy = next(b for b in proposed if any("+" in t.label for t in b))
    assert {t.label for t in greedy} == {"bf16", "baseline", "bf16+fused_adamw"}
    for batch_records in (records[:3], records[3:6]):
        assert len({(r.seed, r.repeat) for r in batch_records}) == 1  # one seed and repeat per round
    assert all(r.added_by == "tune" and r.mode == "speed" and r.trial_id.endswith("/speed") for r in records)


def test_a_memory_limit_below_the_baselines_peak_picks_the_fastest_set_that_fits():
    s = settings("bf16", "grad_accum:steps=4", "checkpointing", memory_limit=80 * MIB, quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "grad_accum": 0.5, "checkpointing": 0.7},
                  peak={"grad_accum": -40 * MIB, "checkpointing": -30 * MIB})
    step, records, _ = simulate(s, truth)
    assert step.outcomes["bf16"].status == "infeasible"
    assert len([r for r in records if r.technique_label == "bf16"]) == 1  # infeasible after one trial
    assert any(e["what"] == "baseline infeasible" for e in step.trace)
    first = next(e for e in step.trace if e["what"] == "current best")
    assert first["set"] == "checkpointing"  # fits, and faster than accumulation, the other single that fits
    # bf16 alone does not fit, but beside checkpointing it does, and is faster: greedy selection keeps it
    assert step.recommended == "bf16+checkpointing"
    assert step.outcomes["checkpointing+grad_accum:steps=4"].status == "slower"


def test_an_impossible_memory_limit_ends_without_a_set_naming_the_smallest_peak():
    s = settings("bf16", "checkpointing", memory_limit=1 * MIB, quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "checkpointing": 0.7}, peak={"checkpointing": -30 * MIB})
    step, records, _ = simulate(s, truth)
    assert step.done and step.recommended is None
    assert step.smallest_peak == ("checkpointing", 70 * MIB, "tensors")
    assert len(records) == 3  # one round: both candidates infeasible after their first trial


def test_a_numeric_winner_needs_quality_runs_and_is_dropped_when_it_loses_quality():
    s = settings("bf16", "fused_adamw")  # --quality same
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.2}, final={"bf16": -0.05})
    step, records, _ = simulate(s, truth)
    quality_runs = [r for r in records if r.mode == "both"]
    assert {r.technique_label for r in quality_runs} == {"baseline", "bf16"}
    assert {(r.seed, r.repeat) for r in quality_runs} == {(0, 0), (1, 1), (2, 2)}
    assert step.recommended == "fused_adamw"  # exact: the same by construction
    assert any(e["what"] == "quality failed" and e["set"] == "bf16" for e in step.trace)


def test_a_numeric_winner_within_the_margin_is_kept():
    s = settings("bf16", "fused_adamw", quality=tune.Quality("within", 0.01))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.2}, final={"bf16": -0.002})
    step, _, _ = simulate(s, truth)
    assert step.recommended == "bf16+fused_adamw"


def test_a_failing_candidate_is_dropped_after_its_first_trial():
    s = settings("bf16", "fused_adamw", quality=tune.Quality("any"))
    step, records, _ = simulate(s, Truth({"bf16": 1.5}, failing=("fused_adamw",)))
    assert step.outcomes["fused_adamw"].status == "failed"
    assert len([r for r in records if r.technique_label == "fused_adamw"]) == 1


def test_the_budget_stops_the_search_and_says_what_it_did_not_try():
    s = settings("bf16", "fused_adamw", "checkpointing", quality=tune.Quality("any"), budget_s=20.0)
    step, records, _ = simulate(s, Truth({"bf16": 1.5, "fused_adamw": 1.3, "checkpointing": 0.6}))
    assert step.done and step.recommended is not None
    assert sum(r.wall_s for r in records) <= 20.0 + 2.0 * 4  # at most the round that was under way
    assert "budget" in step.stop or any(o.status == "budget" for o in step.outcomes.values())


def test_the_memory_objective_keeps_the_set_with_less_memory():
    s = settings("grad_accum:steps=4", "checkpointing", "bf16", objective="memory", quality=tune.Quality("any"))
    truth = Truth({}, peak={"grad_accum": -40 * MIB, "checkpointing": -30 * MIB, "bf16": 10 * MIB})
    step, _, _ = simulate(s, truth)
    assert step.outcomes["bf16"].status == "more"
    assert step.recommended == "checkpointing+grad_accum:steps=4"


def test_the_time_to_target_objective_runs_full_trials_and_keeps_the_set_that_gets_there_sooner():
    s = settings("bf16", "checkpointing", "fused_adamw", objective="time-to-target", quality=tune.Quality("any"))
    truth = Truth({}, ttt={"bf16": 0.5, "checkpointing": 1.5, "fused_adamw": 0.8})
    step, records, _ = simulate(s, truth)
    assert all(r.mode == "both" for r in records)  # every round trains the quality budget
    assert len({r.seed for r in records}) > 3  # a new seed per round
    assert step.outcomes["bf16"].status == "sooner" and step.outcomes["checkpointing"].status == "later"
    assert step.recommended == "bf16+fused_adamw"


def test_the_result_holds_comparisons_a_frontier_and_renders_as_markdown():
    s = settings("bf16", "fused_adamw", "checkpointing", quality=tune.Quality("any"))
    truth = Truth({"bf16": 1.5, "fused_adamw": 1.3, "checkpointing": 0.6}, peak={"checkpointing": -30 * MIB})
    step, records, _ = simulate(s, truth)
    result = tune.result_dict(records, step, s)
    assert set(result["comparisons"]) == {"baseline", "bf16"}
    vs_base = result["comparisons"]["baseline"]
    assert vs_base["speed_verdict"] == "faster" and vs_base["speed"].endswith("faster")
    front = {r["set"]: r["pareto"] for r in result["frontier"]}
    assert front["bf16+fused_adamw"] and front["checkpointing"]  # the fastest, and the smallest peak
    assert front["fused_adamw"]  # the fastest whose quality is known (exact): --quality any measured no bf16 set's
    assert not front["baseline"]  # fused_adamw is faster at the same memory and quality
    md = tune_report.to_markdown(result, tune_report.snippets_for(result["recommended"]))
    assert "Recommended: `bf16+fused_adamw`" in md and "## Search trace" in md and "## Pareto frontier" in md
    assert "### bf16" in md and "### fused_adamw" in md
    json.dumps(result, default=str)


# ---- real searches (slow) ----------------------------------------------------------------------------------------

FAST = ["--workloads", "mlp:tiny", "--window-steps", "4", "--window-seconds", "0.05", "--max-repeats", "3",
        "--timeout", "180", "--seed", "0"]


def _tune(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", "tune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small_search(tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "t"
    done = _tune([*FAST, "--techniques", "fused_adamw,grad_accum:steps=2", "--out", str(out)], REPO)
    return out, done


@pytest.mark.slow
def test_a_real_search_writes_sweep_records_tune_files_and_a_report(small_search):
    out, done = small_search
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "tune.json").read_text())
    assert result["done"] and result["recommended"]
    for name in ("results.jsonl", "env.json", "sweep.toml", "tune.toml", "tune.md", "report.md"):
        assert (out / name).is_file(), name
    assert "recommended:" in done.stdout
    assert cli.main(["report", str(out)]) == 0


@pytest.mark.slow
def test_resume_after_kill_9_continues_the_search_where_it_stopped(tmp_path):
    out = tmp_path / "k"
    args = [*FAST, "--techniques", "fused_adamw,grad_accum:steps=2", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "bench", "tune", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not results.exists() or len(results.read_text().splitlines()) < 2):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [json.loads(line)["trial_id"] for line in results.read_text().splitlines() if line.strip()]
    assert len(before) >= 2
    done = _tune(["--resume", "--out", str(out)], REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    after = [json.loads(line)["trial_id"] for line in results.read_text().splitlines() if line.strip()]
    assert after[:len(before)] == before and len(set(after)) == len(after)  # continued, nothing run twice
    result = json.loads((out / "tune.json").read_text())
    assert result["done"] and result["trials"] == len(after)


@pytest.mark.slow
def test_an_impossible_memory_limit_ends_with_one_line_naming_the_smallest_peak(tmp_path):
    done = _tune([*FAST, "--techniques", "grad_accum:steps=2", "--memory-limit", "1KiB", "--out",
                  str(tmp_path / "m")], REPO)
    assert done.returncode == tune.EXIT_INFEASIBLE
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "smallest peak found" in lines[0] and "grad_accum:steps=2" in lines[0], done.stderr
