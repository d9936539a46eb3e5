"""Batch-size search: the pure searches against scripted measurements, the noise-scale estimator against a problem
with a known B_simple, the memory search on the real mlp workload, and the technique end to end."""

import math

import pytest
import torch

from bench import workloads
from bench.loop import plain_loop
from techniques.base import Context, OptionError, Probe, TrainConfig
from techniques.batch_size import (
    STATE_KEY,
    BatchSize,
    b_simple,
    clamp_batch,
    fastest_batch,
    largest_fitting,
    memory_measure,
    nearest_power_of_two,
    noise_scale,
    parse_bytes,
    power_ladder,
    scaled_lr,
)
from tests.helpers import TechniqueSettings, build_loop

SETTINGS = TechniqueSettings("batch_size:mode=noise:noise_repeats=2:warmup_steps=5", "mlp")

CPU = torch.device("cpu")


def linear_memory(batch: int) -> int:
    return 1000 + 37 * batch  # fits 50_000 bytes up to floor(49_000 / 37) = 1324


# ---- largest_fitting ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [1, 64])
def test_largest_fitting_finds_the_exact_boundary_of_a_linear_memory_model(start):
    chosen, trace = largest_fitting(linear_memory, 50_000, start, 4096)
    assert chosen == 1324
    assert {"batch": 1324, "bytes": 1000 + 37 * 1324, "fits": True} in trace
    assert {"batch": 1325, "bytes": 1000 + 37 * 1325, "fits": False} in trace
    assert trace[0]["batch"] == start


def test_largest_fitting_with_a_margin_uses_the_reduced_budget():
    budget = BatchSize.Options(memory="50000", margin=0.1).budget_bytes
    assert budget == 45_000
    assert largest_fitting(linear_memory, budget, 1, 4096)[0] == (45_000 - 1000) // 37


def test_largest_fitting_is_none_when_start_does_not_fit():
    chosen, trace = largest_fitting(linear_memory, 50_000, 2000, 4096)
    assert chosen is None
    assert trace == [{"batch": 2000, "bytes": 1000 + 37 * 2000, "fits": False}]


def test_largest_fitting_treats_out_of_memory_as_not_fitting():
    def measure(batch: int) -> int | None:
        return None if batch > 500 else batch  # "OOM" above 500, far below the budget in bytes

    chosen, trace = largest_fitting(measure, 10**9, 8, 4096)
    assert chosen == 500
    assert {"batch": 501, "bytes": None, "fits": False} in trace


def test_largest_fitting_stops_at_max_batch():
    chosen, trace = largest_fitting(linear_memory, 10**9, 3, 100)
    assert chosen == 100
    assert max(t["batch"] for t in trace) == 100


def test_largest_fitting_on_the_real_mlp_respects_a_budget_between_two_peaks():
    built = workloads.get("mlp").build("tiny", 0, CPU)
    measure = memory_measure(built, plain_loop(built, built.lr, CPU), seed=0)
    peak_64, peak_128 = measure(64), measure(128)
    assert peak_64 < peak_128
    assert measure(64) == peak_64  # the tensor tracker is exactly repeatable
    budget = (peak_64 + peak_128) // 2
    chosen, trace = largest_fitting(measure, budget, 64, 4000)
    assert 64 <= chosen < 128
    probes = {t["batch"]: t for t in trace}
    assert probes[chosen]["fits"] and probes[chosen]["bytes"] <= budget
    assert not probes[chosen + 1]["fits"] and probes[chosen + 1]["bytes"] > budget


def test_memory_mode_chooses_what_largest_fitting_finds_and_scales_the_lr():
    wl = workloads.get("mlp")
    built = wl.build("tiny", 0, CPU)
    measure = memory_measure(built, plain_loop(built, built.lr, CPU), seed=0)
    budget = (measure(64) + measure(128)) // 2
    expected, _ = largest_fitting(measure, budget, 64, 4000)
    tech = BatchSize(BatchSize.Options(mode="memory", memory=str(budget), margin=0.0))
    ctx = Context(device=CPU)
    probe = Probe(lambda: wl.build("tiny", 0, CPU), CPU, make_loop=plain_loop)
    cfg = tech.tune(TrainConfig(batch_size=64, lr=1e-3), probe, ctx)
    assert cfg.batch_size == expected
    assert cfg.lr == pytest.approx(1e-3 * math.sqrt(expected / 64))
    assert tech.results(ctx)["budget_bytes"] == budget


def test_memory_mode_raises_when_nothing_fits():
    wl = workloads.get("mlp")
    tech = BatchSize(BatchSize.Options(mode="memory", memory="1KiB"))
    with pytest.raises(ValueError, match="exceeds the memory budget"):
        tech.tune(TrainConfig(batch_size=64), Probe(lambda: wl.build("tiny", 0, CPU), CPU, make_loop=plain_loop),
                  Context(device=CPU))


# ---- fastest_batch ------------------------------------------------------------------------------------------------


def test_fastest_batch_picks_the_argmax_of_the_rates():
    rates = {1: 10.0, 2: 30.0, 4: 80.0, 8: 75.0, 16: 20.0}
    chosen, trace = fastest_batch(rates.__getitem__, list(rates))
    assert chosen == 4
    assert [t["samples_per_s"] for t in trace] == list(rates.values())


def test_fastest_batch_stops_the_ladder_at_out_of_memory():
    rates = {1: 10.0, 2: 30.0, 4: None, 8: 1000.0}
    chosen, trace = fastest_batch(rates.__getitem__, list(rates))
    assert chosen == 2
    assert [t["batch"] for t in trace] == [1, 2, 4]


