"""Every registered workload at size tiny: seeded builds, deterministic batches, a real learning signal, metrics."""

import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from bench import workloads
from bench.workloads import cnn_fashion, gpt_chars, llama_chars, mlp_mnist1d
from bench.workloads.base import Size, WorkloadError
from bench.workloads.cnn_fashion import CnnSize
from bench.workloads.gpt_chars import GptSize

CPU = torch.device("cpu")
NAMES = sorted(workloads.registry())


def build(name: str, seed: int = 0) -> workloads.BuiltWorkload:
    wl = workloads.get(name)
    if wl.check():
        pytest.skip(wl.check())
    return wl.build("tiny", seed, CPU)


def test_the_three_reference_workloads_are_registered():
    assert {"mlp", "gpt", "cnn"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_parameters(name):
    a, b = build(name, 3).model.state_dict(), build(name, 3).model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build(name, 4).model.state_dict()
    if workloads.get(name).pretrained_start:  # every seed starts from the same trained weights
        assert all(torch.equal(a[k], c[k]) for k in a)
        return
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("name", NAMES)
def test_batches_are_deterministic_per_seed_and_of_the_declared_size(name):
    built = build(name)
    first = [next(built.batches(built.batch_size, 7)) for _ in range(2)]
    torch.manual_seed(123)  # global RNG state must not matter
    it = built.batches(built.batch_size, 7)
    again = [next(it), next(it)]
    assert torch.equal(first[0][0], again[0][0]) and torch.equal(first[0][1], again[0][1])
    assert not torch.equal(again[0][0], again[1][0])  # the iterator moves on
    other = next(built.batches(built.batch_size, 8))
    assert not torch.equal(first[0][0], other[0])
    x, y = again[0]
    assert x.device.type == "cpu" and y.device.type == "cpu"
    assert len(x) == len(y) == built.batch_size
    if built.tokens_per_sample:
        assert x.shape == y.shape == (built.batch_size, built.tokens_per_sample)
    assert len(next(built.batches(5, 0))[0]) == 5


@pytest.mark.parametrize("name", NAMES)
def test_declared_fields(name):
    wl, built = workloads.get(name), build(name)
    assert built.metric and built.lr > 0 and built.target is not None and built.params
    assert {"name", "source", "sha256", "n_train", "n_eval"} <= set(built.dataset)
    assert len(built.dataset["sha256"]) == 64
    # the one description of the model's parts: the plan's (from the size alone) is the built model's
    assert built.structure is not None and built.structure == wl.structure("tiny")
    blocks = built.model.get_submodule(built.structure.blocks)
    assert isinstance(blocks, nn.ModuleList) and len(blocks) == built.structure.n_blocks > 0
    assert wl.batchnorm("tiny") == any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in built.model.modules())


@pytest.mark.parametrize("name", NAMES)
def test_sizes_are_typed_and_round_trip_through_their_params(name):
    wl = workloads.get(name)
    for size, preset in wl.sizes.items():
        assert isinstance(preset, Size) and dataclasses.is_dataclass(preset)
        with pytest.raises(dataclasses.FrozenInstanceError):
            preset.batch_size = 1
        params = wl.size_params(size)
        assert type(preset).of(params) == preset and params == preset.params()
        assert params is not wl.size_params(size)  # a copy: a caller may change its own


def test_a_size_refuses_unknown_keys_and_bad_values_saying_what_is_valid():
    p = workloads.get("gpt").size_params("tiny")
    with pytest.raises(WorkloadError, match=r"GptSize has no parameter\(s\) 'n_layers' \(valid: n_layer, n_head, "):
        GptSize.of({**p, "n_layers": 3})
    with pytest.raises(WorkloadError, match="GptSize lacks lr"):
        GptSize.of({k: v for k, v in p.items() if k != "lr"})
    for key, value, words in (("n_layer", 0, "a whole number >= 1, got 0"), ("n_layer", True, "got True"),
                              ("lr", -1.0, "a number > 0, got -1.0"), ("corpus_mb", -1, "a number >= 0"),
                              ("target", "low", "a number > 0 or None, got 'low'"),
                              ("d_model", 65, "d_model 65 is not a whole number of heads (n_head 2)")):
        with pytest.raises(WorkloadError, match=re.escape(words)):
            GptSize.of({**p, key: value})
    assert GptSize.of({**p, "vocab_size": 99}) == GptSize.of(p)  # what the build adds (derived) is dropped
    with pytest.raises(WorkloadError, match=re.escape("lr_warmup_steps must be a whole number >= 0, got -1")):
        GptSize.of({**p, "lr_warmup_steps": -1})
    without = {k: v for k, v in p.items() if k != "lr_warmup_steps"}  # a size written before the warm-up existed
    assert GptSize.of(without).lr_warmup_steps == 0 == p["lr_warmup_steps"]
    assert CnnSize.of(workloads.get("cnn").size_params("tiny")).widths == (8, 16, 32)
    with pytest.raises(WorkloadError, match="widths must be a non-empty list of whole numbers >= 1"):
        CnnSize.of({**workloads.get("cnn").size_params("tiny"), "widths": []})


