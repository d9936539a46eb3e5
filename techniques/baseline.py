"""Baseline: plain fp32 training with AdamW, eager, no technique applied.

Method card
- What: nothing, on purpose. Its trials are the reference for every speedup, memory ratio, quality difference and
  parity check of the other sets of a workload (``--baseline`` names another reference).

Measured (committed examples, against each sweep's reference; python -m bench.dev.docs_tables writes this block):
<!-- generated: card-baseline (python -m bench.dev.docs_tables, from the committed examples; do not edit by hand) -->
- Not measured alone in a committed report.
<!-- end generated -->
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
