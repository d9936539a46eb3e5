"""torch.compile: same losses as eager (exact kind, within float tolerance)."""

import torch

from techniques.compile import Compile
from tests.helpers import build_loop


def test_compiled_mlp_matches_eager_losses():
    eager, eb, _ = build_loop("mlp", "baseline")
    comp, cb, _ = build_loop("mlp", "compile")
    a = torch.stack([eager.step(next(eb)) for _ in range(3)])
    b = torch.stack([comp.step(next(cb)) for _ in range(3)])
    assert torch.allclose(a, b, rtol=1e-4)
    # the facts the harness reads: the tracker cannot see inside it, and evaluation runs the eager original
    technique = Compile()
    assert technique.hides_tensors is True
    assert technique.eval_model(comp.model, comp.ctx) is comp.model._orig_mod


def test_compile_options_parse():
    assert Compile.parse_options({"mode": "reduce-overhead"}).mode == "reduce-overhead"