def test_a_workload_with_untyped_sizes_is_refused_at_registration():
    class Untyped(workloads.Workload):
        name = "untyped_sizes_test"
        sizes = {"tiny": {"batch_size": 8}}

        def build_from(self, params, seed, device):
            raise NotImplementedError

    with pytest.raises(TypeError, match="sizes 'tiny' must be Size dataclasses"):
        workloads.register(Untyped)
    assert "untyped_sizes_test" not in workloads.registry()


@pytest.mark.parametrize("name", NAMES)
def test_a_declared_source_task_is_the_one_the_build_provides(name):
    """The description declares a source task (what the plan checks) exactly when the build provides one (what
    transfer learning pretrains on), under the same name; its batches are seeded as the workload's are."""
    wl, built = workloads.get(name), build(name)
    planned = wl.structure("tiny")
    declared = built.structure.source_task if built.structure is not None else None
    assert (planned.source_task if planned is not None else None) == declared
    if built.source_task is None:
        assert declared is None
        return
    task = built.source_task()
    assert task.name == declared and task.info["task"] and isinstance(task.info["overlaps_target"], bool)
    a, b = next(task.batches(5, 7)), next(task.batches(5, 7))
    assert len(a[0]) == len(a[1]) == 5 and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], next(task.batches(5, 8))[0])


