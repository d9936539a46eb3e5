"""What a trial costs besides its measurement: the stage clock's arithmetic, the launcher's share of the stages, the
sweep's totals, the shared compile caches and the one-off cost they leave to the cold trials (docs/methodology.md,
'A trial's stages'). Clocks are injected: nothing here depends on how fast this machine is."""

from __future__ import annotations

import fcntl
import itertools
from pathlib import Path

import pytest

from bench.analyze import time_spent
from bench.measure.stages import MEASURED, STAGES, StageClock, close, fixed_and_measured, split_measured
from bench.plan.config import TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import Trial
from bench.records.frame import records_frame
from bench.run.launcher import COMPILED_MARK, CompileCache, LaunchTimes
from tests.records import record


class Ticks:
    """A clock that returns the next of ``times`` at each call."""

    def __init__(self, *times: float) -> None:
        self.times = iter(times)

    def __call__(self) -> float:
        return next(self.times)


# ---- the stage clock ------------------------------------------------------------------------------------------


def test_nested_stages_count_once_each_and_gaps_count_nowhere():
    clock = StageClock(start=0.0, clock=Ticks(1.0, 2.0, 5.0, 6.0, 10.0, 11.0, 12.0))
    clock.mark("imports")  # 0 -> 1
    with clock.stage("speed"):  # enters at 2 (1 -> 2 is a gap: no stage open)
        with clock.stage("warmup"):  # speed 2 -> 5, warmup 5 -> 6
            pass
        # speed again 6 -> 10
    with clock.stage("phases"):  # 11 -> 12
        pass
    assert clock.seconds == {"imports": 1.0, "speed": 3.0 + 4.0, "warmup": 1.0, "phases": 1.0}


def test_a_stage_visited_twice_adds_up():
    clock = StageClock(start=0.0, clock=Ticks(0.0, 1.0, 3.0, 6.0))
    for _ in range(2):
        with clock.stage("finalize"):
            pass
    assert clock.seconds == {"finalize": 1.0 + 3.0}


def test_the_measured_parts_are_cut_out_of_their_stages():
    raw = {"build": 3.0, "quality": 10.0, "warmup": 1.0, "speed": 2.5, "phases": 0.5}
    out = split_measured(raw, train_s=6.0, continued_s=1.5, one_off_s=0.7, one_off_in="quality", window_s=2.0,
                         probe_s=0.4)
    assert out == pytest.approx({"build": 2.6, "probes": 0.4, "one_off": 0.7, "quality_train": 6.0,
                                 "continuation": 1.5, "evaluation": 1.8, "warmup": 1.0, "window": 2.0,
                                 "window_retries": 0.5, "phases": 0.5})
    assert sum(out.values()) == pytest.approx(sum(raw.values()))  # cut out, never added


def test_a_speed_only_trial_takes_its_one_off_out_of_the_warm_up():
    out = split_measured({"warmup": 3.0, "speed": 1.0}, one_off_s=2.5, one_off_in="warmup", window_s=1.0)
    assert out == pytest.approx({"warmup": 0.5, "one_off": 2.5, "window": 1.0, "window_retries": 0.0})


def test_a_run_that_did_not_finish_keeps_its_wall_as_training():
    assert split_measured({"quality": 4.0}, train_s=None, one_off_in="quality") == {"quality_train": 4.0}


def test_parts_larger_than_their_stage_are_capped_so_none_is_negative():
    out = split_measured({"quality": 1.0, "speed": 0.5}, train_s=1.2, one_off_s=0.0, one_off_in="quality",
                         window_s=0.6)
    assert out == {"quality_train": 1.0, "evaluation": 0.0, "window": 0.5, "window_retries": 0.0}


def test_closing_adds_the_remainder_and_refuses_unknown_stages():
    out = close({"window": 1.0, "imports": 2.0}, wall_s=3.5)
    assert list(out) == ["imports", "window", "unaccounted"]  # the documented order
    assert out["unaccounted"] == pytest.approx(0.5)
    assert close({"imports": 2.0}, wall_s=1.5)["unaccounted"] == pytest.approx(-0.5)  # shown, never hidden
    with pytest.raises(ValueError, match="unknown trial stages"):
        close({"imports": 1.0, "lunch": 1.0}, wall_s=2.0)
    assert fixed_and_measured({"window": 1.0, "quality_train": 2.0, "imports": 4.0}) == (3.0, 4.0)


