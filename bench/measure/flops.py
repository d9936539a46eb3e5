"""FLOPs per step and model FLOPs utilization (MFU)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of one call of ``fn``, counted by ``torch.utils.flop_counter.FlopCounterMode``.

    The counter knows matmuls, convolutions and attention (2 FLOPs per multiply-add) and ignores elementwise ops,
    normalisations and the optimizer step, so the figure is "model FLOPs" in the PaLM sense: a backward through a
    matmul counts its two matmuls (input and weight gradients), and only those that autograd actually computes, so
    a first layer whose input does not require grad costs 4, not 6, FLOPs per multiply-add of forward+backward.
    Compiled graphs are not seen through (run it on the eager model).
    """
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def mfu(flops_per_step: float | None, step_time_s: float | None, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization: achieved model FLOP/s divided by the device's peak FLOP/s.

    Definition from the PaLM paper (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
    Appendix B): MFU = observed throughput (tokens/s) x model FLOPs per token / peak FLOP/s, which is the same as
    model FLOPs per step / step time / peak FLOP/s. Rematerialisation (activation checkpointing) is deliberately
    not counted as useful work, so checkpointing lowers MFU. Returns None when any input is missing or zero.
    """
    if not flops_per_step or not step_time_s or not peak_flops:
        return None
    return float(flops_per_step) / float(step_time_s) / float(peak_flops)
