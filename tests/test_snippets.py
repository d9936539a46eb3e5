"""Every method card's "In your own training loop" snippet runs, as written, on a toy model and loop.

A snippet is the first fenced python block after the heading in a technique module's docstring
(``bench.report.tune.snippet_of``); it may use the names a user's loop has: ``model`` (here a toy with an ``inputs`` layer,
an nn.ModuleList ``blocks`` and a ``head``), ``optimizer``, ``loss_fn``, ``batches`` (a list of (x, y)), ``device``,
``dataset`` (a map-style Dataset of the same samples) and ``evaluate(model) -> validation loss``, plus ``torch``,
``nn``, ``F`` and ``math``. A broken snippet fails here: it raises, or it trains nothing.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import techniques
from bench.report import tune

# The techniques `bench tune` recommends on a single CPU process first: each must carry a snippet.
REQUIRED = ("bf16", "fp16", "grad_accum", "checkpointing", "compile", "fused_adamw", "channels_last", "tf32",
            "loader", "sdpa_backend", "freeze", "lr_schedule", "early_stopping")


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inputs = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inputs(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def namespace() -> dict:
    torch.manual_seed(0)
    model = Toy()
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    batches = list(zip(x.split(8), y.split(8), strict=True))
    held_x, held_y = torch.randn(16, 16), torch.randint(0, 4, (16,))

    @torch.no_grad()
    def evaluate(m: nn.Module) -> float:
        return float(F.cross_entropy(m(held_x), held_y))

    return {"torch": torch, "nn": nn, "F": F, "math": math, "model": model,
            "optimizer": torch.optim.AdamW(model.parameters(), lr=1e-2), "loss_fn": F.cross_entropy,
            "batches": batches, "device": "cpu", "dataset": torch.utils.data.TensorDataset(x, y),
            "evaluate": evaluate, "__name__": "snippet"}


def trained(ns: dict, before: dict[str, torch.Tensor]) -> bool:
    """Whether the snippet trained something: the toy model's parameters moved, or a module or tensor of its own
    got gradients (a snippet with its own model or attention inputs)."""
    if any(not torch.equal(p, before[n]) for n, p in ns["model"].named_parameters()):
        return True
    for value in ns.values():
        if isinstance(value, nn.Module) and value is not ns["model"]:
            if any(p.grad is not None for p in value.parameters()):
                return True
        if isinstance(value, torch.Tensor) and value.grad is not None:
            return True
    return False


@pytest.fixture
def global_state():
    """Snippets may flip process-wide switches (TF32, cuDNN's autotuner, compile caches): restore them."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])
    torch.backends.cudnn.benchmark = saved[3]
    torch._dynamo.reset()


def with_snippets() -> list[str]:
    return [name for name, cls in sorted(techniques.registry().items()) if tune.snippet_of(cls)]


def run_snippet(name: str) -> dict:
    code = tune.snippet_of(techniques.get(name))
    ns = namespace()
    before = {n: p.detach().clone() for n, p in ns["model"].named_parameters()}
    exec(compile(code, f"<{name} snippet>", "exec"), ns)  # noqa: S102 (our own docstrings)
    assert trained(ns, before), f"the {name} snippet ran but trained nothing"
    return ns


def test_the_techniques_tune_recommends_first_all_have_a_snippet():
    missing = [n for n in REQUIRED if not tune.snippet_of(techniques.get(n))]
    assert missing == []


@pytest.mark.parametrize("name", [n for n in with_snippets() if n != "compile"])
def test_each_snippet_runs_on_a_toy_loop(name, global_state):
    run_snippet(name)


def test_the_compile_snippet_traces_and_trains(monkeypatch, global_state):
    # Dynamo traces the snippet's model for real; the eager backend skips Inductor's C++ build (seconds on 2 cores),
    # which the slow test below runs as written.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    run_snippet("compile")


@pytest.mark.slow
def test_the_compile_snippet_runs_as_written(global_state):
    run_snippet("compile")


def test_a_broken_snippet_fails(monkeypatch):
    # The extraction reads the docstring as it is: a snippet calling something that does not exist raises here.
    import sys

    module = sys.modules[techniques.get("bf16").__module__]
    monkeypatch.setattr(module, "__doc__", module.__doc__.replace("loss.backward()", "loss.backwards()"))
    with pytest.raises(AttributeError):
        run_snippet("bf16")


def test_tune_prints_the_snippets_of_a_set_in_the_order_the_harness_applies_them():
    text = tune.snippets_for("compile+checkpointing+bf16")
    order = [text.index(f"### {n}") for n in ("bf16", "checkpointing", "compile")]  # precision, checkpoint, compile
    assert order == sorted(order)
    assert text.count("```python") == 3
    assert tune.snippets_for("baseline") == ""
