"""Phases of a training step and the bottleneck their shares point to (torch-free: the analysis and the report
use it too). The phases are timed by ``bench.measure.phases``; the rules are documented in docs/profiling.md."""

from __future__ import annotations

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other")  # in step order; "other" is the remainder
LOOP_PHASES = ("h2d", "forward", "backward", "optimizer")  # the regions the loop labels itself

def bf16_faster(peaks: dict[str, float] | None) -> bool | None:
    """Whether this machine's calibrated bf16 matmul peak beats fp32's (None when either is unknown)."""
    bf16, fp32 = (peaks or {}).get("bfloat16"), (peaks or {}).get("float32")
    return None if not bf16 or not fp32 else bf16 > fp32


INPUT_BOUND = 0.2  # a fifth of the step waiting for data is worth a loader
COPY_BOUND = 0.15
OPTIMIZER_BOUND = 0.25
OVERHEAD_BOUND = 0.25


def diagnose(share: dict[str, float], techniques: tuple[str, ...] = (), device: str = "cpu",
             bf16_faster: bool | None = None, loader_measured: str | None = None) -> str:
    """One line naming the bottleneck of a step from its phase shares, and the technique to try next.

    The thresholds are rules of thumb (documented in docs/profiling.md), checked in order of how cheap the fix is:
    data, host-to-device copies, the optimizer, overhead outside the labelled regions; otherwise the model's math.
    What is known here narrows the advice: ``bf16_faster`` (this machine's calibrated bf16 peak against fp32's;
    None: unknown) and ``loader_measured`` (loader sets this sweep measured no faster, e.g. "loader:workers=2
    0.74x"), so a line never suggests what the measurements beside it refute.
    """
    pct = {k: round(100 * v) for k, v in share.items()}
    if share.get("data", 0.0) >= INPUT_BOUND:
        if loader_measured:
            fix = (f"worker processes did not pay here ({loader_measured}): cache the transformed batches or make "
                   "the transform cheaper")
        elif "loader" in techniques:
            fix = "raise loader:workers, or make the per-sample transform cheaper"
        else:
            fix = "try loader:workers=2 (a DataLoader with worker processes)"
        return f"input-bound: {pct['data']}% of the step waits for data; {fix}"
    if share.get("h2d", 0.0) >= COPY_BOUND:
        fix = "try loader:pin_memory=true" if device == "cuda" else "keep the data on the device"
        return f"copy-bound: {pct['h2d']}% of the step copies inputs to the device; {fix}"
    if share.get("optimizer", 0.0) >= OPTIMIZER_BOUND:
        fix = "try fused_adamw" if "fused_adamw" not in techniques else "a ZeRO set spreads it over ranks"
        if "local_sgd" in techniques:  # PostLocalSGDOptimizer all-reduces the parameters inside its step
            fix = "local_sgd averages the parameters inside the optimizer step: a longer period averages less often"
        return f"optimizer-bound: {pct['optimizer']}% of the step is the optimizer; {fix}"
    if share.get("other", 0.0) >= OVERHEAD_BOUND:
        fix = "try compile (fewer Python and kernel-launch costs)" if "compile" not in techniques \
            else "look at the trace's top operators"
        return f"overhead-bound: {pct['other']}% of the step is outside the labelled phases; {fix}"
    compute = pct.get("forward", 0) + pct.get("backward", 0)
    if "pp" in techniques:  # the pipeline schedule is one region: its forwards, backwards, sends and idle time
        return (f"pipeline: {compute}% of the step is the pipeline schedule (stage compute, point-to-point sends and "
                "the bubble: see pp's measured bubble); more micro-batches shrink the bubble (pp:microbatches)")
    if bf16_faster is True:
        fix = "try bf16 (its calibrated peak beats fp32's here) or compile"
    elif bf16_faster is False:
        fix = "try compile (fuses small ops); not bf16: its calibrated peak is below fp32's on this machine"
    else:
        fix = "try compile, or lower precision where its calibrated peak beats fp32's"
    return f"compute-bound: {compute}% of the step is forward and backward; {fix}"