def test_every_stage_is_documented_in_the_methodology():
    text = (Path(__file__).resolve().parents[1] / "docs" / "methodology.md").read_text()
    section = text[text.index("## A trial's stages"):]
    section = section[: section.index("\n## ", 3)]
    missing = [name for name in STAGES if f"`{name}`" not in section]
    assert not missing, f"docs/methodology.md's 'A trial's stages' does not name {missing}"
    assert set(MEASURED) <= set(STAGES)


# ---- the launcher's share ----------------------------------------------------------------------------------


def test_the_launcher_adds_launch_teardown_and_collect_around_the_childs_stages():
    times = LaunchTimes(popen=10.2, exit=14.0, exit_epoch=1000.0, written_epoch=999.7)
    child = {"start": 0.1, "imports": 1.5, "window": 1.0, "build": 0.8}
    out = times.stages(child, started=10.0, wall=4.3)
    assert out["launch"] == pytest.approx(0.2) and out["teardown"] == pytest.approx(0.3)
    assert out["collect"] == pytest.approx(0.3)  # exit at 14.0 to the end at 10.0 + 4.3
    assert out["unaccounted"] == pytest.approx(4.3 - 0.2 - 0.3 - 0.3 - 3.4)
    assert sum(out.values()) == pytest.approx(4.3)


def test_a_process_without_stage_times_is_one_stage():
    times = LaunchTimes(popen=0.5, exit=3.0, exit_epoch=100.0, written_epoch=None)  # it wrote no record
    out = times.stages(None, started=0.0, wall=3.25)
    assert out == pytest.approx({"launch": 0.5, "process": 2.5, "collect": 0.25, "unaccounted": 0.0})


# ---- the sweep's totals ------------------------------------------------------------------------------------


def _timed(label: str, seed: int, stages: dict[str, float] | None, **kw):
    rec = record(label, seed, **kw)
    rec.stages = stages
    rec.wall_s = sum(stages.values()) if stages else 7.0
    return rec


def test_the_sweeps_time_adds_up_stage_by_stage_and_says_what_it_cannot_split():
    records = [_timed("baseline", 0, {"imports": 2.0, "window": 0.5, "quality_train": 1.5, "unaccounted": 0.0}),
               _timed("bf16", 0, {"imports": 2.0, "window": 0.5, "teardown": 1.0}),
               _timed("bf16", 1, None)]  # an older record: no stages
    spent = time_spent.of_records(records)
    assert spent.trials == 2 and spent.wall_s == 7.5 and (spent.unbroken, spent.unbroken_s) == (1, 7.0)
    assert spent.stages == {"imports": 4.0, "quality_train": 1.5, "window": 1.0, "teardown": 1.0}
    assert spent.measured_s == 2.5 and spent.fixed_s == 5.0
    assert spent.largest_fixed(2) == [("imports", 4.0), ("teardown", 1.0)]
    line = time_spent.summary_line(spent)
    assert "2 trials took 8 s, 33% of it in measured steps" in line and "2.50 s per trial of fixed cost" in line
    assert "imports 4 s" in line and "1 older trial(s) (7 s) recorded no stage times" in line
    assert time_spent.of_records([record("baseline", 0)]) is None  # nothing ran (no wall time): no line
    assert time_spent.summary_line(None) is None


# ---- compile caches shared by a set's trials ----------------------------------------------------------------


def _trial(label: str = "compile") -> Trial:
    techs = TechniqueSet(tuple(TechniqueSpec.parse(p) for p in label.split("+")))
    return Trial(trial_id=f"mlp:tiny/{label}/seed0/r0", workload=WorkloadSpec("mlp", "tiny"), techniques=techs,
                 seed=0, repeat=0)


def _compile_into(path: Path) -> None:
    (path / "fxgraph").mkdir(parents=True, exist_ok=True)
    (path / "fxgraph" / "entry").write_text("compiled")


