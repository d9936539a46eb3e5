"""Phases of a training step and the bottleneck their shares point to. The phases are timed by
``bench.measure.phases``; on a GPU, where the phases are host-side times, the device's busy time
(``bench.measure.trace``) says whether the device worked or waited. The rules are documented in docs/profiling.md.

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
# A GPU busy less than this share of the step leaves a fifth of it idle (the same "a fifth is worth a fix" as the
# data wait): the step is host- or launch-bound, whatever its phase shares. A rule of thumb, not a measurement.
BUSY_BOUND = 0.8
# Device ops shorter than this on average finish before eager PyTorch issues the next one: launch-bound. An
# estimate from the committed H200 trace (tests/fixtures/h200-profile): the unprofiled forward region took 11.9 ms
# (synchronised at its edges) for the 287 kernels it launched, about 42 us each, while they ran about 17 us each.
SHORT_OP_S = 50e-6

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
             refuted: Mapping[Bottleneck, str] | None = None,
             busy: float | None = None, op_s: float | None = None) -> str:
    """One line naming the bottleneck of a step from its phase shares, and the technique to try next.

    The thresholds are rules of thumb (documented in docs/profiling.md), checked in order of how cheap the fix is:
    data, host-to-device copies, a GPU left idle, the optimizer, overhead outside the labelled regions; otherwise
    the model's math. On a GPU the phase shares are host-side times: whether the device was busy is ``busy`` (its
    busy time over the step's wall time) with ``op_s`` (the mean duration of its kernels, copies and memsets); a
    GPU step without them is never called compute-bound. The advice is the techniques' (``remedies``: what to try,
    or what to say when the set ``names`` already holds it; ``explains``: a set member that shapes the phase itself
    has the line). What is known here narrows it: ``peaks`` (this machine's calibrated matmul peaks by dtype: a
    lower precision is suggested only where it beats fp32) and ``refuted`` (per bottleneck, the sets of this sweep
    holding a remedy for it that measured no faster, e.g. "loader:workers=2 0.74x"), so a line never suggests what
    the measurements beside it refute.
    """
    from techniques.base import Bottleneck

    known = _registry()
    held = [known[n] for n in names if n in known]
    pct = {k: round(100 * v) for k, v in share.items()}
    on_gpu = device.split(":")[0] != "cpu"

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
    if on_gpu and busy is not None and busy < BUSY_BOUND:
        return idle_line(busy, op_s, held, device)
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
    fix = _compute_advice(held, device, peaks)
    if explained(Bottleneck.COMPUTE, compute):
        return explained(Bottleneck.COMPUTE, compute)  # type: ignore[return-value]
    if on_gpu and busy is None:
        return (f"forward and backward take {compute}% of the step (host-side phase shares; device busy unknown: "
                f"python -m bench profile measures it); {fix}")
    if on_gpu:
        return f"compute-bound: the GPU is busy {_pct(busy)} of the step, forward and backward {compute}%; {fix}"
    return f"compute-bound: {compute}% of the step is forward and backward; {fix}"


def _pct(fraction: float | None) -> str:
    return f"{100 * (fraction or 0.0):.0f}%"


def _compute_advice(held: Sequence[type[Technique]], device: str, peaks: Mapping[str, float | None] | None) -> str:
    """What to try for a step bound by its math: never "try bf16" on the bf16 set's own line (the remedies it
    already holds are not offered again), a lower precision only where its calibrated peak beats fp32's."""
    from techniques.base import Bottleneck

    offered = [(t, r) for t, r in remedies(Bottleneck.COMPUTE, device) if t not in held]
    lower_held = any(r.if_dtype_faster for t in held for r in t.remedies if r.bottleneck == Bottleneck.COMPUTE)
    return _again(Bottleneck.COMPUTE, held) or (
        _try([(t, r) for t, r in offered if not r.if_dtype_faster]) if lower_held else
        _compute_fix(offered, peaks) if offered else None) or "look at the trace's top operators"


BIGGER_BATCH = "a larger batch (more work per kernel and per host step)"


def idle_line(busy: float, op_s: float | None, held: Sequence[type[Technique]], device: str = "cuda") -> str:
    """The line for a GPU busy less than ``BUSY_BOUND`` of the step: launch-bound where its ops are short on
    average (the host cannot issue them as fast as the device runs them), host-bound where they are not (the device
    waits while the host runs Python, fetches data or synchronises); host- or launch-bound where ``op_s`` is
    unknown. Then what helps: a larger batch first (no technique needed), the techniques' remedies, and what to do
    with one the set holds already."""
    from techniques.base import Bottleneck

    if op_s is None:
        kinds, name = (Bottleneck.LAUNCH, Bottleneck.HOST), "host- or launch-bound"
        why = "it waits on the host"
    elif op_s < SHORT_OP_S:
        kinds, name = (Bottleneck.LAUNCH,), "launch-bound"
        why = (f"its kernels average {op_s * 1e6:.0f} us, shorter than the host takes to launch one "
               f"(< {SHORT_OP_S * 1e6:.0f} us)")
    else:
        kinds, name = (Bottleneck.HOST,), "host-bound"
        why = (f"its kernels average {op_s * 1e6:.0f} us, not short: it waits on the host (Python, data, "
               "synchronisations)")
    offered, again = [], []
    for kind in kinds:
        for t, r in remedies(kind, device):
            if t in held:
                again.extend([r.again] if r.again and r.again not in again else [])
            elif (t, r.say) not in [(o[0], o[1].say) for o in offered]:
                offered.append((t, r))
    fixes = [BIGGER_BATCH, *(say(t, r) for t, r in offered)]
    advice = "try " + ", ".join(fixes[:-1]) + f" or {fixes[-1]}" if len(fixes) > 1 else f"try {fixes[0]}"
    return f"{name}: the GPU is busy {_pct(busy)} of the step, {why}; {advice}" + "".join(f"; {a}" for a in again)
