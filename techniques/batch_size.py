"""Batch-size search: choose the global batch by memory, by throughput or by the gradient noise scale, and rescale the
learning rate to match.

Method card
- What: ``tune`` probes a fresh copy of the workload: ``mode=memory`` the largest batch whose step fits ``memory``
  (the tensor tracker's peak on CPU, the CUDA allocator's on GPU); ``throughput`` the fastest power of two;
  ``noise`` the power of two nearest the simple noise scale, estimated after a warm-up (McCandlish et al. 2018). The
  LR follows: square root for Adam-family optimizers (``auto``), ``linear`` for SGD, ``none``.
- When it should pay: a batch well below the critical batch wastes steps on gradient noise; a larger one also raises
  throughput until the hardware saturates, which ``throughput`` finds directly.
- Caveats: at equal samples a larger batch takes fewer steps and on short budgets usually ends worse; time to target
  says whether the trade paid. The probes run plain fp32, their time a one-off cost.
- Sources: McCandlish et al., "An Empirical Model of Large-Batch Training" (arXiv:1812.06162); Smith et al., "Don't
  Decay the Learning Rate, Increase the Batch Size" (ICLR 2018); Malladi et al., NeurIPS 2022 (the square-root rule
  for Adam); PyTorch Lightning's ``BatchSizeFinder``.

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-batch_size (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- AMD EPYC (AVX2 only), `reports/example-cpu-convergence`: cnn:tiny, gpt:tiny, mlp:tiny, quality and time to target only (no speed window): their answers are in its report.md.
<!-- end generated -->
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from bench.measure.memory import TensorMemoryTracker
from techniques import _reading as rd
from techniques.base import Context, Kind, Probe, ProbeLoop, Technique, TrainConfig, register

log = logging.getLogger(__name__)

STATE_KEY = "batch_size_search"  # where tune leaves what it found, for results()

# ---- byte sizes ---------------------------------------------------------------------------------------------------

_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_BYTES_FORMS = "an integer number of bytes, or a number with B, KiB, MiB, GiB, KB, MB or GB (e.g. 2GiB, 512MB)"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"3GiB"`` -> 3 * 2**30. Raises ValueError naming the valid forms."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _UNITS) or (not unit and "." in match.group(1)):
        raise ValueError(f"memory={text!r} is not a byte size: write {_BYTES_FORMS}")
    value = int(float(match.group(1)) * _UNITS[unit or "b"])
    if value <= 0:
        raise ValueError(f"memory={text!r} must be more than 0 bytes")
    return value


# ---- the searches, as pure functions of a measurement -------------------------------------------------------------


def largest_fitting(
    measure: Callable[[int], int | None], budget_bytes: int, start: int, max_batch: int
) -> tuple[int | None, list[dict[str, Any]]]:
    """The largest batch in [start, max_batch] whose ``measure`` (peak bytes; None: out of memory) fits the budget.

    Doubles from ``start`` while it fits, then bisects between the last size that fit and the first that did not,
    so it assumes memory grows with the batch. Returns (None, trace) when even ``start`` does not fit.
    """
    if not 1 <= start <= max_batch:
        raise ValueError(f"need 1 <= start <= max_batch, got start={start}, max_batch={max_batch}")
    trace: list[dict[str, Any]] = []

    def fits(batch: int) -> bool:
        used = measure(batch)
        ok = used is not None and used <= budget_bytes
        trace.append({"batch": batch, "bytes": used, "fits": ok})
        return ok

    if not fits(start):
        return None, trace
    fitting, failing = start, None
    while failing is None and fitting < max_batch:
        batch = min(2 * fitting, max_batch)
        if fits(batch):
            fitting = batch
        else:
            failing = batch
    while failing is not None and failing - fitting > 1:
        mid = (fitting + failing) // 2
        if fits(mid):
            fitting = mid
        else:
            failing = mid
    return fitting, trace


def fastest_batch(measure_rate: Callable[[int], float | None], ladder: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """The ladder batch with the highest ``measure_rate`` (samples/s). A rate of None means the batch did not fit
    in memory: the ladder stops there, since larger batches would not fit either."""
    trace: list[dict[str, Any]] = []
    for batch in ladder:
        rate = measure_rate(batch)
        trace.append({"batch": batch, "samples_per_s": rate})
        if rate is None:
            break
    measured = [t for t in trace if t["samples_per_s"] is not None]
    if not measured:
        raise ValueError(f"no batch of the ladder {ladder} could be measured (the first ran out of memory)")
    return max(measured, key=lambda t: t["samples_per_s"])["batch"], trace


def noise_scale(grads: Callable[[int], torch.Tensor], n: int, b: int) -> tuple[float, float]:
    """Unbiased (tr(Sigma), |G|^2) from ``n`` micro-batch gradients of ``b`` samples each, all taken at the same
    parameters (McCandlish et al. 2018, Appendix A, with B_small = b and B_big = n * b).

    ``grads(i)`` is micro-batch i's flattened gradient. The estimates are streamed: one running sum, not n copies.
    """
    if n < 2 or b < 1:
        raise ValueError(f"need n >= 2 micro-batches of b >= 1 samples, got n={n}, b={b}")
    total: torch.Tensor | None = None
    sum_sq = 0.0
    for i in range(n):
        g = grads(i).detach().reshape(-1).double()  # float64: the estimates are differences of close numbers
        sum_sq += float(g.square().sum())
        total = g if total is None else total + g
    assert total is not None
    small_sq = sum_sq / n  # |G_small|^2: the mean squared norm of a b-sample gradient
    big_sq = float((total / n).square().sum())  # |G_big|^2: the squared norm of the n*b-sample gradient
    b_small, b_big = b, n * b
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace_sigma = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return trace_sigma, g2


def b_simple(estimates: list[tuple[float, float]]) -> float:
    """B_simple = tr(Sigma) / |G|^2 with numerator and denominator averaged over the estimates first: the ratio of
    single noisy estimates is biased (the paper smooths both before dividing). inf when the averaged |G|^2 is not
    positive: the gradient noise swamps the signal at these batch sizes."""
    if not estimates:
        raise ValueError("b_simple needs at least one (trace_sigma, g2) estimate")
    trace_sigma = sum(e[0] for e in estimates) / len(estimates)
    g2 = sum(e[1] for e in estimates) / len(estimates)
    return trace_sigma / g2 if g2 > 0 else math.inf


# ---- batch and LR arithmetic --------------------------------------------------------------------------------------


def nearest_power_of_two(x: float) -> int:
    """The power of two nearest to ``x`` in log space (x > 0, finite)."""
    return 2 ** max(0, round(math.log2(x)))


def power_ladder(low: int, high: int) -> list[int]:
    """Powers of two from the first >= ``low`` up to ``high``."""
    batch = 2 ** math.ceil(math.log2(max(low, 1)))
    ladder = []
    while batch <= high:
        ladder.append(batch)
        batch *= 2
    return ladder


def clamp_batch(batch: int, min_batch: int, max_batch: int, train_size: int | None, micro_batches: int) -> int:
    """``batch`` within [min_batch, max_batch] and the training set, rounded down to a multiple of the micro-batches
    (so gradient accumulation still splits it evenly), never below one micro-batch each."""
    batch = min(max(batch, min_batch), max_batch)
    if train_size is not None:
        batch = min(batch, train_size)
    return max(micro_batches, batch - batch % micro_batches)


def resolve_rule(rule: str) -> str:
    """``auto`` is the square-root rule: the harness's default optimizer is AdamW (SGD would want ``linear``)."""
    return "sqrt" if rule == "auto" else rule


