"""The command line as a user runs it: the smoke sweep end to end, `list`, and bad input (exit 2)."""

import json

import pytest

from bench.records.results import ResultStore
from bench.report import summary as summary_mod


@pytest.mark.slow
def test_smoke_sweep_end_to_end(cli, tmp_path):
    out = tmp_path / "smoke"
    proc = cli("sweep", "--preset", "smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    everything = ResultStore(out / "results.jsonl").read()
    # where bf16 trained faster than the baseline on this machine, a continuation follows (quality at equal time)
    continued = [r for r in everything if r.continues]
    assert all(r.technique_label == "bf16" and r.mode == "quality" for r in continued)
    records = [r for r in everything if not r.continues]
    assert len(records) == 9  # 3 workloads x 3 sets x 1 repeat
    assert {r.status for r in records} == {"ok"}, [(r.trial_id, r.reason) for r in records if r.status != "ok"]
    env = json.loads((out / "env.json").read_text())
    assert env["peak_flops"]["float32"]["flops"] > 0 and env["command"].startswith("python -m bench sweep")
    assert "preset" not in (out / "sweep.toml").read_text() and "smoke" in (out / "sweep.toml").read_text()
    summary = (out / "summary.md").read_text()
    assert "| gpt:tiny | bf16 |" in summary and "speedup" in summary
    # the terminal summary: its head, one line per workload and set, none wider than a terminal (paths aside)
    lines = proc.stdout.splitlines()
    assert any(line.lstrip().startswith("set") and "speed vs baseline" in line for line in lines)
    assert "gpt:tiny" in lines and any(line.strip().startswith("bf16") for line in lines)
    assert all(len(line) <= summary_mod.WIDTH for line in lines if out.name not in line), lines
    # both measurements, the references computed before the first trial and kept, and the report rendered
    assert all(r.speed and r.quality and r.parity for r in records)
    assert {r.quality.samples_trained for r in records if r.workload["name"] == "gpt"} == {20 * 16}
    assert len(list((out / "references").glob("*.json"))) == 3  # one per workload: seed 0, its batch
    assert (out / "report.md").exists() and (out / "report.html").exists()


def test_list_shows_workloads_and_techniques(cli):
    proc = cli("list")
    assert proc.returncode == 0, proc.stderr
    for word in ("mlp", "gpt", "cnn", "tiny", "grad_accum", "steps=4", "numeric", "checkpointing"):
        assert word in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workloads", "resnet"], "unknown workload 'resnet' (known: "),
        (["--techniques", "bf17"], "unknown technique 'bf17' (known: baseline, batch_size, best_of_n, bf16"),
        (["--techniques", "grad_accum:stepz=2"], "has no option 'stepz' (valid options: steps)"),
        (["--repeats", "0"], 'repeats must be a whole number of at least 1, or "auto"; got 0'),
        (["--repeats", "-1"], 'repeats must be a whole number of at least 1, or "auto"; got -1'),
        (["--resume"], "--resume needs --out"),
        (["--threshold", "2%"], "--threshold sets the A/B comparison's threshold (sweep --ab)"),
        (["--ab", ".", "--threshold", "150%"], "--threshold must be between 0% and 100%"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(cli, args, message):
    proc = cli("sweep", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_malformed_toml_exits_2(cli, tmp_path):
    bad = tmp_path / "sweep.toml"
    bad.write_text("repeats = [")
    proc = cli("sweep", "--config", str(bad))
    assert proc.returncode == 2 and "malformed TOML" in proc.stderr


def test_unknown_flag_exits_2(cli):
    proc = cli("sweep", "--bogus")
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr
    proc = cli("sweep", "--mode", "fast")
    assert proc.returncode == 2 and "argument --mode: invalid choice: 'fast'" in proc.stderr
