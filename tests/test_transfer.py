"""Transfer: the checkpoint is cached and keyed by its config, loaded into the trial's model (a classifier keeps its
own head), and the source tasks are disjoint from what the workload trains on. Importing techniques.transfer and
techniques.freeze registers them."""

from pydoc_data.topics import topics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench import workloads
from bench.core.structure import ModelStructure
from bench.loop import plain_loop
from bench.plan.config import Budget
from bench.trial import TrialSpec, run
from bench.workloads.cnn_fashion import SOURCE_CLASSES, data_dir, fashion_source_task, load_fashion_mnist
from bench.workloads.gpt_chars import (
    SOURCE_CHARS,
    _stdlib_sources,
    corpus_ends,
    encode,
    load_corpus,
    source_offset,
    source_text,
    stdlib_files,
)
from techniques.base import Context, OptionError, Probe, TrainConfig
from techniques.freeze import Freeze
from techniques.transfer import PRETRAIN_SEED, Transfer, source_task
from tests.conftest import TINY_BUDGET
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("transfer:steps=0.02", "gpt")

CPU = torch.device("cpu")
HEAD = "head"  # the built-in classifiers' head (their descriptions name it)


def probe_of(workload: str, size: str = "tiny") -> Probe:
    wl = workloads.get(workload)
    return Probe(lambda seed=None: wl.build(size, 0 if seed is None else seed, CPU), CPU, 0, make_loop=plain_loop)


def tuned(workload: str, steps: float, cache_dir, probe: Probe | None = None) -> Transfer:
    tech = Transfer(Transfer.parse_options({"steps": str(steps)}))
    probe = probe or probe_of(workload)
    tech.tune(TrainConfig(batch_size=0), probe, Context(device=CPU, workload=workload, cache_dir=cache_dir))
    return tech


@pytest.fixture(scope="module")
def cnn_checkpoint(tmp_path_factory) -> tuple[dict, dict, bool]:
    """cnn:tiny pretrained for 3 steps (0.02 of its 150), shared by the tests that load it: (state, meta, whether
    the head is new)."""
    tech = tuned("cnn", 0.02, tmp_path_factory.mktemp("pretrain"))
    return tech._state, tech._meta, tech._new_head


def with_checkpoint(checkpoint: tuple[dict, dict, bool]) -> Transfer:
    """A Transfer as tune() leaves it (it lets the checkpoint go once loaded into a model)."""
    tech = Transfer(Transfer.parse_options({"steps": "0.02"}))
    tech._state, tech._meta, tech._new_head = dict(checkpoint[0]), dict(checkpoint[1]), checkpoint[2]
    return tech


@pytest.fixture
def cnn_transfer(cnn_checkpoint) -> Transfer:
    return with_checkpoint(cnn_checkpoint)


def test_the_checkpoint_is_cached_and_a_config_change_invalidates_it(tmp_path):
    probe = probe_of("gpt")
    first = tuned("gpt", 0.01, tmp_path, probe)  # 2 steps of gpt:tiny's 150
    shared = probe.shared_s
    assert shared > 0 and first._meta["cached"] is False and first._meta["pretrain_steps"] == 2
    assert shared == pytest.approx(first._meta["pretrain_s"], abs=1e-3)
    files = list(tmp_path.glob("pretrain-*.pt"))
    assert [f.name for f in files] == [f"pretrain-{first._meta['key']}.pt"]
    again = tuned("gpt", 0.01, tmp_path, probe)
    assert probe.shared_s == shared  # loaded: nothing trained, nothing charged
    assert again._meta["cached"] is True and again._meta["pretrain_s"] == first._meta["pretrain_s"]
    assert again._meta["source_final_loss"] == first._meta["source_final_loss"]
    assert again._state.keys() == first._state.keys()
    assert all(torch.equal(again._state[k], first._state[k]) for k in first._state)
    other = tuned("gpt", 0.005, tmp_path, probe)  # 1 step: another checkpoint
    assert other._meta["cached"] is False and other._meta["pretrain_steps"] == 1 and probe.shared_s > shared
    assert other._meta["key"] != first._meta["key"] and len(list(tmp_path.glob("pretrain-*.pt"))) == 2
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no leftovers
    fresh = workloads.get("gpt").build("tiny", PRETRAIN_SEED, CPU).model.state_dict()
    assert not torch.equal(first._state["blocks.0.attn.qkv.weight"], fresh["blocks.0.attn.qkv.weight"])  # trained


