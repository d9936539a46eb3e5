"""A user's model read right (issue 48): what the records know about a set reaches its cell, the summary, the
terminal and "What to try next".

- a set on more cores than the reference (pp or ddp on 2 ranks beside a 1-thread baseline) is labelled with its
  resources and its ratio per core, and never counted "faster";
- a quality run that stayed contended gives no verdict at equal time or to the target from its clock, and says why;
  a contended quality run is trained again from a fresh build before it is kept;
- freeze on a model whose head is tied to its embedding: the advice names the frozen tied head, not "numerics";
- a model whose forward does not trace: the skip names the line that broke the trace, once per set, in one line;
- a model that computes its own loss: the pre-sweep check names the mismatch in the user's terms, and the declared
  model trains with its own optimizer and LR schedule;
- the bf16 claim explanation does not argue the opposite of the measurement.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.analyze import analysis, findings
from bench.core import words
from bench.records.frame import records_frame
from bench.records.results import ResultStore
from bench.report import cells
from bench.report.sections.summary import decisions
from bench.report.summary import rows_of, terminal
from tests.records import curve_of, record

CPU = torch.device("cpu")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _configs(records):
    return analysis.configurations(records_frame(records)).set_index("technique", drop=False)


def _analysis(records, tmp_path):
    from bench.records.reader import load

    out = tmp_path / "sweep"
    out.mkdir()
    store = ResultStore(out / "results.jsonl")
    for r in records:
        store.append(r)
    (out / "env.json").write_text(json.dumps({"hostname": "test", "cpu_model": "test CPU"}))
    return analysis.analyze(load([out]))


# ---- unequal resources -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["pp", "ddp"])
def test_more_cores_than_the_reference_is_labelled_and_never_counted_faster(label, tmp_path):
    """--threads 1: the baseline runs on 1 core, a 2-rank set on 2; its 1.28x is no speedup, and per core it is
    slower."""
    base = [record(seed=i, sps=100.0 + i, threads=1) for i in range(3)]
    wide = [record(label, seed=i, world_size=2, threads=1, sps=128.0 + i) for i in range(3)]
    c = _configs(base + wide).loc[label]
    assert c["speedup"] == pytest.approx(1.28, abs=0.01)
    assert c["speedup_verdict"] == words.UNEQUAL and c["speedup_verdict"] != "faster"
    assert (c["resource_unit"], c["resource_mine"], c["resource_ref"]) == ("core", 2, 1)
    assert c["speedup_per_unit"] == pytest.approx(0.64, abs=0.01) and c["speedup_per_unit_verdict"] == "slower"

    with words.marked():
        cell = cells.speedup_cell(c).text
    assert cell.startswith("1.28x") and "on 2 cores against 1: ⟦unequal resources⟧; per core 0.64x" in cell
    assert "⟦slower⟧" in cell and "⟦faster⟧" not in cell

    result = _analysis(base + wide, tmp_path)
    line = decisions(result)[0]
    assert "faster" not in line and "unequal resources 1" in line and "decided: 0 of 1" in line
    summary_row = next(r for r in rows_of(result.configs) if r.techniques == label)
    assert "unequal resources" in summary_row.speedup and "per core" in summary_row.speedup
    shown = "\n".join(terminal(result.configs, decided=decisions(result)))
    row = next(x for x in shown.splitlines() if x.strip().startswith(label))
    assert "1.28x on 2/1 cores" in row and "faster" not in row
    assert "unequal resources: 2 cores against 1" in shown
    advice = [f.text for f in result.findings if f.topic == "resources"]
    assert advice and "is not a speedup" in advice[0] and "give the reference 2 threads" in advice[0]


def test_equal_cores_across_ranks_are_a_plain_speedup():
    """Without --threads: the baseline takes 2 threads, each of 2 ranks 1: the same 2 cores, an ordinary verdict."""
    base = [record(seed=i, sps=100.0 + i) for i in range(3)]
    ddp = [record("ddp", seed=i, world_size=2, sps=150.0 + i) for i in range(3)]
    c = _configs(base + ddp).loc["ddp"]
    assert c["speedup_verdict"] == "faster" and c["resource_unit"] is None


# ---- a contended quality run -------------------------------------------------------------------------------------

BASE_CURVE = curve_of(0.8, 0.1, 640, 64, 2.0, points=4)


def test_a_contended_quality_run_gives_no_equal_time_verdict_and_says_why():
    """The reference's seed 1 shared the cores (49% used by others) after its retries: its 88 s clock is not this
    machine's. Equal time and time to target leave it out, and with 2 pairs left they decide nothing, saying why."""
    base = [record(seed=i, curve=curve_of(0.8, 0.1, 640, 64, 2.0 if i != 1 else 88.0, points=4), target=0.7,
                   ttt=1.5, quality_contention=0.49 if i == 1 else 0.0) for i in range(3)]
    algo = [record("curriculum", seed=i, kind="algorithmic", curve=curve_of(0.85 + 0.01 * i, 0.1, 640, 64, 2.0,
                                                                             points=4), target=0.7, ttt=1.0)
            for i in range(3)]
    c = _configs(base + algo).loc["curriculum"]
    assert c["delta_at_time_verdict"] == words.NONE
    assert "1 contended quality run left out (the reference's seed 1 49%" in c["delta_at_time_why"]
    assert c["ttt_ratio_verdict"] == words.NONE and "contended quality run" in c["ttt_ratio_why"]
    text = cells.quality_cell(c).text
    assert "at equal time" in text and "contended quality run left out" in text and "not this machine's" in text
    assert "contended quality run" in cells.ttt_cell(c).text
    assert any("contended quality run" in f for f in cells.flags(c))
    assert c["delta_verdict"] is not None  # equal samples does not read the clock: it keeps its 3 pairs
    # all the reference's quality runs contended: no equal-time value at all, and the cell still says why
    worse = [dataclasses.replace(r, quality=dataclasses.replace(r.quality, contended=True)) for r in base]
    c = _configs(worse + algo).loc["curriculum"]
    assert "at equal time: not compared (3 contended quality runs left out" in cells.quality_cell(c).text


