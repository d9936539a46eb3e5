"""``python -m bench profile``: the trace holds the labelled phases, the files hold the breakdown, the top
operators and a diagnosis; bad input is one line and exit code 2. On a GPU the diagnosis reads the device's busy
time: checked on the recorded H200 profile (tests/fixtures/h200-profile/), and on a GPU where one is at hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.measure import trace as trace_mod
from bench.measure.phases import PHASES
from bench.records.results import PhaseResult
from bench.run import profile as profile_mod

FIXTURE = Path(__file__).parent / "fixtures" / "h200-profile"


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
    assert sum(op["share"] for op in found["top_ops"]) <= 1.0 + 1e-9 and found["profiled_steps"] == 2
    # on CPU there is no device to be idle: no kernel table, no busy figures, and the diagnosis does not ask
    assert found["top_kernels"] == [] and found["trace_busy"] is None and phases["device_busy"] is None
    md = (out / "profile.md").read_text()
    assert "**Diagnosis:**" in md and "| forward |" in md and "Host operators by self CPU time" in md
    assert "Device busy" not in md and "Device kernels" not in md
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



# ---- the recorded H200 profile: a GPU left idle is not compute-bound -------------------------------------------


def _recorded() -> tuple[dict, PhaseResult, list[dict]]:
    found = json.loads((FIXTURE / "profile.json").read_text())
    return found, PhaseResult(**found["phases"]), trace_mod.load(FIXTURE / "trace.json.gz")


def test_the_recorded_bf16_step_leaves_the_gpu_idle_and_says_so():
    """``bench profile gpt:gpt2-124m --techniques bf16`` at batch 8 on an H200 said "compute-bound: 77% of the step
    is forward and backward" while its GPU ran at 17% of its datasheet peak. Its trace says the device was busy
    25% of the profiled steps with kernels of 20 us on average: launch-bound, with the remedies for that."""
    found, phases, events = _recorded()
    assert phases.diagnosis.startswith("compute-bound")  # what it said that day
    assert phases.device_busy is None  # that profile measured no busy time
    busy, kernels = profile_mod.read_trace(events)
    fixed = profile_mod.with_trace_busy(phases, busy, ("bf16",), found["device"])
    assert fixed.device_busy == pytest.approx(0.2546, abs=1e-4) and "lower bound" in fixed.device_source
    line = fixed.diagnosis
    assert line.startswith("launch-bound: the GPU is busy 25% of the step"), line
    assert "compute-bound" not in line and "kernels average 20 us" in line
    assert "a larger batch" in line and "compile:mode=reduce-overhead" in line and "fused_adamw" in line
    assert "bf16" not in line.split(";", 1)[1]  # the set's own technique is not offered again
    # the same device time against the unprofiled phase pass's step (no profiler slowing the host): still idle
    unprofiled = busy.busy_s / phases.step_s
    assert unprofiled == pytest.approx(0.43, abs=0.01)
    again = profile_mod.diagnose(phases.share, ("bf16",), "cuda", busy=unprofiled, op_s=busy.mean_op_s)
    assert again.startswith("launch-bound: the GPU is busy 43%")


def test_the_recorded_profile_renders_one_kind_of_event_per_table():
    found, phases, events = _recorded()
    busy, kernels = profile_mod.read_trace(events)
    result = profile_mod.Profile(
        workload=found["workload"], techniques=found["techniques"], device=found["device"], threads=16,
        batch_size=8, warmup_s=found["warmup_s"], phases=profile_mod.with_trace_busy(phases, busy, ("bf16",), "cuda"),
        profiled_steps=2, top_ops=[], top_kernels=kernels, trace_busy=busy, trace="trace.json", created_utc="")
    md = profile_mod.to_markdown(result)
    assert "**Diagnosis:** launch-bound" in md
    assert "**Device busy:** 25% of the step: 17.65 ms of kernels, copies and memsets per step, 863 of them " \
           "averaging 20 us (trace of 2 profiled steps" in md
    kernel_part = md.split("## Device kernels", 1)[1].split("Trace:", 1)[0]
    assert "aten::" not in kernel_part and "`reduce_kernel<…>`" in kernel_part
    assert "| forward | 11.94 | 11.16 | 1.66 | 29.2% | 4.82 |" in md  # the device time forward launched
    assert "| other | 0.81 | 0.81 | 0.07 | 2.0% | - |" in md  # "other" launches nothing by itself
    assert "nvjet_sm90" in md and "GammaBetaBackwardCUDAKernelTemplate<…>" in md
    saved = json.loads(json.dumps(dataclasses.asdict(result)))
    assert saved["top_kernels"][0]["name"].startswith("cudnn_generated")  # full names in profile.json
    assert saved["phases"]["device_busy"] == pytest.approx(0.2546, abs=1e-4)


@pytest.mark.gpu
def test_profile_on_a_gpu_measures_the_device_busy_time(tmp_path):
    """Not yet run on a GPU. The device-busy pass and the trace both see the kernels of a CUDA step."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "prof"
    assert main(["profile", "gpt:tiny", "--device", "cuda", "--steps", "2", "--phase-steps", "4", "--warmup", "2",
                 "--out", str(out)]) == 0
    found = json.loads((out / "profile.json").read_text())
    phases = found["phases"]
    assert 0.0 < phases["device_busy"] <= 1.0 and phases["device_ops_per_step"] > 0
    assert phases["device_source"].startswith("CUDA activity over")
    assert found["trace_busy"]["ops_per_step"] > 0 and found["top_kernels"]
    assert not any(k["name"].startswith("aten::") for k in found["top_kernels"])
    assert not phases["diagnosis"].startswith("forward and backward take")  # busy is known: no "unknown"
