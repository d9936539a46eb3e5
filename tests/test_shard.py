"""``--shard i/n``: shards partition the plan exactly, by whole workloads, and their merged report holds every trial.

- the shards' trials are disjoint and together are the unsharded plan, each trial with its place in the run order;
- a shard holds whole workloads (every technique set and repeat of them), so each comparison is on one machine;
- bad shards get one line; a resume keeps its shard; the shard is not a measurement setting (one settings hash);
- two shard sweeps, then ``bench report DIR0 DIR1``: the report holds the unsharded plan's trials and says the
  shards are complete (one shard alone: it says which are missing).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bench.plan.config import ConfigError, build_config
from bench.plan.planner import full_plan, plan
from bench.report import build
from bench.run import sweepdir
from bench.run.runner import SweepRunner
from tests.conftest import REPO, TINY_BUDGET

CPU = torch.device("cpu")
FLAGS = {"workloads": "mlp,gpt,cnn", "techniques": "baseline,grad_accum:steps=2,bf16", "repeats": 2}


def test_shards_partition_the_plan_by_whole_workloads():
    whole = plan(build_config("smoke", FLAGS), CPU)
    shards = [plan(build_config("smoke", {**FLAGS, "shard": f"{i}/2"}), CPU) for i in range(2)]
    ids = [[t.trial_id for t in s] for s in shards]
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == sorted(t.trial_id for t in whole)
    assert {t.workload.name for t in shards[0]} == {"mlp", "cnn"} and {t.workload.name for t in shards[1]} == {"gpt"}
    for shard in shards:  # every set and repeat of a shard's workloads, in the whole plan's order and positions
        expected = [t for t in whole if t.workload in {s.workload for s in shard}]
        assert shard == expected
    assert full_plan(build_config("smoke", {**FLAGS, "shard": "1/2"}), CPU) == whole


@pytest.mark.parametrize("text, message", [
    ("2/2", "the index must be 0 to 1"), ("1", "INDEX/COUNT"), ("a/b", "INDEX/COUNT"), ("0/0", "count >= 1"),
])
def test_bad_shards_say_what_is_valid(text, message):
    with pytest.raises(ConfigError, match=message):
        build_config("smoke", {**FLAGS, "shard": text})


def test_more_shards_than_workloads_are_refused_on_the_whole_plan(tmp_path):
    with pytest.raises(ConfigError, match="the plan has 3 workload.*use at most 3 shards"):
        SweepRunner(build_config("smoke", {**FLAGS, "shard": "0/4"}), tmp_path / "a", CPU).claim()
    # --resume --extend counts the grown plan's workloads, not only those given now
    out = tmp_path / "b"
    out.mkdir()
    (out / "sweep.toml").write_text(build_config("smoke", {**FLAGS, "shard": "1/2"}).to_toml())
    grown = build_config("smoke", {**FLAGS, "workloads": "cnn_aug", "shard": "1/2"})
    runner = SweepRunner(grown, out, CPU, resume=True, extend=True)
    runner.claim()
    runner.close()
    assert [w.name for w in runner.cfg.workloads] == ["mlp", "gpt", "cnn", "cnn_aug"]


def test_the_shard_is_kept_on_resume_and_out_of_the_settings_hash(tmp_path):
    sharded = build_config("smoke", {**FLAGS, "shard": "0/2"})
    assert sweepdir.settings_hash(sharded) == sweepdir.settings_hash(build_config("smoke", FLAGS))
    out = tmp_path / "s"
    out.mkdir()
    (out / "sweep.toml").write_text(sharded.to_toml())
    assert 'shard = "0/2"' in (out / "sweep.toml").read_text()
    with pytest.raises(ConfigError, match="is shard 0/2 and this command's is shard 1/2"):
        SweepRunner(build_config("smoke", {**FLAGS, "shard": "1/2"}), out, CPU, resume=True).claim()
    with pytest.raises(ConfigError, match="is shard 0/2 and this command's is not sharded"):
        sweepdir.resumed_config(out, build_config("smoke", FLAGS), extend=False)
    assert sweepdir.resumed_config(out, sharded, extend=False) == sharded


@pytest.mark.slow
def test_merged_shards_hold_the_unsharded_plans_trials(tmp_path):
    flags = {"workloads": "mlp,gpt", "techniques": "baseline,grad_accum:steps=2", "repeats": 1, "mode": "speed",
             "budget": {**TINY_BUDGET, "memory": False}}
    dirs = [tmp_path / f"shard{i}" for i in range(2)]
    for index, out in enumerate(dirs):
        records = SweepRunner(build_config("smoke", {**flags, "shard": f"{index}/2"}), out, CPU).run()
        assert [r.status for r in records] == ["ok", "ok"], [r.reason for r in records]
    whole = plan(build_config("smoke", flags), CPU)
    analysis, report = build(dirs, with_figures=False)
    assert sorted(analysis.frame["trial_id"]) == sorted(t.trial_id for t in whole)
    assert any("shards 0/2, 1/2 merged" in note for note in report.input_notes)
    _, alone = build(dirs[:1], with_figures=False)
    assert any("the workloads of shard(s) 1/2 are not in it" in note for note in alone.input_notes)
    proc = subprocess.run([sys.executable, "-m", "bench", "report", *map(str, dirs), "--out", str(tmp_path / "m"),
                           "--format", "md"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "shards 0/2, 1/2 merged" in (tmp_path / "m" / "report.md").read_text()
