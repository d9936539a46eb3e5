"""Phases of a training step and the bottleneck their shares point to. The phases are timed by
``bench.measure.phases``; the rules are documented in docs/profiling.md.

What to try against a bottleneck is the techniques' own word (``Technique.remedies`` and ``Technique.explains``,
techniques/base.py): this module reads them off the registry and names no technique. Importing it stays torch-free
(the phase names are used by the analysis and the report); the registry is imported on the first diagnosis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from techniques.base import Bottleneck, Remedy, Technique



def dtype_faster(peaks: Mapping[str, float | None] | None, dtype: str | None) -> bool | None:
    """Whether this machine's calibrated matmul peak of ``dtype`` beats fp32's (None when either is unknown)."""
    low, fp32 = (peaks or {}).get(dtype or ""), (peaks or {}).get("float32")
    return None if not low or not fp32 else low > fp32


INPUT_BOUND = 0.2  # a fifth of the step waiting for data is worth a loader
COPY_BOUND = 0.15
OPTIMIZER_BOUND = 0.25
OVERHEAD_BOUND = 0.25

# What helps against a bottleneck whatever the techniques: the advice once the techniques' remedies are spent.
INPUT_ALTERNATIVES = "cache the transformed batches or make the transform cheaper"
COPY_FALLBACK = "keep the data on the device"


def _registry() -> dict[str, type[Technique]]:
    import techniques  # the remedies are the techniques' own; imported on first use (it imports torch)

    return techniques.registry()


def remedies(bottleneck: Bottleneck, device: str | None = None) -> list[tuple[type[Technique], Remedy]]:
    """Every registered technique's remedy for ``bottleneck`` (on ``device``: one meant for another device type is
    left out; None keeps all), in registry order."""
    out = []
    for tech in _registry().values():
        for r in tech.remedies:
            if r.bottleneck == bottleneck and (device is None or r.device in (None, device)):
                out.append((tech, r))
    return out


def refutable(bottleneck: Bottleneck) -> set[str]:
    """The techniques whose remedy for ``bottleneck`` this sweep's own measurement may refute (a set holding one
    measured no faster than the reference): their advice then says so instead of suggesting them."""
    return {tech.name for tech, r in remedies(bottleneck) if r.refuted}


def say(tech: type[Technique], remedy: Remedy, why: bool = True) -> str:
    """How the advice names a remedy: "loader:workers=2 (a DataLoader with worker processes)"."""
    text = remedy.say or tech.name
    return f"{text} ({remedy.why})" if why and remedy.why else text


def _again(bottleneck: Bottleneck, held: Sequence[type[Technique]]) -> str | None:
    return next((r.again for t in held for r in t.remedies if r.bottleneck == bottleneck and r.again), None)


def _try(offered: Sequence[tuple[type[Technique], Remedy]]) -> str | None:
    return "try " + " or ".join(say(t, r) for t, r in offered) if offered else None


def _compute_fix(offered: Sequence[tuple[type[Technique], Remedy]], peaks: Mapping[str, float | None] | None) -> str:
    """The compute-bound advice: a lower precision only where its calibrated peak beats fp32's here, else the
    remedies that do not depend on the dtype."""
    plain = [(t, r) for t, r in offered if not r.if_dtype_faster]
    precise = [(t, r) for t, r in offered if r.if_dtype_faster]
    faster = [(t, r) for t, r in precise if dtype_faster(peaks, t.compute_dtype) is True]
    slower = [(t, r) for t, r in precise if dtype_faster(peaks, t.compute_dtype) is False]
    plain_names = " or ".join(say(t, r, why=False) for t, r in plain)
    if faster:
        return ("try " + " or ".join(f"{say(t, r, why=False)} (its calibrated peak beats fp32's here)" for t, r in faster)
                + (f" or {plain_names}" if plain else ""))
    if slower and len(slower) == len(precise):
        return (f"{_try(plain) or 'look at the trace'}; not {' or '.join(say(t, r, why=False) for t, r in slower)}: "
                "its calibrated peak is below fp32's on this machine")
    return f"try {plain_names}, or lower precision where its calibrated peak beats fp32's" if plain else \
        "try lower precision where its calibrated peak beats fp32's"


def diagnose(share: dict[str, float], names: Sequence[str] = (), device: str = "cpu",
             peaks: Mapping[str, float | None] | None = None,
             refuted: Mapping[Bottleneck, str] | None = None) -> str:
    """One line naming the bottleneck of a step from its phase shares, and the technique to try next.

    The thresholds are rules of thumb (documented in docs/profiling.md), checked in order of how cheap the fix is:
    data, host-to-device copies, the optimizer, overhead outside the labelled regions; otherwise the model's math.
    The advice is the techniques' (``remedies``: what to try, or what to say when the set ``names`` already holds
    it; ``explains``: a set member that shapes the phase itself has the line). What is known here narrows it:
    ``peaks`` (this machine's calibrated matmul peaks by dtype: a lower precision is suggested only where it beats
    fp32) and ``refuted`` (per bottleneck, the sets of this sweep holding a remedy for it that measured no faster,
    e.g. "loader:workers=2 0.74x"), so a line never suggests what the measurements beside it refute.
    """
    from techniques.base import Bottleneck

    known = _registry()
    held = [known[n] for n in names if n in known]
    pct = {k: round(100 * v) for k, v in share.items()}

    def explained(bottleneck: Bottleneck, value: int) -> str | None:
        line = next((t.explains[bottleneck] for t in held if bottleneck in t.explains), None)
        return line.format(share=value) if line else None

    if share.get("data", 0.0) >= INPUT_BOUND:
        offered = remedies(Bottleneck.INPUT, device)
        clause = next((r.refuted for _, r in offered if r.refuted), None)
        if clause and (refuted or {}).get(Bottleneck.INPUT):
            fix = f"{clause} ({refuted[Bottleneck.INPUT]}): {INPUT_ALTERNATIVES}"  # type: ignore[index]
        else:
            fix = _again(Bottleneck.INPUT, held) or _try(offered) or INPUT_ALTERNATIVES
        return explained(Bottleneck.INPUT, pct["data"]) or \
            f"input-bound: {pct['data']}% of the step waits for data; {fix}"
    if share.get("h2d", 0.0) >= COPY_BOUND:
        fix = _again(Bottleneck.COPY, held) or _try(remedies(Bottleneck.COPY, device)) or COPY_FALLBACK
        return explained(Bottleneck.COPY, pct["h2d"]) or \
            f"copy-bound: {pct['h2d']}% of the step copies inputs to the device; {fix}"
    if share.get("optimizer", 0.0) >= OPTIMIZER_BOUND:
        fix = _again(Bottleneck.OPTIMIZER, held) or _try(remedies(Bottleneck.OPTIMIZER, device)) or \
            "look at the trace's top operators"
        return explained(Bottleneck.OPTIMIZER, pct["optimizer"]) or \
            f"optimizer-bound: {pct['optimizer']}% of the step is the optimizer; {fix}"
    if share.get("other", 0.0) >= OVERHEAD_BOUND:
        fix = _again(Bottleneck.OVERHEAD, held) or _try(remedies(Bottleneck.OVERHEAD, device)) or \
            "look at the trace's top operators"
        return explained(Bottleneck.OVERHEAD, pct["other"]) or \
            f"overhead-bound: {pct['other']}% of the step is outside the labelled phases; {fix}"
    compute = pct.get("forward", 0) + pct.get("backward", 0)
    # never "try bf16" on the bf16 set's own line: the remedies it already holds are not offered again
    offered = [(t, r) for t, r in remedies(Bottleneck.COMPUTE, device) if t not in held]
    lower_held = any(r.if_dtype_faster for t in held for r in t.remedies if r.bottleneck == Bottleneck.COMPUTE)
    fix = _again(Bottleneck.COMPUTE, held) or (
        _try([(t, r) for t, r in offered if not r.if_dtype_faster]) if lower_held else
        _compute_fix(offered, peaks) if offered else None) or "look at the trace's top operators"
    return explained(Bottleneck.COMPUTE, compute) or \
        f"compute-bound: {compute}% of the step is forward and backward; {fix}"