def scaled_lr(lr: float, old_batch: int, new_batch: int, rule: str) -> float:
    """The LR for ``new_batch`` given ``lr`` tuned at ``old_batch``."""
    ratio = new_batch / old_batch
    exponents = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}
    return lr * ratio ** exponents[resolve_rule(rule)]


# ---- measurements on a fresh copy of the workload -----------------------------------------------------------------


def train_size(built: Any) -> int | None:
    """Samples in the in-memory training set (a batch cannot exceed it); None when the workload keeps none."""
    return len(built.train_data[0]) if built.train_data is not None else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forget_failed_step(loop: ProbeLoop) -> None:
    """After an out-of-memory error: drop the half-done step's gradients and hand the cached blocks back."""
    loop.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()


def step_peak_bytes(loop: ProbeLoop, batch: tuple[torch.Tensor, torch.Tensor], baseline_bytes: int = 0) -> int:
    """Peak bytes of one training step: the CUDA allocator's peak less ``baseline_bytes``, or on CPU the tensor
    tracker's peak (params, grads, optimizer state and activations; RSS would add torch and cached pages)."""
    if loop.device.type == "cuda":
        _sync(loop.device)
        torch.cuda.reset_peak_memory_stats(loop.device)
        loop.step(batch)
        _sync(loop.device)
        return int(torch.cuda.max_memory_allocated(loop.device)) - baseline_bytes
    tracker = TensorMemoryTracker(loop.model, loop.optimizer)
    with tracker:
        loop.step(batch)
    return tracker.result().peak_bytes