def test_throughput_mode_chooses_a_measured_ladder_batch():
    loop, batches, _ = build_loop("mlp", "batch_size:mode=throughput:max_batch=64:probe_steps=1")
    found = loop.ctx.state[STATE_KEY]
    assert [t["batch"] for t in found["trace"]] == [1, 2, 4, 8, 16, 32, 64]
    assert all(t["samples_per_s"] > 0 for t in found["trace"])
    assert next(batches)[0].shape[0] == found["batch_size"] in power_ladder(1, 64)


# ---- noise scale --------------------------------------------------------------------------------------------------


def synthetic_b_simple(seed: int, repeats: int, n: int = 8, b: int = 4, dim: int = 50) -> tuple[float, float]:
    """(estimated, true) B_simple for per-example gradients g = mu + L z with a known tr(Sigma) / |mu|^2."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(dim, generator=gen, dtype=torch.float64) / math.sqrt(32)
    chol = torch.randn(dim, dim, generator=gen, dtype=torch.float64) / math.sqrt(dim)
    true = float(chol.square().sum()) / float(mu.square().sum())  # tr(L L^T) = |L|_F^2

    def micro_batch_gradient(_i: int) -> torch.Tensor:
        z = torch.randn(b, dim, generator=gen, dtype=torch.float64)
        return (mu + z @ chol.T).mean(0)  # the mean of b per-example gradients

    estimates = [noise_scale(micro_batch_gradient, n, b) for _ in range(repeats)]
    return b_simple(estimates), true


def test_noise_scale_recovers_a_known_b_simple():
    estimated, true = synthetic_b_simple(seed=0, repeats=200)
    assert 10 < true < 100
    assert estimated == pytest.approx(true, rel=0.15)
    assert synthetic_b_simple(seed=0, repeats=200) == (estimated, true)  # deterministic with a fixed seed


def test_noise_scale_of_identical_gradients_is_all_signal():
    g = torch.tensor([3.0, 4.0])
    trace_sigma, g2 = noise_scale(lambda _i: g, 4, 2)
    assert trace_sigma == pytest.approx(0.0, abs=1e-12)
    assert g2 == pytest.approx(25.0)


def test_a_failed_noise_estimate_keeps_the_default_batch():
    from techniques.batch_size import batch_for_noise_scale

    assert batch_for_noise_scale(math.inf, 64) == 64 and batch_for_noise_scale(-3.0, 64) == 64
    assert batch_for_noise_scale(90.0, 64) == 64 and batch_for_noise_scale(200.0, 64) == 256


def test_b_simple_averages_before_dividing_and_is_inf_when_noise_dominates():
    assert b_simple([(10.0, 1.0), (10.0, -0.5)]) == pytest.approx(40.0)  # dividing first would give -5
    assert b_simple([(1.0, -1.0), (1.0, 0.5)]) == math.inf


# min_batch=256 forces a batch other than the workload's 64, so a tune whose result were dropped would fail
@pytest.mark.parametrize("extra", ["", ":min_batch=256"])
def test_noise_mode_end_to_end_trains_at_the_chosen_batch(extra):
    loop, batches, _ = build_loop("mlp", "batch_size:mode=noise:noise_repeats=2:warmup_steps=5" + extra)
    found = BatchSize().results(loop.ctx)
    if extra:
        assert found["batch_size"] >= 256
    assert found["mode"] == "noise" and len(found["trace"]) == 2 and found["warmup"]["steps"] == 5
    assert found["b_simple"] is None or found["b_simple"] > 0
    x, _ = next(batches)
    assert x.shape[0] == found["batch_size"]
    assert loop.optimizer.param_groups[0]["lr"] == pytest.approx(found["lr_after"])
    assert found["lr_after"] == pytest.approx(found["lr_before"] * math.sqrt(found["batch_size"] / 64))
    losses = [float(loop.step(next(batches))) for _ in range(2)]
    assert all(math.isfinite(v) for v in losses)


# ---- batch and LR arithmetic --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "factor"), [("sqrt", 2.0), ("auto", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_lr_scaling_rules_at_four_times_the_batch(rule, factor):
    assert scaled_lr(1e-3, 64, 256, rule) == pytest.approx(1e-3 * factor)


def test_batch_rounding_and_clamping():
    assert nearest_power_of_two(198.3) == 256 and nearest_power_of_two(170.0) == 128
    assert clamp_batch(1000, 1, 4096, 4000, 3) == 999  # a multiple of the micro-batches
    assert clamp_batch(8192, 1, 8192, 4000, 1) == 4000  # never beyond the training set
    assert clamp_batch(1, 1, 4096, None, 4) == 4  # at least one sample per micro-batch
    assert power_ladder(3, 40) == [4, 8, 16, 32]


# ---- options and planning -----------------------------------------------------------------------------------------


def test_memory_sizes_parse():
    assert parse_bytes("3GiB") == 3 * 2**30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1024") == 1024
    assert BatchSize.parse_options({"memory": "3GiB"}).memory == "3GiB"


def test_bad_options_are_errors_that_name_what_is_valid():
    with pytest.raises(OptionError, match="KiB, MiB, GiB"):
        BatchSize.parse_options({"memory": "2 parsecs"})
    with pytest.raises(OptionError, match="margin"):
        BatchSize.parse_options({"margin": "1.0"})
    with pytest.raises(OptionError, match="memory, throughput, noise"):
        BatchSize.parse_options({"mode": "fastest"})
    with pytest.raises(ValueError, match="min_batch"):
        BatchSize.Options(min_batch=64, max_batch=32)


def test_check_refuses_several_ranks():
    tech = BatchSize()
    assert tech.check(Context(device=CPU)) is None
    assert "several ranks" in tech.check(Context(device=CPU, world_size=2))