def test_cnn_aug_pretrains_on_the_unaugmented_source_task_of_cnn():
    plain, augmented = build("cnn").source_task(), build("cnn_aug").source_task()
    assert plain.info == augmented.info and plain.new_head and augmented.new_head
    assert all(torch.equal(a, b) for a, b in zip(plain.data, augmented.data, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_training_lowers_the_loss_and_evaluate_reports_the_metric(name):
    if workloads.get(name).pretrained_start:
        pytest.skip("starts from trained weights: its learning signal is the preference methods' (their test files)")
    torch.manual_seed(0)
    built = build(name)
    model = built.model
    opt = torch.optim.AdamW(model.parameters(), lr=built.lr)
    batches = built.batches(built.batch_size, 0)
    fixed = next(batches)

    def loss_on(batch):
        return built.loss_fn(model(batch[0]), batch[1])

    with torch.no_grad():
        before = float(loss_on(fixed))
    assert math.isfinite(before)
    for _ in range(30):
        loss = loss_on(next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        opt.step()
    with torch.no_grad():
        after = float(loss_on(fixed))
    assert after < 0.9 * before, (before, after)

    model.eval()
    with torch.no_grad():
        metrics = built.evaluate(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            metrics_bf16 = built.evaluate(model)
    assert isinstance(metrics[built.metric], float) and math.isfinite(metrics[built.metric])
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics_bf16[built.metric] == pytest.approx(metrics[built.metric], rel=0.1, abs=0.05)


def test_mnist1d_is_deterministic_balanced_and_40_long():
    x, y = mlp_mnist1d.make_mnist1d(500, seed=0)
    x2, y2 = mlp_mnist1d.make_mnist1d(500, seed=0)
    assert x.shape == (500, 40) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert np.array_equal(np.bincount(y), np.full(10, 50))
    assert not np.array_equal(x, mlp_mnist1d.make_mnist1d(500, seed=1)[0])
    assert abs(float(x.mean())) < 1e-4 and float(x.std()) == pytest.approx(1.0, rel=1e-3)


def test_mnist1d_gaussian_filter_matches_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    a = np.random.default_rng(0).standard_normal((4, 72))
    assert np.allclose(mlp_mnist1d._gaussian_filter(a, 2.0), ndimage.gaussian_filter1d(a, 2.0, axis=1))


def test_cnn_names_the_debian_package_when_data_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv(cnn_fashion.ENV_VAR, str(tmp_path))
    wl = workloads.get("cnn")
    reason = wl.check()
    assert reason and "dataset-fashion-mnist" in reason and str(tmp_path) in reason
    with pytest.raises(workloads.WorkloadError, match="apt-get install dataset-fashion-mnist") as info:
        wl.build("tiny", 0, CPU)
    assert "\n" not in str(info.value)


def test_gpt_dataset_records_corpus_hash_and_python_version():
    built = build("gpt")
    ds = built.dataset
    assert ds["python_version"] and ds["vocab_size"] == built.params["vocab_size"]
    assert ds["sha256"] == ds["pydoc_topics_sha256"]  # tiny: pydoc topics only
    assert ds["n_train"] > 9 * ds["n_eval"] * 0.99
    logits = built.model(next(built.batches(2, 0))[0])
    assert logits.shape == (2, built.tokens_per_sample, ds["vocab_size"])


def test_gpt2_124m_preset_has_85m_non_embedding_parameters():
    p = workloads.get("gpt").size_params("gpt2-124m")
    cfg = gpt_chars.GPTConfig(vocab_size=256, seq_len=p["seq_len"], n_layer=p["n_layer"], n_head=p["n_head"],
                              d_model=p["d_model"])
    with torch.device("meta"):
        model = gpt_chars.GPT(cfg)
    assert model.num_params(non_embedding=True) == pytest.approx(85e6, rel=0.01)


# ---- decoded datasets, once per sweep (bench.core.data.cached_arrays) ------------------------------------------


def _loaders() -> dict:
    """Each built-in dataset loader, as a workload's build calls it; the process's own memo cleared first."""
    d = cnn_fashion.data_dir()
    return {
        "gpt": lambda: gpt_chars.load_corpus(0.0),
        "mlp": lambda: mlp_mnist1d._dataset(),
        "cnn": lambda: cnn_fashion.fashion_subset(d, 6000, 1000),
    }


def _fresh(name: str):
    for f in (gpt_chars.load_corpus, mlp_mnist1d._dataset, cnn_fashion.fashion_subset):
        f.cache_clear()
    return _loaders()[name]()


def _same(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, tuple | list) and not isinstance(a, str):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("name", ["gpt", "mlp", "cnn"])
def test_a_dataset_read_from_the_sweeps_cache_is_the_one_decoded(name, tmp_path):
    from bench.core.data import CACHE_EVENTS

    if name == "cnn" and cnn_fashion.missing_reason(cnn_fashion.data_dir()):
        pytest.skip("Fashion-MNIST is not installed")
    try:
        workloads.use_artefact_dir(None)
        CACHE_EVENTS.clear()
        plain = _fresh(name)  # outside a sweep: decoded, nothing written
        assert set(CACHE_EVENTS.values()) == {"decoded"}
        workloads.use_artefact_dir(tmp_path)
        first = _fresh(name)  # the sweep's first process: decodes and caches
        assert set(CACHE_EVENTS.values()) == {"decoded"} and len(list((tmp_path / "datasets").iterdir())) == 1
        second = _fresh(name)  # any later one: reads it back
        assert set(CACHE_EVENTS.values()) == {"read"}
        _same(plain, first)
        _same(plain, second)
    finally:
        workloads.use_artefact_dir(None)
        _fresh(name)


def test_a_corrupt_or_foreign_cache_file_is_decoded_again_never_used(tmp_path):
    from bench.core.data import CACHE_EVENTS, cached_arrays

    calls = []

    def build():
        calls.append(1)
        return {"x": np.arange(1000, dtype=np.int64)}, {"note": "built"}

    arrays, meta = cached_arrays(tmp_path, "toy", "k1", build)
    (path,) = tmp_path.iterdir()
    path.write_bytes(path.read_bytes()[:-200])  # cut short: the zip's directory is gone
    again, _ = cached_arrays(tmp_path, "toy", "k1", build)
    assert CACHE_EVENTS["toy"] == "decoded" and len(calls) == 2 and np.array_equal(again["x"], arrays["x"])
    data = bytearray(path.read_bytes())
    data[data.index(b"\x00\x00\x00\x00\x00\x00\x00\x00", 200) + 8] ^= 0xFF  # one flipped byte inside the array
    path.write_bytes(bytes(data))
    cached_arrays(tmp_path, "toy", "k1", build)
    assert len(calls) == 3  # zip's CRC caught it
    cached_arrays(tmp_path, "toy", "k1", build)
    assert CACHE_EVENTS["toy"] == "read" and len(calls) == 3  # the rebuilt file reads back
    other = tmp_path / path.name.replace("k1", "k2")
    other.write_bytes(path.read_bytes())  # a file under another key's name holds k1's arrays
    _, meta2 = cached_arrays(tmp_path, "toy", "k2", build)
    assert len(calls) == 4 and meta2 == meta
    assert cached_arrays(None, "toy", "k1", build)[1] == {"note": "built"} and len(calls) == 5  # no directory


# ---- the GPU sizes (bench/plan/config.py's gpu preset): what can be checked without a GPU ----------------------


def test_gpt2_124m_b32_is_gpt2_124m_at_batch_32_with_its_warm_up_over_the_same_tokens():
    sizes = workloads.get("gpt").sizes
    base, b32 = sizes["gpt2-124m"], sizes["gpt2-124m-b32"]
    changed = {f.name for f in dataclasses.fields(GptSize) if getattr(base, f.name) != getattr(b32, f.name)}
    assert changed <= {"batch_size", "quality_steps", "eval_points", "lr_warmup_steps"}
    assert (b32.batch_size, b32.quality_steps) == (32, 120)
    warmup = getattr(base, "lr_warmup_steps", 0)  # the loop's LR warm-up, where gpt2-124m declares one
    assert getattr(b32, "lr_warmup_steps", 0) * b32.batch_size == warmup * base.batch_size
    wider = gpt_chars.at_batch(dataclasses.replace(sizes["tiny"]), 64)
    assert wider.batch_size == 64 and getattr(wider, "lr_warmup_steps", 0) == 0  # no warm-up stays none


def test_cnn_resnet18_is_resnet_18_shaped_with_about_11m_parameters():
    p = workloads.get("cnn").size_params("resnet18")
    with torch.device("meta"):
        model = cnn_fashion.ResNet(p["widths"], p["blocks_per_stage"], p["stem_stride"])
    assert sum(x.numel() for x in model.parameters()) == pytest.approx(11.2e6, rel=0.01)
    s = workloads.get("cnn").structure("resnet18")
    assert (s.n_blocks, len(s.channels)) == (4, 8)  # four stages of two basic blocks, each a channel group
    assert (p["n_train"], p["batch_size"], p["target"]) == (60000, 512, None)


def test_llama_180m_has_llama_parts_and_about_180m_parameters():
    p = {**workloads.get("llama").size_params("180m"), "vocab_size": 224}
    with torch.device("meta"):
        model = llama_chars.Llama(llama_chars.config_of(p))
    assert sum(x.numel() for x in model.parameters()) == pytest.approx(181e6, rel=0.01)
    s = model.trainbench_structure()
    assert s == workloads.get("llama").structure("180m")
    a = s.attention
    assert (a.heads, a.kv_heads, a.head_dim, a.rotary, a.projections) == (16, 4, 64, True, "separate")
    assert s.mlp.gate and s.mlp.hidden == 2816 and not s.tied and s.block_inputs == () and s.causal
    assert all(isinstance(m, nn.RMSNorm) for n, m in model.named_modules() if n.endswith("norm"))


def test_llama_sizes_refuse_heads_that_do_not_group():
    p = workloads.get("llama").size_params("tiny")
    for key, value, words in (("n_kv_head", 3, "does not divide n_head 4"), ("d_model", 66, "not a whole number"),
                              ("d_model", 60, "head dimension 15 is odd")):
        with pytest.raises(WorkloadError, match=re.escape(words)):
            llama_chars.LlamaSize.of({**p, key: value})


def _reference_attention(attn: llama_chars.Attention, x: torch.Tensor) -> torch.Tensor:
    """The Llama attention written out: projections, rotation of each (even, odd) half pair by position x angle,
    every query head attending with key/value head h // groups, causal softmax of q.k / sqrt(d)."""
    B, T, _ = x.shape
    d = attn.head_dim
    q, k, v = (p(x).view(B, T, -1, d).transpose(1, 2) for p in (attn.q, attn.k, attn.v))
    inv = 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    angle = torch.arange(T).float()[:, None] * inv  # (T, d/2)
    cos, sin = angle.cos(), angle.sin()

    def rot(t: torch.Tensor) -> torch.Tensor:
        a, b = t[..., : d // 2], t[..., d // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    q, k = rot(q), rot(k)
    groups = q.shape[1] // k.shape[1]
    k, v = (t[:, [h // groups for h in range(q.shape[1])]] for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return attn.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))


def test_llama_attention_is_rotary_grouped_causal_attention():
    built = build("llama")
    attn = built.model.blocks[0].attn
    x = torch.randn(2, 12, built.model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(attn(x), _reference_attention(attn, x), atol=1e-5)
        # causal: the first positions do not see what follows them
        y = x.clone()
        y[:, 6:] += 1.0
        assert torch.equal(attn(x)[:, :6], attn(y)[:, :6])


def test_llama_is_planned_for_tensor_and_pipeline_parallelism_and_checkpointing():
    """The described structure carries what tp (separate q, k, v and whole key/value heads per rank), pp (blocks
    that take the hidden state alone) and checkpointing (the blocks) ask for; pp's own check runs its stages."""
    from bench.plan.config import TechniqueSet, WorkloadSpec
    from bench.plan.planner import incompatibility
    from techniques import pp

    spec = WorkloadSpec("llama", "tiny")
    for label, world in (("tp", 2), ("pp", 2), ("checkpointing", 1)):
        assert incompatibility(TechniqueSet.parse(label), spec, CPU, world) is None, label
    built = build("llama")
    x = next(built.batches(2, 0))[0]
    pp.check_decomposition(built.model, built.structure, x)  # raises when the stages are not the model
