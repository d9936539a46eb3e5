"""Pipeline parallelism (``pp``): gpt:tiny split over 2 real gloo ranks (torchrun) against one process.

- both schedules give one process's per-step losses (rtol 1e-4), parameters (atol 1e-4, as ddp's test) and
  held-out loss at the same global batch, on every rank, with the tied head's copy equal to stage 0's embedding;
- each step runs every micro-batch exactly once forward and once backward (hooks on the stage module), in the
  schedule's order (GPipe: all forwards first; 1F1B: one forward, one backward after the warm-up);
- a rank's parameter bytes are its stage's, computed from the model here, and the layers it does not own are freed;
- the bubble formula, the planning reasons (one process, another model, too few layers, an uneven batch), and the
  loop's ``forward_backward`` hook contract in one process;
- (slow) one trial through the real runner: status ok, parity passes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from bench import workloads
from bench.loop import TrainLoop, build_optimizer
from techniques import get
from techniques.base import Context, Technique, TrainConfig
from techniques.pp import PP, bubble_formula, pipeline_problem, stage_layers
from tests.conftest import REPO, TINY_BUDGET
from tests.helpers import whole_batch_trial
from tests.pp_worker import BATCH, MICROBATCHES, STEPS

CPU = torch.device("cpu")


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


@pytest.fixture(scope="module")
def one_process():
    built = workloads.get("gpt").build("tiny", 0, CPU)
    ctx = Context(device=CPU)
    loop = TrainLoop(built.model, build_optimizer(built.model, [], ctx, built.lr), built.loss_fn, [], ctx)
    batches = built.batches(BATCH, 0)
    losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
    built.model.eval()
    with torch.no_grad():
        val_loss = built.evaluate(built.model)["val_loss"]
    params = {k: v.detach().clone() for k, v in built.model.named_parameters()}
    return losses, params, val_loss


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def two_ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"pp-{request.param}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "tests" / "pp_worker.py"), request.param, str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    params = [torch.load(out / f"params_rank{r}.pt") for r in (0, 1)]
    return request.param, ranks, params, json.loads((out / "results.json").read_text())


@pytest.mark.distributed
def test_pp_trains_like_one_process(two_ranks, one_process):
    _, ranks, params, _ = two_ranks
    losses, expected, val_loss = one_process
    for rank in ranks:  # every rank returns the step's loss (the trial averages them over ranks)
        assert rank["losses"] == pytest.approx(losses, rel=1e-4)
        assert rank["val_loss"] == pytest.approx(val_loss, rel=1e-4)  # evaluation through eval_model
    first, last = params
    assert set(first) | set(last) == set(expected) | {"head.weight"} and not set(first) & set(last)
    for key, value in {**first, **last}.items():
        assert torch.allclose(value, expected["wte.weight" if key == "head.weight" else key], atol=1e-4), key
    assert torch.equal(first["wte.weight"], last["head.weight"]), "the tied copies drifted apart"


@pytest.mark.distributed
def test_every_micro_batch_runs_once_forward_and_once_backward(two_ranks):
    schedule, ranks, _, _ = two_ranks
    for rank in ranks:
        assert rank["counts"] == [{"forward": MICROBATCHES, "backward": MICROBATCHES}] * STEPS
        trace = [tuple(a) for a in rank["trace"]]
        for op in ("F", "B"):
            assert sorted(mb for o, mb in trace if o == op) == list(range(MICROBATCHES))
    first, last = ([tuple(a) for a in r["trace"]] for r in ranks)
    if schedule == "gpipe":  # fill, then drain
        assert first == last == [("F", i) for i in range(4)] + [("B", i) for i in range(4)]
    else:  # 1F1B: stage s warms up with p - s forwards, then alternates
        assert first == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
        assert last == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]


@pytest.mark.distributed
def test_each_rank_holds_only_its_stage(two_ranks):
    _, ranks, _, results = two_ranks
    gpt = workloads.get("gpt").build("tiny", 0, CPU).model
    first = _bytes([gpt.wte.weight, gpt.wpe.weight, *gpt.blocks[0].parameters()])
    last = _bytes([*gpt.blocks[1].parameters(), *gpt.ln_f.parameters(), gpt.head.weight])  # head: the tied copy
    for rank, expected in zip(ranks, (first, last), strict=True):
        assert rank["param_bytes"] == rank["gpt_param_bytes"] == expected  # the workload's model itself shrank
        assert rank["freed"], "a layer this rank does not own is still alive"
    assert results["per_stage"]["param_bytes_per_stage"] == [first, last]
    # per step, each rank sends m micro-batches of (B/m, T, d_model) fp32: activations forward or gradients back
    sent = MICROBATCHES * (BATCH // MICROBATCHES) * gpt.cfg.seq_len * gpt.cfg.d_model * 4
    assert results["per_stage"]["sent_bytes_per_step_per_stage"] == [sent, sent]
    assert results["per_stage"]["tied_grad_allreduce_bytes_per_stage"] == [_bytes([gpt.wte.weight])] * 2
    bubble = results["bubble"]
    assert bubble["formula"] == pytest.approx(1 / 5)
    assert len(bubble["measured_per_stage"]) == 2 and all(0 <= b < 1 for b in bubble["measured_per_stage"])


def test_bubble_formula_and_stage_split():
    assert bubble_formula(2, 4) == pytest.approx(0.2)
    assert bubble_formula(4, 8) == pytest.approx(3 / 11)
    assert bubble_formula(1, 8) == 0.0
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]


def test_planning_reasons():
    def reason(world=2, workload="gpt", names=("pp",), **options):
        ctx = Context(device=CPU, workload=workload, world_size=world, technique_names=names)
        return PP(PP.Options(**options)).check(ctx)

    assert reason() is None and reason(schedule="gpipe", microbatches=1) is None
    assert "needs several processes" in reason(world=1)
    assert "another structure" in reason(workload="mlp")
    assert "1f1b needs at least as many micro-batches as stages" in reason(world=4, microbatches=2)
    assert "bf16 changes them (forward_context)" in reason(names=("pp", "bf16"))
    with pytest.raises(ValueError, match="does not split into 3 equal micro-batches"):
        PP(PP.Options(microbatches=3)).configure(TrainConfig(batch_size=16))
    gpt = workloads.get("gpt").build("tiny", 0, CPU).model
    assert "2 blocks, fewer than the 4 pipeline stages" in pipeline_problem(gpt, 4)
    assert pipeline_problem(gpt, 2) is None
    assert "has no wte, wpe" in pipeline_problem(nn.Sequential(nn.Linear(2, 2)), 2)


def test_the_plan_skips_what_pp_cannot_run():
    from bench.config import build_config
    from bench.plan import plan

    cfg = build_config("smoke", {"workloads": "gpt,mlp", "repeats": 1, "nproc": 2,
                                 "techniques": "pp,pp:microbatches=3,pp+ddp,pp+grad_accum:steps=2"})
    reasons = {(t.workload.name, t.techniques.label): t.skip_reason for t in plan(cfg, CPU)}
    assert reasons[("gpt", "pp")] is None
    assert "does not split into 3 equal micro-batches" in reasons[("gpt", "pp:microbatches=3")]
    assert "cannot be combined with ddp" in reasons[("gpt", "pp+ddp")]
    assert "grad_accum" in reasons[("gpt", "pp+grad_accum:steps=2")]
    assert "another structure" in reasons[("mlp", "pp")]


class _Owner(Technique):
    """Owns forward_backward in one process: plain forward and backward, a loss of its own making."""

    name = "owner"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward_backward(self, model, x, y, loss_fn, ctx):
        self.calls += 1
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss.detach() * 0 + 42.0


def test_the_loop_hands_forward_and_backward_to_its_owner():
    model = nn.Linear(3, 1)
    before = model.weight.detach().clone()
    ctx = Context(device=CPU)
    owner = _Owner()
    loop = TrainLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss, [owner], ctx)
    assert float(loop.step((torch.randn(4, 3), torch.randn(4, 1)))) == 42.0
    assert owner.calls == 1 and ctx.step == 1 and not torch.equal(model.weight, before)  # the loop stepped
    with pytest.raises(ValueError, match=r"owner runs the forward and backward itself.*bf16.forward_context\(\)"):
        TrainLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss,
                  [owner, get("bf16")()], ctx)
    with pytest.raises(ValueError, match="2 loop micro-batches would never run"):
        TrainLoop(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss, [owner], ctx, 2)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_pp_trial_through_the_runner(tmp_path):
    r = whole_batch_trial(tmp_path, "pp")
    assert r.quality.samples_trained == TINY_BUDGET["train_steps"] * r.build.batch_size
    found = r.technique_results["pp"]
    assert found["bubble"]["formula"] == pytest.approx(0.2) and len(found["bubble"]["measured_per_stage"]) == 2