def test_gpt_loads_every_weight_of_the_checkpoint():
    loop, _, _ = build_loop("gpt", "transfer:steps=0.005")  # one pretraining step
    tech = loop.techniques[0]
    assert not hasattr(tech, "_state")  # loaded, then let go: no second copy of the weights stays resident
    ckpt = tuned("gpt", 0.005, None)._state  # the same (seeded) pretraining again
    state = loop.model.state_dict()
    assert state.keys() == ckpt.keys()
    assert all(torch.equal(state[k], ckpt[k]) for k in state)  # the tied head too
    assert loop.model.head.weight is loop.model.wte.weight  # loading kept the tie
    found = tech.results(loop.ctx)
    assert found["head_reinitialised"] is False and found["source_overlaps_target"] is False
    assert found["pretrain_steps"] == 1 and found["fine_tune_lr"] == 3e-3 and found["cached"] is False


def test_cnn_loads_the_trunk_and_keeps_its_own_fresh_head(cnn_transfer, cnn_checkpoint):
    model = workloads.get("cnn").build("tiny", 3, CPU).model
    own_head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith(f"{HEAD}.")}
    ctx = Context(device=CPU, workload="cnn", seed=3)
    cnn_transfer.transform_model(model, ctx)
    state, ckpt = model.state_dict(), cnn_checkpoint[0]
    assert state.keys() == ckpt.keys()
    for k in state:
        if k.startswith(f"{HEAD}."):
            assert torch.equal(state[k], own_head[k]) and not torch.equal(state[k], ckpt[k]), k
        else:
            assert torch.equal(state[k], ckpt[k]), k  # BatchNorm's running statistics included
    fresh = workloads.get("cnn").build("tiny", 3, CPU).model  # the baseline's head for the same seed
    assert torch.equal(model.head.weight, fresh.head.weight)
    assert cnn_transfer.results(ctx)["head_reinitialised"] is True


def test_freeze_and_transfer_give_the_same_model_in_either_order(cnn_checkpoint):
    ctx = Context(device=CPU, workload="cnn", seed=0)
    models = []
    for order in ("transfer_first", "freeze_first"):
        model = workloads.get("cnn").build("tiny", 0, CPU).model
        freeze, transfer = Freeze(), with_checkpoint(cnn_checkpoint)
        for tech in ((transfer, freeze) if order == "transfer_first" else (freeze, transfer)):
            tech.transform_model(model, ctx)
        models.append(model)
    a, b = ({n: (p.detach(), p.requires_grad) for n, p in m.named_parameters()} for m in models)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[n][0], b[n][0]) and a[n][1] == b[n][1] for n in a)
    assert not a["stem.0.weight"][1] and torch.equal(a["stem.0.weight"][0], cnn_checkpoint[0]["stem.0.weight"])


