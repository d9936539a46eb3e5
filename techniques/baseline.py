"""Baseline: plain fp32 training with AdamW, no technique applied. Every speedup is measured against it.

Method card: it does nothing, on purpose. Its records are the reference for speedups, memory ratios, accuracy
deltas and loss parity.
"""

from __future__ import annotations

from techniques.base import Kind, Technique, register


@register
class Baseline(Technique):
    name = "baseline"
    summary = "fp32, eager, AdamW: the reference every other set is compared with"
    kind = Kind.EXACT
    own_flops = False
    hides_tensors = False
    tune_options = ()  # the reference every candidate of bench tune is measured against