def test_a_contended_quality_run_is_trained_again_from_a_fresh_build(monkeypatch, tmp_path):
    from bench import trial
    from bench.measure.timing import ContentionResult
    from bench.plan.config import Budget

    fractions = iter([0.5, 0.02])

    class Busy:
        def __init__(self, include_siblings: bool = False) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> ContentionResult:
            f = next(fractions, 0.0)
            return ContentionResult(other_cpu_s=f * 2.0, window_s=1.0, ncpu=2, fraction=f)

    monkeypatch.setattr(trial, "CpuContention", Busy)
    monkeypatch.setattr(trial, "CONTENTION_PAUSE_S", 0.0)
    first_alive = []  # after the rebuild, is the first build's model still held? (its memory would count twice)
    rebuild = trial._rebuild

    def watched(session):
        first = weakref.ref(session.model)
        rebuild(session)
        first_alive.append(first() is not None)

    monkeypatch.setattr(trial, "_rebuild", watched)
    budget = Budget(train_steps=4, eval_points=2, parity_steps=2, contention_retries=2, memory=False)
    spec = trial.TrialSpec(sweep_id="t", trial_id="t", workload="mlp", size="tiny", techniques=[], seed=0, repeat=0,
                           device="cpu", budget=dataclasses.asdict(budget), mode="quality",
                           reference_dir=str(tmp_path / "refs"))
    gc.freeze()  # as a trial in a process of its own does after its build: a frozen cycle is never collected
    try:
        r = trial.run(spec)
    finally:
        gc.unfreeze()
    assert r.status == "ok", r.reason
    assert first_alive == [False]
    assert r.quality.contention_retries == [0.5] and r.quality.contended is False
    assert r.quality.contention.fraction == pytest.approx(0.02)
    assert r.quality.steps_trained == 4 and r.parity is not None  # the fresh build's run, with its parity


