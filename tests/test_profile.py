"""``python -m bench profile``: the trace holds the labelled phases, the files hold the breakdown, the top
operators and a diagnosis; bad input is one line and exit code 2."""

from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench.measure.phases import PHASES


def test_profile_writes_a_trace_with_the_labelled_phases(tmp_path, capsys):
    out = tmp_path / "prof"
    code = main(["profile", "mlp:tiny", "--steps", "2", "--phase-steps", "4", "--warmup", "1", "--out", str(out),
                 "--threads", "1"])
    assert code == 0
    trace = json.loads((out / "trace.json").read_text())  # loads as JSON: Chrome / Perfetto's format
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"data", "h2d", "forward", "backward", "optimizer"} <= names
    assert any(n and n.startswith("aten::") for n in names)
    found = json.loads((out / "profile.json").read_text())
    phases = found["phases"]
    assert phases["steps"] == 4 and set(phases["share"]) == set(PHASES)
    assert sum(phases["share"].values()) == pytest.approx(1.0)
    assert found["top_ops"] and all(op["name"] not in PHASES for op in found["top_ops"])
    assert found["top_ops"][0]["self_s"] >= found["top_ops"][-1]["self_s"]
    assert found["self_time_by"] == "cpu" and found["profiled_steps"] == 2
    md = (out / "profile.md").read_text()
    assert "**Diagnosis:**" in md and "| forward |" in md
    printed = capsys.readouterr().out
    assert "diagnosis:" in printed and str(out / "trace.json") in printed


def test_profile_applies_the_technique_set(tmp_path):
    calls = {}
    for label in ("baseline", "grad_accum:steps=4"):
        out = tmp_path / label.replace(":", "_")
        assert main(["profile", "mlp:tiny", "--techniques", label, "--steps", "1", "--phase-steps", "2",
                     "--warmup", "1", "--out", str(out)]) == 0
        found = json.loads((out / "profile.json").read_text())
        assert found["techniques"] == label
        calls[label] = {op["name"]: op["calls"] for op in found["top_ops"]}
    base = calls["baseline"]["aten::addmm"]  # one per Linear layer's forward
    assert base > 0 and calls["grad_accum:steps=4"]["aten::addmm"] == 4 * base  # four micro-batches per step


@pytest.mark.parametrize(("argv", "message"), [
    (["profile"], "name a workload"),
    (["profile", "mlp:tiny,gpt:tiny"], "one workload at a time"),
    (["profile", "mlp:tiny", "--techniques", "bf16,compile"], "one technique set at a time"),
    (["profile", "mlp:tiny", "--steps", "0"], "--steps must be >= 1"),
    (["profile", "mlp:tiny", "--techniques", "ddp"], "several processes"),
    (["profile", "mlp:tiny", "--techniques", "tf32"], "cannot run on mlp:tiny here"),
    (["profile", "nope:tiny"], "unknown workload"),
    (["profile", "mlp:tiny", "--warmup", "0"], "--warmup must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    code = main([*argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["profile", "mlp:tiny", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a file, not a directory" in err and len(err.splitlines()) == 1


def test_a_technique_refusing_the_model_at_build_is_one_line(tmp_path, capsys):
    model = tmp_path / "gen.py"
    model.write_text(
        "import torch\nimport torch.nn.functional as F\n"
        "def build(size='s', seed=0):\n"
        "    def batches(batch_size, seed):\n"
        "        while True:\n"
        "            yield torch.randn(batch_size, 4), torch.randint(0, 2, (batch_size,))\n"
        "    return dict(model=torch.nn.Linear(4, 2), train_data=batches, loss=F.cross_entropy,\n"
        "                evaluate=lambda m: {'acc': 0.5}, metric='acc', higher_is_better=True, batch_size=8)\n")
    code = main(["profile", "--model", f"{model}:build", "--techniques", "loader", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot run on" in err and "Dataset" in err and len(err.splitlines()) == 1, err

