"""A user's own model (``--model``): the protocol's checks, blocks discovery, and a sweep end to end."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from bench import cli, plugins
from bench.config import build_config
from bench.plan import plan
from bench.workloads import user
from tests.conftest import REPO, TINY_BUDGET, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "plugins"
MODELS = FIXTURES / "models.py"


# ---- protocol violations: one line, exit 2, nothing written ------------------------------------------------------


VIOLATIONS = [  # found while the sweep is configured, before any model is built
    (["--model", "no/such/file.py:build"], "does not exist"),
    (["--model", f"{MODELS}:nope"], "defines no 'nope'"),
    (["--model", f"{MODELS}"], "must be PATH.py:NAME"),
    (["--model", f"{MODELS}:build_needs_more"], "may take only size, seed, device (by name); it requires depth"),
    (["--model", f"{MODELS}:build_flat", "--workloads", "build_flat:small"], "takes no size parameter"),
    (["--model", f"a={MODELS}:build", "--model", f"a={MODELS}:build_flat"], "two --model entries are named 'a'"),
    (["--model", f"mlp={MODELS}:build"], "workload name 'mlp' is defined twice"),
    (["--technique", f"{FIXTURES}/my_technique.py:Missing"], "defines no 'Missing'"),
    (["--technique", f"{MODELS}:ResidualMLP"], "is not a subclass of techniques.Technique"),
    # ... and found by the check process (build, one step, one evaluation)
    (["--model", f"{MODELS}:build_bad_loss"], "loss returned a tensor of shape [32]; it must return a scalar"),
    (["--model", f"{MODELS}:build", "--workloads", "models:huge"], "unknown size 'huge' (valid: small, large)"),
]

CHECK_VIOLATIONS = [  # the check process's findings, called in this process (the pipeline is tested above)
    ("build_raises", None, "raised RuntimeError: the dataset is not here"),
    ("build_list", None, "returned a list; it must return a dict or a"),
    ("build_no_evaluate", None, "lacks evaluate"),
    ("build_unknown_key", None, "unknown key(s) 'optimizer'"),
    ("build_eval_without_metric", None, "holding the metric 'accuracy'; it returned acc"),
    ("build_bad_blocks", None, "blocks 'encoder.layers' is not a submodule"),
    ("build_not_a_model", None, "model must be an nn.Module"),
    ("build", "nowhere", "blocks 'nowhere' is not a submodule"),
]


@pytest.mark.parametrize("args,expected", VIOLATIONS, ids=[v[1][:40] for v in VIOLATIONS])
def test_protocol_violation_is_one_line_exit_2_and_writes_nothing(args, expected, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["sweep", *args, "--repeats", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    assert expected in err, err
    assert not out.exists()


@pytest.mark.parametrize("function,blocks,expected", CHECK_VIOLATIONS, ids=[v[0] for v in CHECK_VIOLATIONS])
def test_check_finds_each_violation(function, blocks, expected):
    plugin = user.parse_model(f"check_{function}_{blocks}={MODELS}:{function}", blocks)
    with pytest.raises(plugins.PluginError, match=None) as caught:
        user.check(plugin, user.DEFAULT_SIZE if function != "build" else "small", torch.device("cpu"))
    assert expected in str(caught.value)


def test_quality_budget_is_required_unless_speed_only(tmp_path, capsys):
    source = f"{MODELS}:build_stream_without_budget"
    assert cli.main(["sweep", "--model", source, "--out", str(tmp_path / "out")]) == 2
    assert "states no quality budget (quality_steps): give --steps" in capsys.readouterr().err
    cfg = build_config("smoke", {"models": [source], "mode": "speed"})
    assert cfg.workloads[0].name == "build_stream_without_budget"


def test_duplicate_technique_name_names_both_sources(tmp_path, capsys):
    dup = tmp_path / "dup.py"
    dup.write_text("from techniques.base import Technique\n\nclass Bf16(Technique):\n    name = 'bf16'\n")
    code = cli.main(["sweep", "--technique", f"{dup}:Bf16", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "technique name 'bf16' is defined twice" in err and "techniques.bf16" in err and str(dup) in err


# ---- blocks -------------------------------------------------------------------------------------------------------


class WithBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.ReLU()])  # mixed types, but named blocks: taken as is


class TwoLists(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.small = nn.ModuleList([nn.Linear(2, 2) for _ in range(4)])
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.heads = nn.ModuleList([nn.Linear(64, 64), nn.Conv1d(1, 1, 1)])  # not repeated: skipped


def test_blocks_discovery():
    assert user.find_blocks(WithBlocks()) == "blocks"
    assert user.find_blocks(TwoLists()) == "encoder.layers"  # the repeated list holding the most parameters
    assert user.find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) is None


def test_model_without_blocks_skips_block_techniques_with_the_reason():
    cfg = build_config("smoke", {"models": [f"{MODELS}:build_flat"], "techniques": "checkpointing,bf16"})
    trials = {t.techniques.label: t for t in plan(cfg, torch.device("cpu"))}
    assert "has no blocks to checkpoint" in trials["checkpointing"].skip_reason
    assert "--blocks attr.path" in trials["checkpointing"].skip_reason
    assert trials["bf16"].skip_reason is None and trials["baseline"].skip_reason is None


def test_model_registers_with_its_facts_and_default_size():
    cfg = build_config("smoke", {"models": [f"resmlp={MODELS}:build"]})
    assert [w.label for w in cfg.workloads] == ["resmlp:small"]  # the models only, at build's default size
    facts = user.register_model(cfg.models[0])().size_params("small")
    assert facts["blocks"] == "layers" and facts["block_types"] == {"Sequential": 3}
    assert facts["batch_size"] == 32 and facts["quality_steps"] == 30 and facts["has_batchnorm"] is False
    assert facts["sha256"] == plugins.sha256_of(MODELS)
    again = build_config("smoke", {"models": [f"resmlp={MODELS}:build"], "workloads": "mlp"})
    assert [w.label for w in again.workloads] == ["mlp:tiny", "resmlp:small"]  # named workloads and the model


def test_a_model_from_an_importable_module(monkeypatch):
    monkeypatch.chdir(REPO)  # the user's project directory: children get it on sys.path
    cfg = build_config("smoke", {"models": ["tests.fixtures.plugins.models:build_flat"]})
    model = cfg.models[0]
    assert (model.name, model.source, model.path) == ("build_flat", "tests.fixtures.plugins.models:build_flat",
                                                      str(REPO))
    assert user.register_model(model)().size_params("default")["blocks"] is None


def test_dataset_train_data_batches_whole_epochs():
    ds = torch.utils.data.TensorDataset(torch.arange(10.0)[:, None], torch.arange(10))
    batches, n = user._batches_of(ds, "test")
    it = batches(4, 0)
    seen = [next(it)[1] for _ in range(4)]  # 2 batches per epoch: the incomplete third is dropped
    assert n == 10 and all(len(b) == 4 for b in seen)
    assert len(set(torch.cat(seen[:2]).tolist())) == 8


# ---- end to end --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_user_model_and_plugin_techniques_end_to_end(tmp_path):
    """A model file, a technique from a file and one from an installed package's entry point, through `bench sweep`
    in a subprocess: records name the model's file and digest; the report renders; `bench.load` reads them back."""
    out = tmp_path / "sweep"
    budget = dict(TINY_BUDGET, memory=False)
    env = dict(os.environ, PYTHONPATH=str(FIXTURES / "installed"))
    args = ["sweep", "--preset", "smoke", "--model", f"{MODELS}:build", "--technique",
            f"{FIXTURES}/my_technique.py:LabelSmoothing", "--techniques", "label_smoothing:eps=0.2,sgd_momentum",
            "--repeats", "1", "--steps", str(budget["train_steps"]), "--eval-points", "2", "--window-steps", "4",
            "--window-seconds", "0.05", "--no-memory", "--out", str(out)]
    proc = run_cli(*args, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["technique_label"]: r["status"] for r in records} == {
        "baseline": "ok", "label_smoothing:eps=0.2": "ok", "sgd_momentum": "ok"}
    source = records[0]["workload"]["source"]
    assert source["file"] == str(MODELS) and source["sha256"] == plugins.sha256_of(MODELS)
    assert records[0]["workload"]["name"] == "models"
    report = (out / "report.md").read_text()
    assert "models:small" in report and f"your model {MODELS}:build" in report

    import bench

    frame = bench.load(out)
    assert len(frame) == 3 and set(frame["workload"]) == {"models:small"}
    assert frame.set_index("technique").loc["sgd_momentum", "final"] is not None