# ---- diagnoses from what the record knows ------------------------------------------------------------------------


def test_freeze_with_a_tied_head_is_named_in_the_cell_and_the_advice(tmp_path):
    found = {"freeze": {"blocks": 1, "frozen_modules": ["wte", "blocks.0"], "frozen_by_tying": ["lm_head.weight"],
                        "frozen_params": 500, "trainable_params": 500}}
    base = [record(seed=i, final=0.80 + 0.001 * i, higher=True) for i in range(3)]
    frozen = [record("freeze", seed=i, kind="algorithmic", final=0.40 + 0.001 * i, higher=True,
                     technique_results=found) for i in range(3)]
    result = _analysis(base + frozen, tmp_path)
    c = result.configs.set_index("technique").loc["freeze"]
    assert c["delta_verdict"] == "worse"
    assert any("lm_head.weight" in x and "never trains" in x for x in c["caveats"])
    advice = next(f.text for f in result.findings if f.topic == "quality")
    assert "lm_head.weight" in advice and "numerics" not in advice
    row = next(r for r in rows_of(result.configs) if r.techniques == "freeze")
    assert "lm_head.weight" in row.note


def test_a_technique_that_changes_the_models_size_says_so():
    base = [record(seed=i, sps=100.0 + i, n_params=1000) for i in range(3)]
    lean = [record("efficient_arch", seed=i, kind="algorithmic", sps=150.0 + i, n_params=1000, trained_params=600)
            for i in range(3)]
    c = _configs(base + lean).loc["efficient_arch"]
    assert any("600 parameters, 0.60x the workload's 1,000" in x for x in c["caveats"])


def test_the_bf16_claim_explanation_does_not_argue_the_opposite_of_the_measurement():
    from techniques.base import Claim

    claim = Claim("speedup", 1.5, 2.0, "A100 GPU", "source")
    config = type("C", (), {"compute_dtype": "bfloat16", "machine": "cpu", "one_off_s": None, "world_size": 1})()
    env = {"peak_flops": {"float32": {"flops": 99e9}, "bfloat16": {"flops": 198e9}}}
    reasons = findings.why_hardware_differs("bf16", claim, config, None, env)
    assert reasons[0].startswith("bfloat16 matmul peaks at 198 GFLOP/s here vs 99 for float32 (2x), so the "
                                 "matmuls are not what held it back")


# ---- a forward that does not trace -------------------------------------------------------------------------------


