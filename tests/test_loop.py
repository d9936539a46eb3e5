"""The loop calls hooks in the documented order and lets one technique own backward / optimizer step."""

import contextlib

import pytest
import torch

from bench.loop import TrainLoop
from techniques.base import Context, Technique


class Recorder(Technique):
    name = "recorder"

    def __init__(self, log):
        super().__init__()
        self.log = log

    def forward_context(self, ctx):
        @contextlib.contextmanager
        def cm():
            self.log.append("enter")
            yield
            self.log.append("exit")

        return cm()

    def loss(self, out, batch, base_loss, ctx):
        self.log.append("loss")
        return base_loss * 2

    def backward(self, loss, ctx):
        self.log.append("backward")
        loss.backward()
        return True

    def optimizer_step(self, opt, ctx):
        self.log.append("step")
        opt.step()
        return True


def make_loop(techs, micro=1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return TrainLoop(model, opt, torch.nn.functional.mse_loss, techs, Context(torch.device("cpu")), micro)


def test_hook_order_per_micro_batch():
    log = []
    loop = make_loop([Recorder(log)], micro=2)
    batch = (torch.randn(4, 4), torch.randn(4, 1))
    loss = loop.step(batch)
    assert log == ["enter", "loss", "exit", "backward", "enter", "loss", "exit", "backward", "step"]
    plain = make_loop([], micro=2).step(batch)
    assert torch.allclose(loss, 2 * plain)  # the loss hook's change is what the loop returns


def test_two_backward_owners_are_refused():
    with pytest.raises(ValueError, match="several techniques want to own backward"):
        make_loop([Recorder([]), Recorder([])])


def test_step_returns_a_detached_mean_over_micro_batches():
    batch = (torch.randn(8, 4), torch.randn(8, 1))
    one, four = make_loop([]).step(batch), make_loop([], micro=4).step(batch)
    assert not one.requires_grad
    assert torch.allclose(one, four, rtol=1e-5)


def test_an_uneven_micro_batch_split_is_refused():
    # chunk(3) of 8 samples gives 3 unequal pieces; chunk(16) of 8 gives 8 pieces and the last "micro-batch" (where
    # DDP all-reduces) never comes. Both would train silently wrong.
    with pytest.raises(ValueError, match="a batch of 8 samples does not split into 3 equal micro-batches"):
        make_loop([], micro=3).step((torch.randn(8, 4), torch.randn(8, 1)))
    with pytest.raises(ValueError, match="into 16 equal"):
        make_loop([], micro=16).step((torch.randn(8, 4), torch.randn(8, 1)))


class StepCounter(Technique):
    name = "step_counter"

    def __init__(self, tag, log):
        super().__init__()
        self.tag, self.log = tag, log

    def attach(self, optimizer, ctx):
        self.log.append((self.tag, "attach", ctx.step))

    def after_step(self, optimizer, ctx):
        self.log.append((self.tag, "after", ctx.step))


def test_several_techniques_subscribe_to_after_step_once_per_optimizer_step():
    """after_step runs for every subscriber after the optimizer step (owned here by Recorder), once per step
    however many micro-batches; the loop then advances ctx.step."""
    log, rec_log = [], []
    loop = make_loop([Recorder(rec_log), StepCounter("a", log), StepCounter("b", log)], micro=2)
    assert log == [("a", "attach", 0), ("b", "attach", 0)]
    for _ in range(2):
        loop.step((torch.randn(4, 4), torch.randn(4, 1)))
    assert log[2:] == [("a", "after", 0), ("b", "after", 0), ("a", "after", 1), ("b", "after", 1)]
    assert loop.ctx.step == 2 and rec_log.count("step") == 2


def test_the_loop_counts_tokens_and_shapes_of_sequence_batches():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = Context(torch.device("cpu"))
    loop = TrainLoop(model, opt, lambda out, y: torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten()),
                     [], ctx, tokens_per_sample=8)
    for length in (8, 4, 4):
        x = torch.randint(10, (3, length))
        loop.step((x, x))
    assert loop.tokens == 3 * 16 and ctx.batch_tokens == 12
    assert dict(loop.shapes) == {(3, 8): 1, (3, 4): 2}
