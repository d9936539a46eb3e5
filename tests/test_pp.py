"""Pipeline parallelism (``pp``): gpt:tiny split over 2 real gloo ranks (torchrun) against one process.

- both schedules give one process's per-step losses (rtol 1e-4), parameters (atol 1e-4, as ddp's test) and
  held-out loss at the same global batch, on every rank, with the tied head's copy equal to stage 0's embedding;
- each step runs every micro-batch exactly once forward and once backward (hooks on the stage module), in the
  schedule's order (GPipe: all forwards first; 1F1B: one forward, one backward after the warm-up);
- a rank's parameter bytes are its stage's, computed from the model here, and the layers it does not own are freed;
- a Llama-style decoder the built-in workloads do not contain (tests/decoders.py: rotary embeddings computed inside
  its blocks, RMSNorm, gated MLP, tied head) is split from its description and trains as in one process;
- the decomposition is checked before anything is split: blocks that need more than the hidden state (the rotary
  tables a model computes once and passes in) or a forward that does more than its description says are refused
  with one line; the description alone refuses a model without blocks, embedding or head, with too few blocks, or
  whose blocks declare more inputs (Hugging Face Llama);
- the bubble formula, the planning reasons (one process, an uneven batch), and the loop's ``forward_backward`` hook
  contract in one process;
- (slow) one trial through the real runner: status ok, parity passes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch
from torch import nn

from bench import workloads
from bench.core.structure import ModelStructure
from bench.loop import TrainLoop, build_optimizer
from techniques import get
from techniques.base import Context, Technique, TrainConfig
from techniques.pp import (
    PP,
    _Step,
    bubble_formula,
    check_decomposition,
    description_problem,
    probe_input,
    stage_layers,
)
from tests import decoders
from tests.conftest import TINY_BUDGET
from tests.helpers import TechniqueSettings, whole_batch_trial
from tests.pp_worker import BATCH, MICROBATCHES, STEPS, TIED
from tests.torchrun_jobs import OUT, Job, launch

SETTINGS = TechniqueSettings("pp:microbatches=2", "gpt", runs_on="torchrun")

CPU = torch.device("cpu")


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in params)


def _train_in_one_process(built) -> tuple[list[float], dict[str, torch.Tensor], float]:
    """Losses of STEPS plain steps, the parameters after them and the val_loss: what the stages must reproduce."""
    ctx = Context(device=CPU)
    loop = TrainLoop(built.model, build_optimizer(built.model, [], ctx, built.lr), built.loss_fn, [], ctx)
    batches = built.batches(BATCH, 0)
    losses = [float(loop.step(next(batches))) for _ in range(STEPS)]
    built.model.eval()
    with torch.no_grad():
        val_loss = built.evaluate(built.model)["val_loss"]
    return losses, {k: v.detach().clone() for k, v in built.model.named_parameters()}, val_loss


@pytest.fixture(scope="module")
def one_process():
    return _train_in_one_process(workloads.get("gpt").build("tiny", 0, CPU))


# every 2-rank job of this file, in one torchrun launch (tests/torchrun_jobs.py)
JOBS = {"gpipe": Job("pp_worker", ("gpipe", OUT)), "1f1b": Job("pp_worker", ("1f1b", OUT)),
        "llama": Job("pp_worker", ("1f1b", OUT, "build"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return launch(JOBS, tmp_path_factory.mktemp("torchrun"))


def read_ranks(out):
    """(each rank's record, each rank's parameters, rank 0's technique results) of a job."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    params = [torch.load(out / f"params_rank{r}.pt") for r in (0, 1)]
    return ranks, params, json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def two_ranks(request, runs):
    return request.param, *read_ranks(runs[request.param])


@pytest.mark.distributed
def test_pp_trains_like_one_process(two_ranks, one_process):
    _, ranks, params, _ = two_ranks
    losses, expected, val_loss = one_process
    for rank in ranks:  # every rank returns the step's loss (the trial averages them over ranks)
        assert rank["losses"] == pytest.approx(losses, rel=1e-4)
        assert rank["val_loss"] == pytest.approx(val_loss, rel=1e-4)  # evaluation through eval_model
    first, last = params
    assert set(first) | set(last) == set(expected) | {TIED} and not set(first) & set(last)
    for key, value in {**first, **last}.items():
        assert torch.allclose(value, expected["wte.weight" if key == TIED else key], atol=1e-4), key
    assert torch.equal(first["wte.weight"], last[TIED]), "the tied copies drifted apart"


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


@pytest.mark.distributed
def test_a_llama_style_decoder_is_split_from_its_description(runs):
    losses, expected, val_loss = _train_in_one_process(decoders.workload().build("default", 0, CPU))
    ranks, (first, last), results = read_ranks(runs["llama"])
    for rank in ranks:
        assert rank["losses"] == pytest.approx(losses, rel=1e-4)
        assert rank["val_loss"] == pytest.approx(val_loss, rel=1e-4)
        assert rank["freed"]
    assert set(first) | set(last) == set(expected) | {TIED} and not set(first) & set(last)
    assert {k.split(".")[0] for k in first} == {"embed", "layers"} and {k.split(".")[0] for k in last} == {
        "layers", "norm", TIED}
    for key, value in {**first, **last}.items():
        assert torch.allclose(value, expected["embed.weight" if key == TIED else key], atol=1e-4), key
    assert torch.equal(first["embed.weight"], last[TIED])
    sent = MICROBATCHES * (BATCH // MICROBATCHES) * decoders.T * decoders.D * 4
    assert results["per_stage"]["sent_bytes_per_step_per_stage"] == [sent, sent]


def test_bubble_formula_and_stage_split():
    assert bubble_formula(2, 4) == pytest.approx(0.2)
    assert bubble_formula(4, 8) == pytest.approx(3 / 11)
    assert bubble_formula(1, 8) == 0.0
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layers(4, 4) == [range(i, i + 1) for i in range(4)]


class FakeEvent:
    """A CUDA event's surface: done when the fake device has passed it; its time in milliseconds."""

    def __init__(self, ms, done):
        self.ms, self.passed, self.waited = ms, done, False

    def query(self):
        return self.passed

    def synchronize(self):
        self.waited, self.passed = True, True

    def elapsed_time(self, end):
        assert end.passed, "elapsed_time read before the device passed the event (torch raises there)"
        return end.ms - self.ms


def test_stage_times_are_read_only_after_the_device_passed_them():
    """The lazy path pp takes on CUDA, with fake events: a step is read when its last mark is done (no wait inside
    the schedule), or on demand with a wait; steps are read in order and then hold no events."""
    pp = PP(PP.Options(microbatches=2))
    marks = iter([FakeEvent(0, True), FakeEvent(2, True), FakeEvent(4, True), FakeEvent(7, True), FakeEvent(0, True),
                  FakeEvent(10, False)])  # the device has not reached the schedule's end yet
    pp.clock.mark = lambda: next(marks)
    pp._step = step = _Step()
    timed = pp._timed(lambda: None)
    timed()
    timed()  # two chunks: 2 ms and 3 ms of stage compute
    step.wall = (pp.clock.mark(), pp.clock.mark())  # a 10 ms schedule
    pp.steps.append(step)
    pp._unsettled.append(step)
    pp._settle(wait=False)
    assert pp._unsettled == [step] and step.compute_s == 0.0  # nothing read while the device is behind
    assert pp.measured_bubble() == pytest.approx(1 - 5 / 10)  # read with a wait: 1 - compute / wall
    assert pp._unsettled == [] and step.spans == [] and step.wall is None
    assert step.compute_s == pytest.approx(0.005) and step.wall_s == pytest.approx(0.010)


def test_on_the_cpu_a_stage_is_timed_by_the_host_clock():
    from techniques.pp import StageClock

    clock = StageClock(CPU)
    start = clock.mark()
    assert isinstance(start, float) and StageClock.done(start)  # synchronous: the host's time is the stage's
    assert StageClock.seconds(1.0, 1.25) == 0.25


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_stage_is_timed_on_the_device_not_by_its_launches():
    """200 products of 4096^3 in bf16 are 2.7e13 FLOPs: at most 2e15 FLOP/s (twice the largest dense datasheet peak)
    they take at least 13.7 ms of device time, while launching them takes a small fraction of that."""
    from techniques.pp import StageClock

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    clock = StageClock(torch.device("cuda"))
    start = clock.mark()
    for _ in range(200):
        torch.mm(a, a)
    end = clock.mark()
    assert StageClock.seconds(start, end) >= 200 * 2 * 4096**3 / 2e15


def test_planning_reasons():
    def reason(world=2, workload="gpt", names=("pp",), blocks=None, **options):
        structure = workloads.get(workload).structure("tiny")
        if blocks:
            structure = dataclasses.replace(structure, n_blocks=blocks)
        ctx = Context(device=CPU, workload=workload, world_size=world, technique_names=names, structure=structure)
        return PP(PP.Options(**options)).check(ctx)

    assert reason() is None and reason(schedule="gpipe", microbatches=1) is None
    assert "needs several processes" in reason(world=1)
    assert reason(workload="mlp").startswith("needs the model's token embedding")
    assert "1f1b needs at least as many micro-batches as stages" in reason(world=4, microbatches=2, blocks=4)
    assert "bf16 changes them (forward_context)" in reason(names=("pp", "bf16"))
    with pytest.raises(ValueError, match="does not split into 3 equal micro-batches"):
        PP(PP.Options(microbatches=3)).configure(TrainConfig(batch_size=16))


LLAMA = ModelStructure.from_dict(decoders.STRUCTURE)


def test_the_description_says_what_pp_cannot_split():
    gpt = workloads.get("gpt").structure("tiny")  # 2 blocks
    assert description_problem(gpt, 2) is None and description_problem(LLAMA, 2) is None
    assert description_problem(gpt, 4) == ("the model has 2 blocks, fewer than the 4 pipeline stages: run with "
                                           "--nproc 2")
    assert description_problem(dataclasses.replace(LLAMA, head=None), 2).startswith("needs the model's output head")
    assert description_problem(ModelStructure(), 2).startswith("needs the model's blocks, token embedding, output head")
    needs = dataclasses.replace(LLAMA, block_inputs=("position_embeddings",))
    assert description_problem(needs, 2) == ("runs the blocks on the hidden state alone; this model's blocks need "
                                             "more inputs (position_embeddings), which its forward computes and "
                                             "passes in")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_hugging_face_llama_is_refused_from_its_description_and_gpt2_decomposes():
    hf = workloads.get("hf")
    assert "blocks need more inputs (position_embeddings)" in description_problem(hf.structure("llama-tiny"), 2)
    built = hf.build("tiny", 0, CPU)  # GPT-2: wte + wpe, dropout, blocks on the hidden state alone, ln_f, lm_head
    s = built.structure
    assert description_problem(s, 2) is None
    hidden, output = check_decomposition(built.model, s, probe_input(built.model, s, 64, CPU))
    assert hidden == (64,) and output == (built.model.hf.config.vocab_size,)


def test_the_decomposition_is_checked_on_the_model():
    gpt = workloads.get("gpt").build("tiny", 0, CPU)
    s = gpt.model.trainbench_structure()
    assert check_decomposition(gpt.model, s, probe_input(gpt.model, s, 64, CPU)) == ((64,), (gpt.params["vocab_size"],))
    without = dataclasses.replace(s, position_embedding=None)  # the description forgets what GPT.forward adds
    with pytest.raises(ValueError, match=r"^pp: the stages in sequence \(embedding, drop, blocks on the hidden state "
                                         r"alone, final norm, head\) differ from the model's forward on a probe"):
        check_decomposition(gpt.model, without, probe_input(gpt.model, without, 64, CPU))
    outside = decoders.workload("build_outside").build("default", 0, CPU)  # the rotary tables passed in
    s = outside.structure
    with pytest.raises(ValueError) as err:
        check_decomposition(outside.model, s, probe_input(outside.model, s, 12, CPU))
    assert str(err.value).startswith("pp: runs the blocks on the hidden state alone; this model's blocks need more "
                                     "inputs (called with the hidden state alone, TablesLayer raised TypeError: ")
    assert "\n" not in str(err.value)
    # transform_model refuses before it splits anything (no process group needed)
    ctx = Context(device=CPU, rank=0, world_size=2, structure=s, sequence_length=12)
    with pytest.raises(ValueError, match="^pp: runs the blocks on the hidden state alone"):
        PP().transform_model(outside.model, ctx)
    assert len(outside.model.layers) == 2


def test_the_plan_skips_what_pp_cannot_run():
    from bench.plan.config import build_config
    from bench.plan.planner import plan

    cfg = build_config("smoke", {"workloads": "gpt,mlp", "repeats": 1, "nproc": 2,
                                 "techniques": "pp,pp:microbatches=3,pp+ddp,pp+grad_accum:steps=2"})
    reasons = {(t.workload.name, t.techniques.label): t.skip_reason for t in plan(cfg, CPU)}
    assert reasons[("gpt", "pp")] is None
    assert "does not split into 3 equal micro-batches" in reasons[("gpt", "pp:microbatches=3")]
    assert "cannot be combined with ddp" in reasons[("gpt", "pp+ddp")]
    assert "grad_accum" in reasons[("gpt", "pp+grad_accum:steps=2")]
    assert "needs the model's token embedding" in reasons[("mlp", "pp")]


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