class Untraceable(nn.Module):
    """nanoGPT's shape: an assert on the sequence length in the model's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2))
        self.head = nn.Linear(16, 20)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.size()
        assert t <= 64, "too long"
        x = self.embed(idx)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_a_trace_failure_skip_names_its_line_once_per_set_in_one_line(tmp_path):
    import inspect

    from bench.core.structure import infer
    from bench.report import build as build_report
    from bench.report import markdown
    from techniques.base import Context
    from techniques.mtp import MTP
    from techniques.pp import PP

    line = inspect.getsourcelines(Untraceable.forward)[1] + 2
    s = infer(Untraceable(), "blocks")
    assert s.mlp is not None  # each block still traces: its MLP is found
    for tech, ctx in ((MTP(), Context(device=CPU, structure=s)),
                      (PP(), Context(device=CPU, structure=s, world_size=2))):
        reason = tech.check(ctx)
        assert reason and f"test_model_reading.py:{line} (assert t <= 64, \"too long\")" in reason, reason
        assert "\n" not in reason and "`" not in reason and len(reason) < 400

    why = f"mtp: {MTP().check(Context(device=CPU, structure=s))}"
    base = [record(seed=i, sps=100.0) for i in range(3)]
    skipped = [record("mtp", seed=i, status="skipped", reason=why) for i in range(3)]
    out = tmp_path / "sweep"
    out.mkdir()
    store = ResultStore(out / "results.jsonl")
    for r in base + skipped:
        store.append(r)
    (out / "env.json").write_text(json.dumps({"hostname": "test"}))
    text = markdown.render(build_report([out])[1])
    rows = [x for x in text.split("## Failures and skips")[1].splitlines() if x.startswith("| mlp:tiny | mtp")]
    assert len(rows) == 1 and "| 0, 1, 2 | skipped |" in rows[0] and f"test\\_model\\_reading.py:{line}" not in rows[0]
    assert f"test_model_reading.py:{line}" in rows[0] and "\\`" not in rows[0]
    advice = text.split("## What to try next")[1].split("\n## ")[0]
    assert "mtp on mlp:tiny skipped: needs the model's" in advice and f"test_model_reading.py:{line}" in advice


# ---- a model that computes its own loss ----------------------------------------------------------------------


def test_the_check_names_a_forward_that_returns_its_own_loss(tmp_path):
    from bench.plan import plugins
    from bench.plan import user_models as user

    path = tmp_path / "own_loss.py"
    path.write_text(f'''
import sys
sys.path.insert(0, {str(EXAMPLES)!r})
import torch.nn.functional as F
from nanogpt_chars import build as nanogpt

def wrapped():  # a plain loss beside a model whose forward without targets returns the last position only
    spec = nanogpt("tiny")
    del spec["forward_targets"]
    spec["loss"] = lambda out, y: F.cross_entropy(out[0].view(-1, out[0].size(-1)), y.view(-1))
    return spec

def wrong_name():
    return {{**nanogpt("tiny"), "forward_targets": "labels"}}
''')
    with pytest.raises(plugins.PluginError) as caught:
        user.check(user.parse_model(f"wrapped={path}:wrapped"), user.DEFAULT_SIZE, CPU)
    text = str(caught.value)
    assert "loss(output, targets) raised ValueError: Expected input batch_size (16) to match target batch_size" in text
    assert "the forward, called without targets, returned a tuple (tensor [16, 1, " in text
    assert "the targets are tensor [16, 32]" in text
    assert "the forward takes 'targets': if the model computes its own loss, return forward_targets='targets'" in text
    with pytest.raises(plugins.PluginError, match=r"forward_targets='labels', but the model's forward takes "
                                                  r"\(idx, targets\)"):
        user.check(user.parse_model(f"wrong_name={path}:wrong_name"), user.DEFAULT_SIZE, CPU)


def test_a_model_with_its_own_loss_optimizer_and_schedule_trains_with_them():
    from bench.loop import TrainLoop, build_optimizer, recipe
    from bench.plan import user_models as user
    from techniques import get
    from techniques.base import Context

    wl = user.register_model(user.parse_model(f"nanogpt_own={EXAMPLES / 'nanogpt_chars.py'}:build"))()
    built = wl.build("tiny", 0, CPU)
    assert built.forward_targets == "targets" and built.lr == pytest.approx(3e-3)
    opt = build_optimizer(built.model, [], Context(device=CPU), built.lr, built=built)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0] and opt.defaults["betas"] == (0.9, 0.95)
    loop = TrainLoop(built.model, opt, built.loss_fn, [], Context(device=CPU), tokens_per_sample=32,
                     forward_targets=built.forward_targets, schedule=built.schedule)
    batches = built.batches(built.batch_size, 0)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        assert torch.isfinite(loop.step(next(batches)))
    assert lrs[0] < lrs[1] < lrs[2] <= 3e-3  # the warm-up of its own schedule
    # a technique that owns the LR replaces the build's schedule; a technique that builds the optimizer from the
    # default keeps its groups (fused AdamW: the same recipe)
    owner = get("lr_schedule")()
    ctx = Context(device=CPU, total_steps=10, state={"lr": built.lr})
    fresh = wl.build("tiny", 0, CPU)
    opt2 = build_optimizer(fresh.model, [owner], ctx, fresh.lr, built=fresh)
    loop2 = TrainLoop(fresh.model, opt2, fresh.loss_fn, [owner], ctx, forward_targets="targets",
                      schedule=fresh.schedule)
    assert loop2.scheduler is None
    assert recipe(opt2)["groups"][0]["weight_decay"] == 0.1


# ---- threads and noise, and the small things -------------------------------------------------------------------


def test_threads_that_outnumber_the_free_cores_are_warned_about_naming_threads(monkeypatch):
    from bench.measure import timing
    from bench.measure.timing import ContentionResult
    from bench.plan.config import build_config
    from bench.run import workflow

    class HalfBusy:  # another process keeps one of the two cores busy
        def __init__(self, *args, **kwargs) -> None:
            pass

        def start(self) -> None:
            pass

        def stop(self) -> ContentionResult:
            return ContentionResult(other_cpu_s=0.5, window_s=0.5, ncpu=2, fraction=0.5)

    monkeypatch.setattr(timing, "CpuContention", HalfBusy)
    monkeypatch.setattr(timing, "allowed_cpus", lambda: [0, 1])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    warned = workflow.oversubscription(build_config("quick", {}), sample_s=0.0)
    assert warned and "2 thread(s) on 2 core(s), while other processes keep about 1.0 of them busy" in warned
    assert "use --threads 1" in warned
    assert workflow.oversubscription(build_config("quick", {"threads": 1}), sample_s=0.0) is None


def test_compare_says_when_the_calibrated_peak_moved_more_than_the_noise():
    from bench.analyze.compare import peak_moves

    def env(fp32: float) -> dict:
        return {"peak_flops": {"float32": {"flops": fp32}, "bfloat16": {"flops": 20e9}}}

    moved = peak_moves(env(198e9), env(215e9), noise=0.03, threshold=0.05)
    assert len(moved) == 1 and moved[0].startswith("the calibrated float32 matmul peak moved from 198 to 215 GFLOP/s "
                                                   "(+8.6%) between the two sweeps, more than the 3.0% noise")
    assert "MFU is not comparable" in moved[0]
    assert peak_moves(env(198e9), env(202e9), noise=0.03, threshold=0.05) == []  # within the noise


def test_list_keeps_an_install_hint_and_says_what_runs_on_a_users_model(cli):
    proc = cli("list", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "(pip install 'trainbench')" not in proc.stdout  # rich would read [deepspeed] as markup
    proc = cli("list", "--device", "cpu", "--model", str(EXAMPLES / "nanogpt_chars.py") + ":build")
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    assert "techniques run on nanogpt_chars:small" in text
    mtp = next(line for line in proc.stdout.splitlines() if line.startswith("│ mtp "))
    assert "no: mtp:" in mtp  # the table wraps the reason over lines; its words are there
    line = next(i for i, x in enumerate((EXAMPLES / "nanogpt_chars.py").read_text().splitlines(), 1)
                if x.strip().startswith("assert t <="))
    assert f"(nanogpt_chars.py:{line} (assert t <=" in text  # the line that broke the trace, named


def test_the_help_of_nproc_names_tp_and_pp(cli):
    proc = cli("sweep", "--help")
    text = " ".join(proc.stdout.split())
    assert "model parallel (tp, pp)" in text


def test_progress_off_a_terminal_is_one_line_per_finished_trial(capsys):
    from bench.cli import sweep as sweep_cli

    assert not sweep_cli.err.is_terminal  # pytest captures stderr: no terminal
    with sweep_cli._progress_bar() as show:
        show(3, 0, "measuring")
        show(3, 1, "mlp:tiny/baseline/seed0/r0: ok 100 samples/s")
        show(3, 1, "mlp:tiny/baseline/seed0/r0: ok 100 samples/s")
        show(3, 2, "mlp:tiny/bf16/seed0/r0: ok 90 samples/s")
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["[0/3]", "[1/3]", "[2/3]"]
    assert lines[2].endswith("mlp:tiny/bf16/seed0/r0: ok 90 samples/s")
