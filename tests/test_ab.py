"""`sweep --ab`: the other checkout's code really runs side B, trials alternate ABBA, worktrees are cleaned up."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bench.cli import main
from bench.plan.config import ConfigError, build_config
from bench.plan.planner import plan
from bench.records.results import ResultStore
from bench.run import ab, workflow
from tests.conftest import REPO, TINY_BUDGET


def copy_checkout(dest: Path) -> Path:
    """A copy of this checkout's code whose mlp:tiny preset carries a marker, so B's records show whose code ran."""
    for name in ("bench", "techniques"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    mlp = dest / "bench" / "workloads" / "mlp_mnist1d.py"
    # a size field of B's own, with a default, so every mlp size B builds records it
    text, n = re.subn(r"(class MlpSize\(Size\):\n(?:.*\n)*?    eval_points: int\n)", r'\1    ab_marker: str = "b"\n',
                      mlp.read_text(), count=1)
    assert n == 1, "mlp_mnist1d.py has no MlpSize to mark"
    mlp.write_text(text)
    return dest


def test_a_directory_is_used_as_it_is(tmp_path):
    other = copy_checkout(tmp_path / "other")
    checkout = ab.resolve_checkout(str(other))
    assert checkout.code_dir == other.resolve() and not checkout.worktree
    ab.release(checkout)  # a user's directory is never removed
    assert (other / "bench" / "trial.py").exists()


def test_a_directory_without_trainbench_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no trainbench checkout"):
        ab.resolve_checkout(str(tmp_path))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_a_revision_gets_a_temporary_worktree_that_is_removed(tmp_path):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "trial.py").write_text("# side b\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "b")
    checkout = ab.resolve_checkout("HEAD", repo_dir=repo)
    try:
        assert checkout.worktree and checkout.commit == git(repo, "rev-parse", "HEAD").strip()
        assert (checkout.code_dir / "bench" / "trial.py").read_text() == "# side b\n"
        assert str(checkout.code_dir) in git(repo, "worktree", "list")
    finally:
        ab.release(checkout, repo_dir=repo)
    assert not checkout.code_dir.exists() and str(checkout.code_dir) not in git(repo, "worktree", "list")
    with pytest.raises(ConfigError, match="neither a directory nor a git revision"):
        ab.resolve_checkout("no-such-rev", repo_dir=repo)


def test_abba_order_balances_each_configuration_over_repeats():
    cfg = build_config("smoke", {"workloads": "mlp,gpt", "techniques": "baseline,bf16", "repeats": 5})
    trials = plan(cfg, torch.device("cpu"))
    first: dict[tuple[str, str], list[str]] = {}
    for trial, sides in ab.abba_order(trials):
        assert sorted(sides) == ["a", "b"]
        first.setdefault((trial.workload.label, trial.techniques.label), []).append(sides[0])
    assert len(first) == 4
    for config, sides in first.items():  # every configuration alternates, whatever the shuffled run order
        assert sides == ["a", "b", "a", "b", "a"] or sides == ["b", "a", "b", "a", "b"], (config, sides)
    assert sorted(s[0] for s in first.values()) == ["a", "a", "b", "b"]  # half the configurations start on A


@pytest.mark.slow
def test_ab_end_to_end_interleaves_and_compares(tmp_path, capsys):
    other = copy_checkout(tmp_path / "other")
    out = tmp_path / "ab"
    budget = {**TINY_BUDGET, "memory": False, "parity_steps": 0}
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 2, "threads": 1,
                                 "budget": budget})
    order = []
    result = workflow.sweep_ab(cfg, str(other), out, on_progress=lambda p: order.append((p.side, p.trial.repeat)))
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]  # ABBA: neither side always goes first
    for side in ("a", "b"):
        assert {p.name for p in (out / side).iterdir()} >= {"results.jsonl", "env.json", "sweep.toml", "summary.md"}
    a, b = (ResultStore(out / s / "results.jsonl").read() for s in ("a", "b"))
    assert [r.status for r in a + b] == ["ok"] * 4, [(r.trial_id, r.reason) for r in a + b]
    assert all("ab_marker" not in r.workload["params"] for r in a)
    assert all(r.workload["params"]["ab_marker"] == "b" for r in b)  # B's trials imported the other checkout
    md = (out / "compare.md").read_text()
    assert md == result.markdown and "| mlp:tiny baseline | 2/2 |" in md
    assert json.loads((out / "ab.json").read_text())["b"]["code_dir"] == str(other.resolve())

    # The CLI path: resuming a finished A/B run launches nothing and prints the comparison again.
    assert main(["sweep", "--ab", str(other), "--resume", "--out", str(out)]) == 0
    assert "| mlp:tiny baseline | 2/2 |" in capsys.readouterr().out
    assert len(ResultStore(out / "a" / "results.jsonl").read()) == 2


def test_cli_ab_bad_input_exits_2(tmp_path, capsys):
    assert main(["sweep", "--ab", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "neither a directory nor a git revision" in capsys.readouterr().err


def test_both_sides_keep_the_multi_node_launch_settings(tmp_path):
    from bench.run.launcher import Launch

    launch = Launch(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500")
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 1, "nnodes": 2})
    runner = ab.AbRunner(cfg, tmp_path / "x", torch.device("cpu"), ab.Checkout(REPO, ".", None), launch=launch)
    for side in ab.SIDES:
        assert runner.runners[side].launch == launch
        assert runner.runners[side].launcher.launch.torchrun_args(1, "t")[-8:] == [
            "--node-rank", "1", "--rdzv-backend", "static", "--rdzv-endpoint", "10.0.0.1:29500", "--rdzv-id", "t"]
        assert not runner.runners[side].recorder  # node 1 takes part; node 0 records


def test_other_nodes_neither_claim_nor_compare_the_shared_directory(tmp_path):
    from bench.run.launcher import Launch

    out = tmp_path / "x"
    out.mkdir()
    (out / "ab.json").write_text("{}")  # node 0 has started in the shared directory
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "ddp", "repeats": 1, "nproc": 1, "nnodes": 2})
    node1 = ab.AbRunner(cfg, out, torch.device("cpu"), ab.Checkout(REPO, ".", None),
                        launch=Launch(nnodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29500"))
    node1._claim_root()  # node 0's files are expected there
    assert not node1.recorder
    node0 = ab.AbRunner(cfg, out, torch.device("cpu"), ab.Checkout(REPO, ".", None),
                        launch=Launch(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29500"))
    with pytest.raises(ConfigError, match="is not empty"):
        node0._claim_root()