def test_the_gpt_source_follows_every_fitting_size_corpus_and_skips_the_topics():
    stream_length = sum(len(t) for _, t in stdlib_files())
    probe = probe_of("gpt")
    task = probe.fresh().source_task()
    ids, source = task.data, task.info
    assert task.name == "stdlib_chars" and task.new_head is False
    offset = source["offset_chars"]
    # the workload's corpora take prefixes of this very stream: the source starts after each one that fits
    assert "".join(t for _, t in stdlib_files())[: offset + SOURCE_CHARS] == _stdlib_sources(offset + SOURCE_CHARS)
    for size, end in corpus_ends().items():
        if end <= offset:
            continue
        with pytest.raises(ValueError, match="no 2,000,000 characters disjoint"):  # gpt2-124m on a small stdlib
            source_offset(end, stream_length)
        assert end + SOURCE_CHARS > stream_length, size
    assert corpus_ends()["tiny"] == 0 and offset >= corpus_ends()["small"] == 4_000_000
    text, files = source_text(offset)
    assert len(text) == source["chars"] == SOURCE_CHARS and not any(f.startswith("pydoc_data") for f in files)
    # encoded in the workload's own vocabulary, characters outside it dropped
    _, vocab, _ = load_corpus(0)
    known = set(vocab)
    assert int(ids.max()) < len(vocab) and len(ids) == source["tokens"] == SOURCE_CHARS - source["dropped_out_of_vocab"]
    assert "".join(vocab[i] for i in ids.tolist()) == "".join(c for c in text if c in known)


def test_files_of_the_topics_are_skipped_wherever_the_window_falls():
    pos = 0
    for rel, text in stdlib_files():
        if rel.startswith("pydoc_data") and text:
            break
        pos += len(text)
    window, files = source_text(pos - 100, 200_000)  # starts 100 characters before topics.py
    assert not any(f.startswith("pydoc_data") for f in files) and len(window) == 200_000
    assert topics["assert"][:200] not in window


def test_encode_maps_characters_to_vocabulary_indices():
    ids, dropped = encode("ab\u00e9cz", ["a", "b", "c", "d"])
    assert ids.tolist() == [0, 1, 2] and dropped == 2


def test_gpt_source_offset_rule():
    ends = sorted(set(corpus_ends().values()))
    for available in (SOURCE_CHARS, 10_000_000, 50_000_000):
        expected = max(e for e in ends if e + SOURCE_CHARS <= available)
        assert source_offset(0, available) == expected
    with pytest.raises(ValueError, match="takes the first 4,000,000 characters"):
        source_offset(4_000_000, 5_000_000)


def test_cnn_tiny_source_is_classes_0_to_4_of_the_unused_training_images():
    fresh = probe_of("cnn").fresh(PRETRAIN_SEED)
    task = fresh.source_task()
    (x, y), source = task.data, task.info
    assert task.name == "fashion_classes" and task.new_head is True
    arrays, _ = load_fashion_mnist(data_dir())
    labels = arrays["train_y"]
    expected = np.flatnonzero(np.isin(labels, SOURCE_CLASSES) & (np.arange(len(labels)) >= 6000))
    assert source["index_from"] == 6000 and source["overlaps_target"] is False
    assert source["images"] == len(expected) == len(x) and source["first_index"] == expected[0] >= 6000
    assert torch.equal(y, torch.from_numpy(labels[expected].astype(np.int64))) and int(y.max()) == 4
    mean, std = fresh.dataset["normalize_mean"], fresh.dataset["normalize_std"]
    assert torch.equal(x[-1, 0], (torch.from_numpy(arrays["train_x"][expected[-1]]).float() / 255 - mean) / std)


def test_cnn_small_source_overlaps_its_own_training_set():
    built = probe_of("cnn").fresh()  # cnn:small's n_train on the tiny build's data: no 60000-image build needed
    arrays, _ = load_fashion_mnist(data_dir())
    task = fashion_source_task(arrays, 60_000, built.dataset["normalize_mean"], built.dataset["normalize_std"])
    (x, y), source = task.data, task.info
    assert source["index_from"] == 0 and source["overlaps_target"] is True
    tiny_x, tiny_y = built.train_data  # the first 6000: the small size trains on these too
    first = np.flatnonzero(np.isin(tiny_y.numpy(), SOURCE_CLASSES))
    assert torch.equal(x[: len(first)], tiny_x[first]) and torch.equal(y[: len(first)], tiny_y[first])


