"""Multi-token prediction: the added modules train, evaluation sees the plain GPT, the loss is the papers' sum, and no
depth sees the token it predicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import techniques.mtp  # noqa: F401  (registers "mtp")
from bench import workloads
from bench.plan.config import ConfigError, TechniqueSpec
from bench.workloads import gpt_chars
from techniques.base import Context, TrainOutput
from techniques.checkpointing import CheckpointedBlock
from techniques.mtp import MTP, apply_mtp, mtp_losses
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("mtp", "gpt")

VARIANTS = ["heads", "sequential"]
CFG = gpt_chars.GPTConfig(vocab_size=11, seq_len=12, n_layer=2, n_head=2, d_model=16)


def small_mtp(variant: str, n: int, seed: int = 0, cfg: gpt_chars.GPTConfig = CFG) -> gpt_chars.GPT:
    torch.manual_seed(0)
    return apply_mtp(gpt_chars.GPT(cfg), variant, n, seed)


def mtp_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if name.startswith("mtp.")}


@pytest.mark.parametrize("label", ["mtp", "mtp:variant=sequential"])
def test_every_mtp_parameter_gets_a_gradient_and_an_update(label):
    loop, batches, _ = build_loop("gpt", label)
    params = mtp_params(loop.model)
    in_optimizer = {id(q) for group in loop.optimizer.param_groups for q in group["params"]}
    assert params and all(id(p) in in_optimizer for p in params.values())  # the optimizer was built after them
    before = {name: p.detach().clone() for name, p in params.items()}
    loss = loop.step(next(batches))
    assert torch.isfinite(loss)
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert not torch.equal(p.detach(), before[name]), name
    assert any(k.startswith("mtp.") for k in loop.model.state_dict())


@pytest.mark.parametrize("variant", VARIANTS)
def test_evaluation_sees_the_plain_gpt_and_ignores_the_heads(variant):
    loop, batches, built = build_loop("gpt", f"mtp:variant={variant}:n=3")
    model = loop.model
    x, y = next(batches)
    loop.step((x, y))  # trunk and heads move away from their initialisation
    plain = gpt_chars.GPT(model.cfg)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")})
    train_out = model(x)
    assert isinstance(train_out, TrainOutput) and torch.equal(train_out.logits, plain(x))  # same next-token math
    model.eval()
    plain.eval()
    out = model(x)
    assert type(out) is torch.Tensor and torch.equal(out, plain(x))
    with torch.no_grad():
        metrics = built.evaluate(model)
        for p in mtp_params(model).values():
            p.add_(1.0)
        assert built.evaluate(model) == metrics
        model.train()
        moved = model(x).extra["mtp_logits"]  # the perturbation is real: the training-mode heads see it
    assert not torch.equal(moved[0], train_out.extra["mtp_logits"][0].detach())


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood, written out."""
    logp = logits.log_softmax(-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).mean()


@pytest.mark.parametrize("variant,weight,scale", [("heads", None, 1.0), ("heads", 0.5, 0.5),
                                                  ("sequential", None, 0.3 / 2), ("sequential", 0.4, 0.4 / 2)])
def test_the_loss_hook_adds_the_weighted_shifted_cross_entropies(variant, weight, scale):
    gen = torch.Generator().manual_seed(3)
    B, T, V = 3, 7, 5
    main = torch.randn(B, T, V, generator=gen)
    aux = [torch.randn(B, T - 1, V, generator=gen), torch.randn(B, T - 2, V, generator=gen)]
    x, y = torch.randint(V, (B, T), generator=gen), torch.randint(V, (B, T), generator=gen)
    tech = MTP(MTP.Options(variant=variant, n=3, weight=weight))
    base = F.cross_entropy(main.reshape(-1, V), y.reshape(-1))
    got = tech.loss(TrainOutput(main, {"mtp_logits": aux}), (x, y), base, Context(device=torch.device("cpu")))
    l2, l3 = _ce(aux[0], y[:, 1:]), _ce(aux[1], y[:, 2:])  # t+2 = y[:, i+1], t+3 = y[:, i+2]
    assert torch.allclose(got, base + scale * (l2 + l3), rtol=1e-6, atol=0)
    assert tech.aux_scale == pytest.approx(scale)
    found = tech.results(Context(device=torch.device("cpu")))
    assert found["aux_loss_last"] == pytest.approx({"t+2": float(l2), "t+3": float(l3)}, rel=1e-6)
    assert found["weight"] == (weight if weight is not None else {"heads": 1.0, "sequential": 0.3}[variant])
    with pytest.raises(TypeError, match="TrainOutput"):
        tech.loss(main, (x, y), base, Context(device=torch.device("cpu")))


