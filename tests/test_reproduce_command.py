"""``python -m bench reproduce DIR``: a sweep's recorded configuration run again into a new directory and compared
with the recorded run, each configuration answered reproduced / differs / cannot tell (bench.report.reproduce
words them). The sweeps here are made in tmp_path: hand-made records for the answers (the trials' run replaced, so
the test takes seconds), one real tiny sweep for the whole path (slow)."""

from __future__ import annotations

import json
import re

import pytest

from bench.analyze import compare
from bench.cli import main
from bench.plan.config import build_config
from bench.records.results import ResultStore
from bench.report.reproduce import machine_difference, reproduce_answer
from bench.run import runner as runner_mod
from tests.conftest import run_cli
from tests.records import record

RECORDED = "python -m bench sweep --preset smoke --workloads mlp,gpt --techniques bf16 --repeats 4 --out /tmp/x"
COMMITTED_SPS = {  # configuration -> samples/s per seed (the committed run)
    ("mlp", "baseline"): [100.0, 102.0, 98.0, 101.0],
    ("mlp", "bf16"): [150.0, 152.0, 149.0, 151.0],
    ("gpt", "baseline"): [50.0, 51.0, 49.0, 50.0],
    ("gpt", "bf16"): [60.0, 61.0],
}
NEW_FACTOR = {  # the new run's samples/s over the committed run's, seed by seed
    ("mlp", "baseline"): [1.0, 1.01, 0.99, 1.0],  # the same: reproduced
    ("mlp", "bf16"): [0.70, 0.71, 0.69, 0.70],  # 30% slower: differs
    ("gpt", "baseline"): [1.0, 1.3, 0.8, 1.1],  # too noisy to tell: inconclusive
    ("gpt", "bf16"): [1.0, 1.0],  # 2 pairs: too few for a verdict
}


def _write_sweep(d, factor=None, cpu="AMD EPYC 9B14", command=RECORDED):
    d.mkdir(parents=True, exist_ok=True)
    cfg = build_config("smoke", {"workloads": "mlp,gpt", "techniques": "bf16", "repeats": 4})
    (d / "sweep.toml").write_text(cfg.to_toml())
    (d / "env.json").write_text(json.dumps({"command": command, "device": "cpu", "cpu_model": cpu,
                                            "torch": "2.13.0"}))
    store = ResultStore(d / "results.jsonl")
    for (workload, label), values in COMMITTED_SPS.items():
        for seed, sps in enumerate(values):
            scale = factor[(workload, label)][seed] if factor else 1.0
            store.append(record(label, seed, workload=workload, sweep_id=d.name, sps=sps * scale, final=0.5))
    return store.read()


@pytest.fixture
def committed(tmp_path):
    d = tmp_path / "example"
    _write_sweep(d)
    return d


@pytest.fixture
def no_trials(monkeypatch):
    """The new run's trials replaced by hand-made records (the committed ones scaled by NEW_FACTOR) on another CPU:
    everything else (the claim, sweep.toml, summary.md, the report, the comparison, the answers) runs."""

    def run(self, on_progress=None):
        if not self.claimed:
            self.claim()
        try:
            return _write_sweep(self.out_dir, NEW_FACTOR, cpu="Intel Xeon 8488C", command=self.command)
        finally:
            self.close()

    monkeypatch.setattr(runner_mod.SweepRunner, "run", run)


def _answers(stdout: str) -> dict[str, tuple[str, str]]:
    """{configuration: (answer, what it rests on)} from the printed rows (a row's detail may wrap onto the next
    lines, indented under it); every line fits 100 columns."""
    rows: dict[str, tuple[str, str]] = {}
    last = None
    for line in stdout.splitlines():
        assert len(line) <= 100, line
        m = re.match(r"^(\S+ \S+)\s{2,}(reproduced|differs|cannot tell)\s+(.*)$", line)
        if m:
            last = m.group(1)
            rows[last] = (m.group(2), m.group(3))
        elif last and line.startswith(" "):
            rows[last] = (rows[last][0], rows[last][1] + " " + line.strip())
        else:
            last = None
    return rows