def memory_measure(built: Any, loop: ProbeLoop, seed: int, baseline_bytes: int = 0) -> Callable[[int], int | None]:
    """``largest_fitting``'s measurement: the peak bytes of a step of ``loop`` at a batch; None when CUDA runs out
    of memory. One unmeasured step runs first, because AdamW allocates its state lazily at the first step.

    On CUDA the allocator's peak counts everything on the device, so ``baseline_bytes`` (allocated before the probe
    copy was built: the trial's own model) is subtracted.
    """
    warmed = False

    def measure(batch: int) -> int | None:
        nonlocal warmed
        batches = built.batches(batch, seed)
        try:
            if not warmed:
                loop.step(next(batches))
                warmed = True
            return step_peak_bytes(loop, next(batches), baseline_bytes)
        except torch.cuda.OutOfMemoryError:
            _forget_failed_step(loop)
            return None

    return measure


def rate_measure(built: Any, loop: ProbeLoop, seed: int, steps: int) -> Callable[[int], float | None]:
    """``fastest_batch``'s measurement: samples/s over ``steps`` steps at a batch, after one warm-up step (the first
    step at a new shape pays for allocation); None when CUDA runs out of memory."""

    def measure(batch: int) -> float | None:
        batches = built.batches(batch, seed)
        try:
            loop.step(next(batches))
            _sync(loop.device)
            started = time.perf_counter()
            for _ in range(steps):
                loop.step(next(batches))
            _sync(loop.device)
        except torch.cuda.OutOfMemoryError:
            _forget_failed_step(loop)
            return None
        return batch * steps / (time.perf_counter() - started)

    return measure


def flat_gradient(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batch: tuple[torch.Tensor, ...],
                  device: torch.device, forward_targets: str | None = None) -> torch.Tensor:
    """The gradient of ``batch``'s mean loss at the model's current parameters, flattened (no optimizer step).
    ``forward_targets``: the model computes its own loss, taking the targets by that keyword."""
    model.zero_grad(set_to_none=True)
    x, y = batch[0].to(device), batch[1].to(device)
    out = model(x, **{forward_targets: y}) if forward_targets else model(x)
    loss_fn(out, y).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def noise_estimates(built: Any, micro_batch: int, n: int, repeats: int, seed: int,
                    device: torch.device) -> list[tuple[float, float]]:
    """``repeats`` (tr(Sigma), |G|^2) estimates, each from ``n`` fresh micro-batches at the current parameters."""
    batches = built.batches(micro_batch, seed)

    def grads(_i: int) -> torch.Tensor:
        return flat_gradient(built.model, built.loss_fn, next(batches), device,
                             getattr(built, "forward_targets", None))

    estimates = [noise_scale(grads, n, micro_batch) for _ in range(repeats)]
    built.model.zero_grad(set_to_none=True)
    return estimates


def batch_for_noise_scale(scale: float, default: int) -> int:
    """The power of two nearest to B_simple; the workload's ``default`` batch when the estimate failed (infinite:
    the averaged |G|^2 was not positive, the noise swamped the mean gradient; or not positive): a failed estimate
    is no reason to train at one extreme."""
    if not math.isfinite(scale) or scale <= 0:
        return default
    return nearest_power_of_two(scale)


