"""FLOPs per step (MFU itself is computed on the timed window's clock, in ``bench.trial.speed_window``)."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

log = logging.getLogger(__name__)

_COUNTING = contextvars.ContextVar("trainbench_counting_flops", default=False)


def counting() -> bool:
    """True while ``count_flops`` runs: activation checkpointing then runs its blocks plainly, since model FLOPs
    exclude recomputation (PaLM's MFU)."""
    return _COUNTING.get()


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of one call of ``fn``, counted by ``torch.utils.flop_counter.FlopCounterMode``.

    The counter knows matmuls, convolutions and attention (2 FLOPs per multiply-add) and ignores elementwise ops,
    normalisations and the optimizer step, so the figure is "model FLOPs" in the PaLM sense: a backward through a
    matmul counts its two matmuls (input and weight gradients), and only those that autograd actually computes, so
    a first layer whose input does not require grad costs 4, not 6, FLOPs per multiply-add of forward+backward.
    Compiled graphs are not seen through (run it on the eager model). A grouped convolution's weight gradient is
    counted with its groups (torch's formula omits them: a depthwise conv's weight gradient came out ``groups`` times
    too large, see ``grouped_conv_backward_flop``).
    """
    token = _COUNTING.set(True)
    try:
        with FlopCounterMode(display=False, custom_mapping=_FIXED) as counter:
            fn()
    finally:
        _COUNTING.reset(token)
    return int(counter.get_total_flops())


def grouped_conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                               output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:  # noqa: ANN001
    """torch's ``convolution_backward`` FLOP formula with the weight gradient divided by ``groups``: each group's
    weight gradient is a convolution over its own ``c_in / groups`` input channels, which torch's formula (torch 2.13)
    counts over all of them (its input-gradient term already uses the grouped weight shape and stays)."""
    args = (grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed, output_padding, groups)
    grad_input = conv_backward_flop(*args, [output_mask[0], False], out_val=out_shape)
    grad_weight = conv_backward_flop(*args, [False, output_mask[1]], out_val=out_shape)
    return grad_input + grad_weight // max(int(groups), 1)


_FIXED = {torch.ops.aten.convolution_backward: grouped_conv_backward_flop}