def test_each_configuration_is_answered_after_a_line_naming_the_machine_difference(committed, no_trials, tmp_path,
                                                                                   capsys):
    new = tmp_path / "new"
    assert main(["reproduce", str(committed), "--out", str(new)]) == 0
    captured = capsys.readouterr()
    print(captured.out)  # the output a user sees (-s shows it)
    lines = captured.out.splitlines()
    machine = [i for i, line in enumerate(lines) if line.startswith("machine:")]
    table = next(i for i, line in enumerate(lines) if "configuration" in line)
    assert len(machine) == 1 and machine[0] < table
    assert "cpu_model 'AMD EPYC 9B14' -> 'Intel Xeon 8488C'" in " ".join(x.strip() for x in lines[:table])
    answers = _answers(captured.out)
    assert answers["mlp:tiny baseline"][0] == "reproduced"
    assert answers["mlp:tiny baseline"][1].endswith("equivalent within +-5%")
    assert answers["mlp:tiny bf16"][0] == "differs" and "0.70x [" in answers["mlp:tiny bf16"][1]
    assert "slower" in answers["mlp:tiny bf16"][1]
    assert answers["gpt:tiny baseline"][0] == "cannot tell"
    assert re.search(r"inconclusive: .*; about \d+ pairs would decide it", answers["gpt:tiny baseline"][1])
    assert answers["gpt:tiny bf16"][0] == "cannot tell"
    assert "too few pairs (2 pairs: a verdict needs 3)" in answers["gpt:tiny bf16"][1]
    # the new run is a sweep directory of its own, recording the command that makes it again
    assert {"results.jsonl", "sweep.toml", "summary.md", "report.md"} <= {p.name for p in new.iterdir()}
    assert json.loads((new / "env.json").read_text())["command"] == (
        "python -m bench sweep --preset smoke --workloads mlp,gpt --techniques bf16 --repeats 4 --config "
        f"{committed}/sweep.toml --out {new}")


def test_one_side_of_an_ab_run_is_rerun_as_a_sweep_of_its_own(tmp_path, no_trials, capsys):
    side = tmp_path / "ab" / "a"
    _write_sweep(side, command="python -m bench sweep --ab . --preset smoke --workloads mlp,gpt --techniques bf16 "
                               "--repeats 4 --threshold 2% --out /tmp/ab")
    assert main(["reproduce", str(side), "--out", str(tmp_path / "new")]) == 0
    assert "reproduced" in capsys.readouterr().out
    command = json.loads((tmp_path / "new" / "env.json").read_text())["command"]
    assert "--ab" not in command and "--threshold" not in command and not (tmp_path / "new" / "a").exists()


def test_the_answers_words():
    def answer(base, new):
        q = compare._quantity("throughput", "samples/s", dict(enumerate(base)), dict(enumerate(new)), 0.05,
                              "faster", "slower", "slower")
        return reproduce_answer(q, 0.05)

    assert answer([100, 101, 99], [100, 101, 99]) == (
        "reproduced", "1.00x [1.00, 1.00] new/committed (3 pairs): equivalent within +-5%")
    assert answer([100, 101, 99], [130, 132, 128])[0] == "differs"
    assert answer([100, 101, 99], [130, 132, 128])[1].endswith(": faster, beyond +-5%")
    word, detail = answer([100, 101, 99], [100, 140, 80])
    assert word == "cannot tell" and detail.startswith("inconclusive: ") and "pairs would decide it" in detail
    assert answer([100], [100]) == ("cannot tell", "no verdict, too few trials (1 repeat: a verdict needs 3); 1.00x "
                                                   "new/committed (1 trial), an estimate")
    assert answer([], [100]) == ("cannot tell", "throughput not measured on the committed run")
    assert machine_difference([]) is None
    diff = [compare.EnvDifference("torch", "2.13.0", None, "environment")]
    assert machine_difference(diff).startswith("machine: this run's differs from the committed run's (torch "
                                               "'2.13.0' -> (absent))")


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: None, "is not a directory"),
    (lambda d: d.mkdir(), "holds no sweep.toml, so no recorded configuration to rerun"),
    (lambda d: (d.mkdir(), (d / "sweep.toml").write_text("name = 'x'\n")), "has no results.jsonl"),
    (lambda d: _write_sweep(d, command="python -m bench sweep --model /gone/lstm.py:build --out /tmp/x"),
     "the file '/gone/lstm.py' does not exist"),
    (lambda d: _write_sweep(d, command="python -m bench sweep --no-such-flag --out /tmp/x"),
     "its recorded command no longer parses (unrecognized arguments: --no-such-flag)"),
], ids=["not a directory", "no sweep.toml", "no records", "a model file since deleted", "a flag since removed"])
def test_bad_input_is_one_line_exit_2_and_nothing_is_run(tmp_path, capsys, make, message):
    d = tmp_path / "sweep"
    make(d)
    new = tmp_path / "new"
    assert main(["reproduce", str(d), "--out", str(new)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not new.exists()


@pytest.mark.slow
def test_a_real_tiny_sweep_reproduces_end_to_end(tmp_path):
    committed = tmp_path / "committed"
    flags = ["--preset", "smoke", "--workloads", "mlp", "--techniques", "baseline", "--repeats", "3", "--steps", "4",
             "--eval-points", "1", "--window-steps", "3", "--window-seconds", "0.05", "--no-memory"]
    done = run_cli("sweep", *flags, "--out", str(committed), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    again = run_cli("reproduce", str(committed), "--out", str(tmp_path / "new"), timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    print(again.stdout)
    answers = _answers(again.stdout)
    assert list(answers) == ["mlp:tiny baseline"]
    assert answers["mlp:tiny baseline"][0] in ("reproduced", "differs", "cannot tell")
    assert "machine:" not in again.stdout  # the same machine
    assert (tmp_path / "new" / "report.md").is_file()
