"""torch.compile: same losses as eager (exact kind, within float tolerance)."""

import pytest
import torch

from bench.records.frame import records_frame
from techniques.compile import Compile
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("compile", "mlp")


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


def test_results_count_what_dynamo_captured():
    from torch._dynamo.utils import counters

    counters.clear()
    ctx = build_loop("mlp", "baseline")[0].ctx
    compiled = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    compiled(torch.randn(2, 4)).sum().backward()
    assert Compile().results(ctx) == {"graphs": 1, "graph_breaks": 0}
    counters.clear()
    lstm = torch.compile(torch.nn.LSTM(4, 4, batch_first=True))  # Dynamo skips RNN modules: nothing captured
    lstm(torch.randn(2, 3, 4))[0].sum().backward()
    assert Compile().results(ctx)["graphs"] == 0


def test_report_says_when_nothing_was_compiled():
    assert "ran eager" in Compile.summarize([{"graphs": 0, "graph_breaks": 0}] * 3)
    assert "ran eager" in Compile.caveat([{"graphs": 0, "graph_breaks": 0}] * 3)
    assert Compile.caveat([{"graphs": 0}, None]) is None  # a trial without its result: no claim about all
    assert Compile.summarize([{"graphs": 1, "graph_breaks": 0}, {"graphs": 2, "graph_breaks": 1}]) == \
        "graphs compiled 1, 2; graph breaks 0, 1"


def test_a_set_that_compiled_nothing_is_flagged_in_the_analysis():
    import pandas as pd

    from bench.analyze.analysis import _caveats

    eager = pd.DataFrame({"technique_results": [{"compile": {"graphs": 0, "graph_breaks": 0}}] * 3})
    assert "ran eager" in _caveats(eager)[0]
    some = pd.DataFrame({"technique_results": [{"compile": {"graphs": 0}}, {"compile": {"graphs": 2}}]})
    assert _caveats(some) == () and _caveats(pd.DataFrame({"technique_results": [{}, None]})) == ()


@pytest.mark.slow
def test_a_trial_that_finds_its_sets_inductor_cache_warm_trains_the_same(tmp_path):
    """The same compiled trial twice in one sweep: the first compiles from an empty cache (cold), the second loads
    what it compiled (warm), and trains the same losses; the sweep's one-off cost is the cold trial's."""
    from bench.plan.config import build_config
    from bench.plan.planner import plan
    from bench.run.runner import SweepRunner

    cpu = torch.device("cpu")
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "compile", "repeats": 1,
                                 "budget": {"memory": False}})
    runner = SweepRunner(cfg, tmp_path / "sweep", cpu)
    runner.claim()
    try:
        env = runner.prepare()
        (trial,) = [t for t in plan(cfg, cpu) if t.techniques.label == "compile"]
        runner.launcher.prepare_references([trial])
        cold, warm = (runner.launcher.run(trial, env) for _ in range(2))
    finally:
        runner.close()
    assert (cold.status, warm.status) == ("ok", "ok"), (cold.reason, warm.reason)
    assert cold.caches["inductor"] == "cold" and warm.caches["inductor"] == "warm"
    assert warm.parity.losses == cold.parity.losses
    assert [row[3] for row in warm.quality.curve] == [row[3] for row in cold.quality.curve]  # training losses
    assert [row[4] for row in warm.quality.curve] == pytest.approx([row[4] for row in cold.quality.curve], rel=1e-6)
    frame = records_frame([cold, warm])
    assert list(frame["one_off_s"]) == [cold.build.one_off_s] * 2
