"""torch.compile: same losses as eager (exact kind, within float tolerance)."""

import torch

from techniques.compile import Compile
from tests.helpers import build_loop


def test_compiled_mlp_matches_eager_losses():
    eager, eb, _ = build_loop("mlp", "baseline")
    comp, cb, _ = build_loop("mlp", "compile")
    a = torch.stack([eager.step(next(eb)) for _ in range(3)])
    b = torch.stack([comp.step(next(cb)) for _ in range(3)])
    assert comp.ctx.state["compiled"] is True
    assert torch.allclose(a, b, rtol=1e-4)


def test_compile_options_parse():
    assert Compile.parse_options({"mode": "reduce-overhead"}).mode == "reduce-overhead"