def _finite(x: float) -> float | None:
    """Records are strict JSON: no inf or NaN."""
    return x if math.isfinite(x) else None


# ---- the technique ------------------------------------------------------------------------------------------------


@register
class BatchSize(Technique):
    name = "batch_size"
    summary = "choose the batch by memory, throughput or gradient noise scale, and rescale the LR"
    kind = Kind.ALGORITHMIC  # a different batch and LR change the learning dynamics
    own_flops = False
    hides_tensors = False
    tune_options = ("",)
    slot = "batch"

    @dataclass(frozen=True)
    class Options:
        mode: Literal["memory", "throughput", "noise"] = "noise"
        memory: str = "2GiB"  # mode=memory: the memory a step may use
        margin: float = 0.1  # mode=memory: the search uses memory * (1 - margin)
        max_batch: int = 4096
        min_batch: int = 1
        rule: Literal["auto", "sqrt", "linear", "none"] = "auto"  # LR scaling; auto = sqrt (AdamW)
        probe_steps: int = 3  # timed steps per batch (mode=throughput)
        noise_batches: int = 8  # micro-batch gradients per noise estimate
        noise_repeats: int = 16  # noise estimates averaged into B_simple (4 gave 2.7-65 across GPT seeds)
        warmup_steps: int = 20  # ordinary steps before the noise is measured: at initialisation it is atypical

        def __post_init__(self) -> None:
            if self.mode not in ("memory", "throughput", "noise"):
                raise ValueError(f"mode must be memory, throughput or noise, got {self.mode!r}")
            if self.rule not in ("auto", "sqrt", "linear", "none"):
                raise ValueError(f"rule must be auto, sqrt, linear or none, got {self.rule!r}")
            parse_bytes(self.memory)
            if not 0 <= self.margin < 1:
                raise ValueError(f"margin must be in [0, 1), got {self.margin}")
            if not 1 <= self.min_batch <= self.max_batch:
                raise ValueError(f"need 1 <= min_batch <= max_batch, got {self.min_batch} and {self.max_batch}")
            if self.probe_steps < 1 or self.noise_repeats < 1 or self.warmup_steps < 0:
                raise ValueError("probe_steps and noise_repeats must be >= 1 and warmup_steps >= 0")
            if self.noise_batches < 2:
                raise ValueError(f"noise_batches must be >= 2 (an estimate compares them), got {self.noise_batches}")

        @property
        def budget_bytes(self) -> int:
            return int(parse_bytes(self.memory) * (1 - self.margin))

    def check(self, ctx: Context) -> str | None:
        if ctx.world_size > 1:
            return "batch_size probes on one process; with several ranks the probes would have to agree"
        return None

    def tune(self, cfg: TrainConfig, probe: Probe, ctx: Context) -> TrainConfig:
        on_cuda = probe.device.type == "cuda"
        baseline_bytes = torch.cuda.memory_allocated(probe.device) if on_cuda else 0
        built = probe.fresh()
        search = {"memory": self._by_memory, "throughput": self._by_throughput, "noise": self._by_noise}
        batch, found = search[self.options.mode](built, cfg, probe, baseline_bytes)
        rule = resolve_rule(self.options.rule)
        lr = scaled_lr(cfg.lr, cfg.batch_size, batch, rule)
        ctx.state[STATE_KEY] = {
            "mode": self.options.mode, "batch_size": batch, "default_batch_size": cfg.batch_size,
            "micro_batches": cfg.micro_batches, "lr_before": cfg.lr, "lr_after": lr, "rule": rule, **found,
        }
        log.info("batch_size (mode=%s): batch %d -> %d, lr %.3g -> %.3g (%s rule)", self.options.mode,
                 cfg.batch_size, batch, cfg.lr, lr, rule)
        return dataclasses.replace(cfg, batch_size=batch, lr=lr)

    def results(self, ctx: Context) -> dict[str, Any] | None:
        found = ctx.state.get(STATE_KEY)
        return dict(found) if found is not None else None

    def _cap(self, built: Any) -> int:
        size = train_size(built)
        return min(self.options.max_batch, size) if size is not None else self.options.max_batch

    def _by_memory(self, built: Any, cfg: TrainConfig, probe: Probe, baseline_bytes: int) -> tuple[int, dict]:
        """Searches the micro-batch: with gradient accumulation a step's activations are one micro-batch's."""
        o, k = self.options, cfg.micro_batches
        loop = probe.loop(built, cfg.lr)
        measure = memory_measure(built, loop, probe.seed, baseline_bytes)
        low, cap = max(1, math.ceil(o.min_batch / k)), self._cap(built) // k
        start = min(max(cfg.batch_size // k, low), cap)
        micro, trace = largest_fitting(measure, o.budget_bytes, start, cap)
        if micro is None and start > low:  # the workload's batch is too big: search below it
            micro, below = largest_fitting(measure, o.budget_bytes, low, start - 1)
            trace += below
        if micro is None:
            raise ValueError(f"batch_size: even a batch of {low} samples per micro-batch exceeds the memory budget "
                             f"of {o.budget_bytes} bytes (memory={o.memory}, margin={o.margin})")
        return micro * k, {"budget_bytes": o.budget_bytes, "trace": trace}

    def _by_throughput(self, built: Any, cfg: TrainConfig, probe: Probe, baseline_bytes: int) -> tuple[int, dict]:
        o, k = self.options, cfg.micro_batches
        cap = self._cap(built)
        ladder = sorted({clamp_batch(b, o.min_batch, cap, None, k) for b in power_ladder(o.min_batch, cap)})
        loop = probe.loop(built, cfg.lr, micro_batches=k)
        batch, trace = fastest_batch(rate_measure(built, loop, probe.seed, o.probe_steps), ladder)
        return batch, {"probe_steps": o.probe_steps, "trace": trace}

    def _by_noise(self, built: Any, cfg: TrainConfig, probe: Probe, baseline_bytes: int) -> tuple[int, dict]:
        o = self.options
        loop = probe.loop(built, cfg.lr)
        warm = built.batches(cfg.batch_size, probe.seed)
        losses = [float(loop.step(next(warm))) for _ in range(o.warmup_steps)]
        micro = max(1, cfg.batch_size // 4)
        # other batches than the warm-up's: the noise is that of data the parameters were not just fitted to
        estimates = noise_estimates(built, micro, o.noise_batches, o.noise_repeats, probe.seed + 1, probe.device)
        scale = b_simple(estimates)
        batch = clamp_batch(batch_for_noise_scale(scale, cfg.batch_size), o.min_batch, o.max_batch, train_size(built),
                            cfg.micro_batches)
        trace = [{"trace_sigma": _finite(t), "g2": _finite(g)} for t, g in estimates]
        return batch, {
            "b_simple": _finite(scale),
            "estimate_failed": not (math.isfinite(scale) and scale > 0),  # then the workload's batch is kept
            "micro_batch": micro,
            "noise_batches": o.noise_batches,
            "warmup": {"steps": o.warmup_steps, "batch": cfg.batch_size,
                       "first_loss": _finite(losses[0]) if losses else None,
                       "last_loss": _finite(losses[-1]) if losses else None},
            "trace": trace,
        }

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def summarize(cls, found: list[dict[str, Any]]) -> str:
        """The batch the search trained at and the rescaled LR (in noise mode, the critical batch size B_simple it
        estimated)."""
        mode = found[0].get("mode")
        text = f"mode {mode}: trained at batch {rd.values([f.get('batch_size') for f in found])} " \
               f"(default {found[0].get('default_batch_size')}), LR {rd.values([f.get('lr_after') for f in found])} " \
               f"({found[0].get('rule')} rule)"
        if mode == "noise":
            text += f"; critical batch size B_simple {rd.values([f.get('b_simple') for f in found])}"
            failed = sum(bool(f.get("estimate_failed")) for f in found)
            if failed:
                text += (f" ({failed} estimate(s) failed: the noise swamped the mean gradient; those kept the default "
                         "batch)")
        return text