def test_mtp_losses_align_each_depth_with_its_target():
    V = 4
    y = torch.tensor([[0, 1, 2, 3, 0]])
    perfect = [F.one_hot(y[:, d:], V).float() * 100 for d in (1, 2)]  # logits that put all mass on the right token
    assert all(float(loss) < 1e-6 for loss in mtp_losses(perfect, y))
    next_token = [F.one_hot(y[:, :-1], V).float() * 100]  # the next token's targets, one depth too shallow
    assert float(mtp_losses(next_token, y)[0]) > 10


@pytest.mark.parametrize("j", [3, 6, 10])
def test_no_depth_sees_its_target_sequential(j):
    """Depth k's logits at position i (predicting t_{i+k+1} = x[i+k+1]) read inputs up to x[i+k]: changing x[:, j]
    leaves every position with i + k < j unchanged, and changes position i = j - k (the bound is tight)."""
    model = small_mtp("sequential", n=4)
    x = torch.randint(CFG.vocab_size, (2, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, j] = (x[:, j] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, b = model(x), model(x2)
    depths = [a.logits, *a.extra["mtp_logits"]]
    moved = [b.logits, *b.extra["mtp_logits"]]
    for k, (la, lb) in enumerate(zip(depths, moved, strict=True)):  # k = 0: the next-token logits
        assert la.shape[1] == CFG.seq_len - k
        keep = max(j - k, 0)
        assert torch.equal(la[:, :keep], lb[:, :keep]), (k, j)
        if j - k < la.shape[1]:
            assert not torch.equal(la[:, j - k], lb[:, j - k]), (k, j)


@pytest.mark.parametrize("j", [0, 5, 11])
def test_no_head_sees_the_future_heads(j):
    """Every head's logits at positions < j are unchanged when x[:, j] changes; position j's change."""
    model = small_mtp("heads", n=3)
    x = torch.randint(CFG.vocab_size, (2, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    x2 = x.clone()
    x2[:, j] = (x[:, j] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, b = model(x), model(x2)
    for la, lb in zip([a.logits, *a.extra["mtp_logits"]], [b.logits, *b.extra["mtp_logits"]], strict=True):
        assert torch.equal(la[:, :j], lb[:, :j])
        if j < la.shape[1]:
            assert not torch.equal(la[:, j], lb[:, j])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [2, 3])
def test_shapes_and_parameter_counts(variant, n):
    model = small_mtp(variant, n)
    B, T, V, d = 2, CFG.seq_len, CFG.vocab_size, CFG.d_model
    out = model(torch.zeros(B, T, dtype=torch.long))
    assert out.logits.shape == (B, T, V)
    assert [t.shape for t in out.extra["mtp_logits"]] == [(B, T - k, V) for k in range(1, n)]
    assert len(model.mtp) == n - 1 and isinstance(model, gpt_chars.GPT)
    block = sum(p.numel() for p in gpt_chars.Block(CFG).parameters())
    per_module = block if variant == "heads" else block + 2 * d * d + 2 * d  # M_k (no bias) and two RMSNorms
    tech = MTP(MTP.Options(variant=variant, n=n))
    tech.transform_model(gpt_chars.GPT(CFG), Context(device=torch.device("cpu")))
    assert tech.results(Context(device=torch.device("cpu")))["extra_params"] == (n - 1) * per_module
    short = model(torch.zeros(B, 2, dtype=torch.long))  # a sequence too short for the deepest depths: they are skipped
    assert [t.shape[1] for t in short.extra["mtp_logits"]] == [1]


def test_heads_are_seeded_by_the_trial_seed_and_leave_the_global_rng_alone():
    a, b = small_mtp("heads", 3, seed=5), small_mtp("heads", 3, seed=5)
    for (name, pa), pb in zip(a.mtp.named_parameters(), b.mtp.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    c = small_mtp("heads", 3, seed=6)
    assert not torch.equal(a.mtp[0].attn.qkv.weight, c.mtp[0].attn.qkv.weight)
    torch.manual_seed(0)
    gpt_chars.GPT(CFG)
    expected = torch.get_rng_state()
    torch.manual_seed(0)
    apply_mtp(gpt_chars.GPT(CFG), "sequential", 3, seed=1)
    assert torch.equal(torch.get_rng_state(), expected)  # the trial's later draws are the baseline's


def test_check_refuses_other_workloads_and_other_sharding():
    tech = MTP()
    cpu = torch.device("cpu")
    mlp = workloads.get("mlp").structure("tiny")  # no token embedding: not a decoder
    assert "token embedding" in tech.check(Context(device=cpu, workload="mlp", structure=mlp))
    assert tech.check(Context(device=cpu, structure=workloads.get("hf").structure("llama-tiny"))) is None
    assert tech.check(Context(device=cpu, workload="gpt")) is None
    assert tech.check(Context(device=cpu, workload="gpt", world_size=2, technique_names=("mtp", "ddp"))) is None
    assert "zero3" in tech.check(Context(device=cpu, workload="gpt", world_size=2, technique_names=("mtp", "zero3")))
    assert {"tp", "pp"} <= MTP.conflicts


@pytest.mark.parametrize("label,match", [("mtp:n=1", "n must be >= 2"), ("mtp:variant=medusa", "heads, sequential"),
                                         ("mtp:weight=-1", "weight")])
def test_bad_options_say_what_is_valid(label, match):
    with pytest.raises(ConfigError, match=match):
        TechniqueSpec.parse(label)


def test_heads_need_two_blocks_and_a_gpt():
    one = gpt_chars.GPTConfig(vocab_size=11, seq_len=12, n_layer=1, n_head=2, d_model=16)
    with pytest.raises(ValueError, match="n_layer >= 2"):
        apply_mtp(gpt_chars.GPT(one), "heads", 2)
    apply_mtp(gpt_chars.GPT(one), "sequential", 2)  # the chain starts after the last block: one is enough
    with pytest.raises(ValueError, match="mtp: needs the model's blocks, token embedding, output head"):
        apply_mtp(torch.nn.Linear(2, 2), "heads", 2)
    with pytest.raises(ValueError, match="already"):
        apply_mtp(small_mtp("heads", 2), "heads", 2)


@pytest.mark.parametrize("label", ["mtp+checkpointing", "mtp:variant=sequential+checkpointing"])
def test_checkpointing_still_finds_the_blocks(label):
    loop, batches, _ = build_loop("gpt", label)
    assert all(isinstance(b, CheckpointedBlock) for b in loop.model.blocks)
    assert torch.isfinite(loop.step(next(batches)))
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mtp_params(loop.model).values())



def test_under_ddp_the_train_output_reaches_the_loss_hook(one_rank_group):
    loop, batches, _ = build_loop("gpt", "mtp+ddp")
    assert isinstance(loop.model, torch.nn.parallel.DistributedDataParallel)
    for _ in range(2):  # DDP refuses a second step when a parameter missed its reduction in the first
        assert torch.isfinite(loop.step(next(batches)))
    assert all(p.grad.abs().sum() > 0 for p in mtp_params(loop.model.module).values())


@pytest.mark.slow
def test_a_real_trial_records_the_heads_and_their_flops(tmp_path):
    from bench.trial import TrialSpec, run
    from tests.conftest import TINY_BUDGET

    def trial(techniques: list[str]):
        spec = TrialSpec(sweep_id="t", trial_id="t", workload="gpt", size="tiny", techniques=techniques, seed=0,
                         repeat=0, device="cpu", budget=dict(TINY_BUDGET), reference_dir=str(tmp_path))
        rec = run(spec)
        assert rec.status == "ok", rec.reason
        return rec

    rec, base = trial(["mtp:n=3"]), trial(["baseline"])
    found = rec.technique_results["mtp"]
    assert found["variant"] == "heads" and found["n"] == 3 and found["extra_params"] > 0
    assert set(found["aux_loss_last"]) == {"t+2", "t+3"} and all(v > 0 for v in found["aux_loss_last"].values())
    assert rec.kind == "algorithmic"
    assert rec.speed.flops_per_step > base.speed.flops_per_step > 0