def test_the_first_trial_of_a_set_is_cold_and_the_next_finds_its_cache_warm(tmp_path):
    root = tmp_path / "inductor"
    first = CompileCache.open(root, _trial(), tmp_path / "private")
    assert first.path.parent == root and not first.warm
    _compile_into(first.path)
    assert first.close(ok=True) == "cold"
    assert (first.path / COMPILED_MARK).is_file()
    second = CompileCache.open(root, _trial(), tmp_path / "private")
    assert second.path == first.path and second.warm
    assert second.close(ok=False) == "warm"  # a warm trial that failed leaves the finished cache as it was
    assert (first.path / "fxgraph" / "entry").is_file()
    other = CompileCache.open(root, _trial("bf16+compile"), tmp_path / "private")
    assert other.path != first.path and not other.warm  # each set has its own: its first trial is cold
    other.close(ok=True)


def test_a_cold_trial_that_failed_leaves_nothing_and_the_next_is_cold_again(tmp_path):
    root = tmp_path / "inductor"
    failed = CompileCache.open(root, _trial(), tmp_path / "private")
    _compile_into(failed.path)
    assert failed.close(ok=False) == "cold"
    assert not failed.path.exists()
    # and a cache a killed runner left half-filled (no mark) is emptied before the next trial
    _compile_into(failed.path)
    again = CompileCache.open(root, _trial(), tmp_path / "private")
    assert not again.warm and not failed.path.exists()
    again.close(ok=True)


def test_a_trial_that_compiled_nothing_has_no_inductor_cache_state(tmp_path):
    cache = CompileCache.open(tmp_path / "inductor", _trial("baseline"), tmp_path / "private")
    cache.path.mkdir(parents=True)  # an empty directory is not a compilation
    assert cache.close(ok=True) is None
    assert not cache.path.exists()


def test_a_set_whose_cache_another_process_holds_compiles_into_a_private_cold_one(tmp_path):
    root = tmp_path / "inductor"
    held = CompileCache.open(root, _trial(), tmp_path / "private-1")
    other = CompileCache.open(root, _trial(), tmp_path / "private-2")  # a concurrent job of the same set
    assert other.path == tmp_path / "private-2" and not other.warm and other.lock is None
    _compile_into(other.path)
    assert other.close(ok=True) == "cold"
    assert not (held.path / COMPILED_MARK).exists()  # the private one marks nothing shared
    held.close(ok=True)
    with open(next(root.glob("*.lock")), "w") as fh:  # and the lock was released
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_warm_trials_take_their_sets_one_off_cost_from_the_cold_trials():
    def trial(seed: int, cache: str | None, one_off: float, ttt: float | None = 2.0):
        rec = record("compile", seed, one_off=one_off, ttt=ttt, target=0.5, final=0.6)
        rec.caches = {"inductor": cache} if cache else None
        return rec

    records = [trial(0, "cold", 20.0), trial(1, "warm", 3.0), trial(2, "warm", 2.0, ttt=None),
               record("baseline", 0, one_off=0.01), record("baseline", 1, one_off=0.02)]
    frame = records_frame(records)
    compiled = frame[frame["technique"] == "compile"].set_index("seed")
    assert list(compiled["one_off_s"]) == [20.0, 20.0, 20.0]
    assert compiled.at[1, "time_to_target_one_off_s"] == pytest.approx(2.0 + 20.0)
    assert compiled.at[2, "time_to_target_one_off_s"] is None  # a miss stays a miss
    assert list(compiled["inductor_cache"]) == ["cold", "warm", "warm"]
    base = frame[frame["technique"] == "baseline"]
    assert list(base["one_off_s"]) == [0.01, 0.02]  # no cache state: as measured
    # without a cold trial of the set (a resumed sweep lost it), warm trials keep their own
    alone = records_frame([trial(1, "warm", 3.0), *records[3:]])
    assert list(alone.loc[alone["technique"] == "compile", "one_off_s"]) == [3.0]


def test_stage_names_and_measured_parts_are_stable():
    """The report and gpu_check.sh read these names: renaming one is a change of the record's schema."""
    assert list(itertools.islice(STAGES, 3)) == ["launch", "start", "imports"]
    assert MEASURED == ("window", "quality_train", "continuation")
    assert list(STAGES)[-1] == "unaccounted"
