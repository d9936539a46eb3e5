"""A user's own model (``--model``): the protocol's checks, blocks discovery, and a sweep end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from bench import cli
from bench.plan import plugins
from bench.plan import user_models as user
from bench.plan.config import build_config
from bench.plan.planner import plan
from tests.conftest import REPO, TINY_BUDGET

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
    ("build_unknown_key", None, "unknown key(s) 'optimiser'"),
    ("build_eval_without_metric", None, "holding the metric 'accuracy'; it returned acc"),
    ("build_bad_blocks", None, "blocks 'encoder.layers' is not a submodule"),
    ("build_not_a_model", None, "model must be an nn.Module"),
    ("build_two_blocks", None, "blocks 'layers' and the returned structure's blocks 'inp' differ"),
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


def test_a_technique_that_does_not_declare_its_facts_is_one_line_naming_them(tmp_path, capsys):
    mine = tmp_path / "mine.py"
    mine.write_text("from techniques.base import Technique\n\nclass Mine(Technique):\n    name = 'mine'\n"
                    "    own_flops = False\n")
    code = cli.main(["sweep", "--technique", f"{mine}:Mine", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith(f"error: {mine}:Mine: technique 'mine' (") and \
        "must declare hides_tensors, tune_options in its class body" in err
    assert not (tmp_path / "out").exists()


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
    assert facts["structure"]["blocks"] == "layers" and facts["block_types"] == {"Sequential": 3}
    assert facts["batch_size"] == 32 and facts["quality_steps"] == 30 and facts["has_batchnorm"] is False
    assert facts["sha256"] == plugins.sha256_of(MODELS)
    again = build_config("smoke", {"models": [f"resmlp={MODELS}:build"], "workloads": "mlp"})
    assert [w.label for w in again.workloads] == ["mlp:tiny", "resmlp:small"]  # named workloads and the model


def test_a_model_from_an_importable_module():
    model = user.parse_model("tests.fixtures.plugins.models:build")
    # named after the module; children get the sys.path entry the package was found under
    assert (model.name, model.source, model.path) == ("models", "tests.fixtures.plugins.models:build", str(REPO))


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
    """A model from the user's own module (run in their project directory), a technique from a file and one from an
    installed package's entry point, through `bench sweep` in a subprocess: records name the model's file and
    digest and the plugin technique's; the report renders; `bench.load` reads them back."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "models.py").write_text(MODELS.read_text())
    out = tmp_path / "sweep"
    budget = dict(TINY_BUDGET, memory=False)
    env = dict(os.environ, PYTHONPATH=str(FIXTURES / "installed"))  # the harness itself is pip-installed
    args = ["sweep", "--preset", "smoke", "--model", "models:build", "--technique",
            f"{FIXTURES}/my_technique.py:LabelSmoothing", "--techniques", "label_smoothing:eps=0.2,sgd_momentum",
            "--repeats", "1", "--steps", str(budget["train_steps"]), "--eval-points", "2", "--window-steps", "4",
            "--window-seconds", "0.05", "--no-memory", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "bench", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # planned trials only: an algorithmic set that trained faster than the baseline also gets a continuation
    lines = (out / "results.jsonl").read_text().splitlines()
    records = [r for line in lines if not (r := json.loads(line)).get("continues")]
    assert {r["technique_label"]: r["status"] for r in records} == {
        "baseline": "ok", "label_smoothing:eps=0.2": "ok", "sgd_momentum": "ok"}
    source = records[0]["workload"]["source"]
    assert source == {"file": None, "module": "models", "function": "build", "sha256": plugins.sha256_of(MODELS)}
    assert records[0]["workload"]["name"] == "models"
    smoothing = next(r for r in records if r["technique_label"].startswith("label_smoothing"))["techniques"][0]
    assert smoothing["source"] == f"{FIXTURES}/my_technique.py:LabelSmoothing"
    assert smoothing["sha256"] == plugins.sha256_of(FIXTURES / "my_technique.py")
    sgd = next(r for r in records if r["technique_label"] == "sgd_momentum")["techniques"][0]
    assert "package trainbench-demo-plugin 0.1" in sgd["source"]
    report = (out / "report.md").read_text()
    assert "models:small" in report and "your model models:build" in report

    import bench

    frame = bench.load(out)
    frame = frame[frame["continues"].isna()]
    assert len(frame) == 3 and set(frame["workload"]) == {"models:small"}
    assert frame.set_index("technique").final.notna()["sgd_momentum"]  # NaN where missing


# ---- review findings: data, signatures, re-registration, resume, A/B ----------------------------------------------


@pytest.mark.parametrize("function,expected", [
    ("build_ignores_batch_size", "gave batches of 16 and 16 samples when asked for 32 and 2"),
    ("build_returns_a_list_of_batches", "returned a list; it must return an iterator"),
    ("build_small_dataset", "batch_size 32 is larger than the Dataset (20 items)"),
])
def test_check_finds_bad_training_data(function, expected):
    plugin = user.parse_model(f"data_{function}={MODELS}:{function}")
    with pytest.raises(plugins.PluginError) as caught:
        user.check(plugin, user.DEFAULT_SIZE, torch.device("cpu"))
    assert expected in str(caught.value)


def test_iterable_dataset_is_refused_with_what_is_valid():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(2), torch.tensor(0)

    with pytest.raises(plugins.PluginError, match="IterableDataset.*give a map-style Dataset"):
        user._batches_of(Stream(), "test")


def test_build_signatures():
    kw = user.register_model(user.parse_model(f"kw={MODELS}:build_keywords"))
    built = kw().build(user.DEFAULT_SIZE, 3, torch.device("cpu"))
    assert built.model.given == ["device", "seed", "size"] and kw.default_size == user.DEFAULT_SIZE
    required = user.register_model(user.parse_model(f"req={MODELS}:build_size_without_default"))
    assert required.size_required
    with pytest.raises(Exception, match="needs a size .*write req:SIZE"):
        build_config("smoke", {"models": [f"req={MODELS}:build_size_without_default"]})
    cfg = build_config("smoke", {"models": [f"req={MODELS}:build_size_without_default"], "workloads": "req:large"})
    assert [w.label for w in cfg.workloads] == ["req:large"]


def test_a_notebook_registers_an_edited_or_other_model_again(tmp_path):
    first, second = tmp_path / "a" / "net.py", tmp_path / "b" / "net.py"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text(MODELS.read_text())
    one = user.register_model(user.parse_model(f"{first}:build"))
    assert user.register_model(user.parse_model(f"{first}:build")) is one  # unchanged: the same class
    with open(first, "a") as f:
        f.write("\nSIZES['small'] = 48\n")
    edited = user.register_model(user.parse_model(f"{first}:build"))
    assert edited is not one and edited().build("small", 0, torch.device("cpu")).model.inp.out_features == 48
    other = user.register_model(user.parse_model(f"{second}:build"))  # same name "net", another file: replaced
    assert other.origin.file == str(second)


@pytest.mark.slow  # sweeps end to end
def test_resume_refuses_an_edited_model_file_and_extend_adds_a_model(tmp_path):
    from bench.core.files import write_atomic
    from bench.run import sweepdir

    model = tmp_path / "net.py"
    model.write_text(MODELS.read_text())
    out = tmp_path / "sweep"
    out.mkdir()
    cfg = build_config("smoke", {"models": [f"{model}:build"]})
    write_atomic(out / "sweep.toml", cfg.to_toml())
    extended = sweepdir.resumed_config(out, build_config("smoke", {"models": [f"flat={MODELS}:build_flat"]},
                                                         out / "sweep.toml"), extend=True)
    assert {w.label for w in extended.workloads} == {"net:small", "flat:default"}
    with open(model, "a") as f:
        f.write("\n# edited\n")
    with pytest.raises(Exception, match="net.py changed since the sweep .* started"):
        sweepdir.resumed_config(out, build_config("smoke", None, out / "sweep.toml"), extend=False)


def test_ab_against_a_checkout_without_plugin_support_is_refused(tmp_path):
    from bench.run.ab import AbRunner, Checkout

    old = tmp_path / "old"
    (old / "bench").mkdir(parents=True)
    (old / "bench" / "trial.py").write_text("")
    cfg = build_config("smoke", {"models": [f"{MODELS}:build"]})
    with pytest.raises(Exception, match="predates --model and --technique"):
        AbRunner(cfg, tmp_path / "out", torch.device("cpu"), Checkout(old, "v0", None))