def test_a_source_task_the_workload_cannot_give_is_one_line_naming_the_way_out():
    declared = SimpleNamespace(source_task=None, structure=ModelStructure(source_task="stdlib_chars"))
    with pytest.raises(ValueError, match=r"^transfer: the workload provides no source task .*'stdlib_chars'.*init="):
        source_task(declared)  # declared by the description, but the build provides none (a user's model)

    def refused():
        raise ValueError("no 2,000,000 characters disjoint from it are left for a source task")

    with pytest.raises(ValueError, match="^transfer: no 2,000,000 characters disjoint"):  # the workload's reason
        source_task(SimpleNamespace(source_task=refused, structure=None))


def test_check_options_and_lr():
    ctx = Context(device=CPU, workload="mlp", structure=workloads.get("mlp").structure("tiny"))  # no source task
    reason = Transfer().check(ctx)
    assert reason and "init=" in reason and "source task" in reason and "\n" not in reason
    assert "one process" in Transfer().check(Context(device=CPU, workload="gpt", world_size=2))
    assert Transfer().check(Context(device=CPU, workload="cnn_aug", structure=workloads.get("cnn_aug").structure("tiny"))) is None
    with pytest.raises(ValueError, match="init="):
        Transfer().tune(TrainConfig(batch_size=1), probe_of("mlp"), ctx)
    for bad in ({"steps": "0"}, {"steps": "-1"}, {"lr": "0"}):
        with pytest.raises(OptionError):
            Transfer.parse_options(bad)
    cfg = TrainConfig(batch_size=16, lr=3e-3)
    assert Transfer(Transfer.parse_options({"lr": "1e-4"})).configure(cfg).lr == 1e-4
    assert Transfer().configure(cfg).lr == 3e-3
    with pytest.raises(RuntimeError, match="no pretrained checkpoint"):
        Transfer().transform_model(torch.nn.Linear(1, 1), ctx)
    tech = Transfer()
    tech._state = {"weight": torch.zeros(1, 1)}  # a model with other parameters than the checkpoint
    with pytest.raises(RuntimeError, match="list transfer before mtp in the set"):
        tech.transform_model(torch.nn.Linear(1, 1), Context(device=CPU, workload="gpt", technique_names=("mtp", "transfer")))


def test_build_loop_budget_is_unchanged():
    """transfer changes the starting weights, not the plan."""
    loop, _, built = build_loop("cnn", "transfer:steps=0.01:lr=1e-3", budget=Budget(train_steps=20))
    assert loop.ctx.total_steps == 20 and loop.optimizer.param_groups[0]["lr"] == 1e-3


@pytest.mark.slow
def test_real_trials_share_one_checkpoint(tmp_path):
    """gpt:tiny through the runner's trial: "transfer" pretrains (150 steps, kept out of the trial's probe_s) and
    caches; "transfer+freeze:blocks=1" loads that checkpoint and runs fewer FLOPs per step."""
    records = []
    for labels in (["transfer"], ["transfer", "freeze:blocks=1"]):
        spec = TrialSpec(sweep_id="t", trial_id="t", workload="gpt", size="tiny", techniques=labels, seed=0,
                         repeat=0, device="cpu", budget=TINY_BUDGET, reference_dir=str(tmp_path))
        rec = run(spec)
        assert rec.status == "ok", rec.reason
        records.append(rec)
    plain, frozen = (r.technique_results["transfer"] for r in records)
    assert plain["pretrain_steps"] == 150 and plain["cached"] is False and frozen["cached"] is True
    assert frozen["key"] == plain["key"] and frozen["pretrain_s"] == plain["pretrain_s"] > 0
    assert records[0].build.probe_s < plain["pretrain_s"]  # shared work, not the trial's one-off cost
    assert len(list(tmp_path.glob("pretrain-*.pt"))) == 1
    assert records[1].technique_results["freeze"]["frozen_by_tying"] == ["head.weight"]
    assert 0 < records[1].speed.flops_per_step < records[0].speed.flops_per_step
