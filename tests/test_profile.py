"""``python -m bench profile``: the trace holds the labelled phases, the files hold the breakdown, the top
operators and a diagnosis; bad input is one line and exit code 2."""

from __future__ import annotations

import json

import pytest

from bench.bottleneck import PHASES
from bench.cli import main


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
    out = tmp_path / "ga"
    assert main(["profile", "mlp:tiny", "--techniques", "grad_accum:steps=4", "--steps", "1", "--phase-steps",
                 "2", "--warmup", "1", "--out", str(out)]) == 0
    found = json.loads((out / "profile.json").read_text())
    assert found["techniques"] == "grad_accum:steps=4"
    calls = {op["name"]: op["calls"] for op in found["top_ops"]}
    assert calls.get("aten::addmm", 0) % 4 == 0  # four micro-batches per step: forward matmuls come in fours


@pytest.mark.parametrize(("argv", "message"), [
    (["profile"], "name a workload"),
    (["profile", "mlp:tiny,gpt:tiny"], "one workload at a time"),
    (["profile", "mlp:tiny", "--techniques", "bf16,compile"], "one technique set at a time"),
    (["profile", "mlp:tiny", "--steps", "0"], "--steps must be >= 1"),
    (["profile", "mlp:tiny", "--techniques", "ddp"], "several processes"),
    (["profile", "mlp:tiny", "--techniques", "tf32"], "cannot run on mlp:tiny here"),
    (["profile", "nope:tiny"], "unknown workload"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    code = main([*argv, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()
