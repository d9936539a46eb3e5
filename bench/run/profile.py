"""``python -m bench profile``: find the bottleneck of one workload x technique set (docs/profiling.md).

One process, three short passes over the trial's own loop (``bench.trial.build``: the techniques applied exactly as
in a sweep):

1. warm-up steps, untimed (the first pays one-off costs such as compilation);
2. a phase pass (``bench.trial.phase_pass``): each labelled region of the step timed, no profiler attached, so the
   shares are not inflated by the profiler's own cost; on a GPU also the device-busy pass (only CUDA activity
   traced, nothing synchronised inside it), which the diagnosis reads;
3. a profiled pass under ``torch.profiler`` with a wait/warm-up/active schedule and the regions labelled with
   ``record_function`` (unsynchronised, so the host runs ahead of the device as in the timed window): a
   Chrome/Perfetto trace (``trace.json``, open it in https://ui.perfetto.dev or chrome://tracing), the host
   operators with the most self CPU time and, on a GPU, the kernels with the most device time (one kind of event
   per table, so no time is counted twice) and the device time each phase launched (``bench.measure.trace``).

Writes ``profile.json`` (everything), ``profile.md`` (what the terminal shows) and ``trace.json`` into ``--out``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from bench.analyze.bottleneck import diagnose
from bench.core.files import RUNS_DIR, write_atomic
from bench.measure import trace as trace_mod
from bench.measure.phases import LOOP_PHASES, PHASES, PhaseClock
from bench.measure.trace import DeviceBusy, KernelTime
from bench.plan.config import ConfigError, SweepConfig
from bench.records.results import PhaseResult

TOP_OPS = 15


@dataclass(frozen=True)
class OpTime:
    """One host operator's share of the profiled steps (self CPU time: its own, not its children's)."""

    name: str
    calls: int
    self_s: float  # over the active steps
    per_step_s: float
    share: float  # of all host operators' self CPU time


@dataclass(frozen=True)
class Profile:
    """What ``bench profile`` found."""

    workload: str
    techniques: str
    device: str
    threads: int
    batch_size: int
    warmup_s: list[float]  # wall time of each warm-up step (the first carries one-off costs)
    phases: PhaseResult
    profiled_steps: int
    top_ops: list[OpTime]  # host operators by self CPU time
    top_kernels: list[KernelTime]  # GPU only: kernels, copies and memsets by device time (full names here)
    trace_busy: DeviceBusy | None  # GPU only: the device's busy time in the trace, and what each phase launched
    trace: str
    created_utc: str


def profile(cfg: SweepConfig, device: torch.device, out_dir: Path, steps: int = 5, phase_steps: int = 20,
            warmup: int = 3, on_built: Callable[[], None] | None = None) -> Profile:
    """Build the single workload x set of ``cfg`` and run the three passes; write the files into ``out_dir``.
    ``on_built`` is called once the set is built (a technique refusing the model raised ConfigError before)."""
    from bench import trial as trial_mod
    from bench.plan import planner as plan_mod

    workload, techs = validate(cfg, device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    spec = trial_mod.TrialSpec(
        sweep_id="profile", trial_id=plan_mod.trial_id(workload, techs, cfg.seed, 0), workload=workload.name,
        size=workload.size, techniques=[s.label for s in techs.specs], seed=cfg.seed, repeat=0,
        device=str(device), budget=dataclasses.asdict(cfg.budget), threads=cfg.threads, mode="speed",
        plugins=[p.to_dict() for p in cfg.plugins])
    try:
        session = trial_mod.build(spec, cfg.budget, device)
    except ValueError as exc:  # a technique refusing this model when it sees it (no Dataset, no Conv2d)
        raise ConfigError(f"{techs.label} cannot run on {workload.label}: {exc}") from None
    if on_built is not None:
        on_built()
    try:
        session.ctx.step = max(session.ctx.step, session.ctx.total_steps)  # steady state, as the speed window
        warm = _warm_up(session, warmup)
        phases = trial_mod.phase_pass(session, phase_steps)
        out_dir.mkdir(parents=True, exist_ok=True)
        trace = out_dir / "trace.json"
        ops = _profiled_pass(session, steps, trace)
    finally:  # a loader's workers end here, whatever happened
        for tech in session.techs:
            tech.finalize(session.model, session.ctx)
    busy, kernels = read_trace(trace_mod.load(trace)) if device.type == "cuda" else (None, [])
    names = tuple(t.name for t in session.techs)
    return Profile(
        workload=workload.label, techniques=techs.label, device=str(device), threads=torch.get_num_threads(),
        batch_size=session.cfg.batch_size, warmup_s=warm, phases=with_trace_busy(phases, busy, names, str(device)),
        profiled_steps=steps, top_ops=ops, top_kernels=kernels, trace_busy=busy, trace=str(trace),
        created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def read_trace(events: list[dict[str, Any]]) -> tuple[DeviceBusy | None, list[KernelTime]]:
    """What the trace says about the device: its busy time over the profiled steps with the device time each
    phase launched, and the kernels with the most device time."""
    return trace_mod.from_trace(events, PHASES), trace_mod.kernel_table(events, TOP_OPS)


def with_trace_busy(phases: PhaseResult, busy: DeviceBusy | None, names: tuple[str, ...], device: str
                    ) -> PhaseResult:
    """The phase result, diagnosed with the trace's device-busy figures where the device-busy pass measured none
    (its source says so: the trace's host is slowed by the profiler, so its busy fraction is a lower bound)."""
    if phases.device_busy is not None or busy is None:
        return phases
    return dataclasses.replace(
        phases, device_busy=busy.fraction, device_busy_s=busy.busy_s, device_ops_per_step=busy.ops_per_step,
        device_op_s=busy.mean_op_s, device_source=f"{busy.source}, CPU operators recorded (a lower bound)",
        diagnosis=diagnose(phases.share, names, device, busy=busy.fraction, op_s=busy.mean_op_s))


def validate(cfg: SweepConfig, device: torch.device, out_dir: Path | None = None) -> tuple[Any, Any]:
    """The one workload and technique set of ``cfg``, when they can be profiled here (and ``out_dir`` can be
    written); else ConfigError (one line)."""
    from bench.plan import planner as plan_mod
    from bench.records.reader import blocking_file

    if out_dir is not None and (blocker := blocking_file(out_dir.resolve())) is not None:
        raise ConfigError(f"cannot write into {out_dir}: {blocker} is a file, not a directory")

    workload, techs = _single(cfg)
    if any(spec.resolve().multi_process for spec in techs.specs):
        raise ConfigError(f"{techs.label} runs on several processes; `bench profile` profiles one process "
                          "(profile the set's single-process form, or its trials' traces on each rank)")
    reason = plan_mod.incompatibility(techs, workload, device, 1)
    if reason:
        raise ConfigError(f"{techs.label} cannot run on {workload.label} here: {reason}")
    return workload, techs


def _single(cfg: SweepConfig) -> tuple[Any, Any]:
    if len(cfg.workloads) != 1:
        raise ConfigError(f"profile one workload at a time, got {len(cfg.workloads)}: "
                          f"{', '.join(w.label for w in cfg.workloads)}")
    if len(cfg.techniques) != 1:
        raise ConfigError(f"profile one technique set at a time (join techniques with '+'), got "
                          f"{', '.join(t.label for t in cfg.techniques)}")
    return cfg.workloads[0], cfg.techniques[0]


def _warm_up(session: Any, steps: int) -> list[float]:
    from bench.trial import _sync

    times = []
    for _ in range(steps):
        _sync(session.device)
        t0 = time.perf_counter()
        session.loop.step(next(session.batches))
        _sync(session.device)
        times.append(time.perf_counter() - t0)
    return times


def _profiled_pass(session: Any, steps: int, trace: Path) -> list[OpTime]:
    """``steps`` steps under torch.profiler (one untraced step first: the profiler's own warm-up), the phases
    labelled; the trace written to ``trace`` and the host operators with the most self CPU time. On a GPU the
    regions are not synchronised (the trace shows the host ahead of the device, as in the timed window); the device
    is synchronised after the profiler's warm-up step and after the last step, so the profiled steps hold exactly
    their own device work."""
    cuda = session.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    found: dict[str, Any] = {}

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(str(trace))
        found["events"] = prof.key_averages()

    clock = PhaseClock(session.device, label=True, sync=False)
    session.loop.time_phases(clock)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
    try:
        with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=ready) as prof:
            for i in range(steps + 1):
                with clock.step():
                    with clock.region("data"):
                        batch = next(session.batches)
                    session.loop.step(batch)
                if cuda and i in (0, steps):
                    torch.cuda.synchronize(session.device)
                prof.step()
    finally:
        session.loop.time_phases(None)
    return _top_ops(found.get("events") or [], steps)


def _top_ops(events: Any, steps: int) -> list[OpTime]:
    """The host's operators by self CPU time, one kind of event: a kernel's device time is in the kernel table,
    never beside the operator that launched it (that would count the same time twice)."""
    labels = set(PHASES) | {"step"}
    rows = []
    for e in events:
        if e.key in labels or e.key.startswith("ProfilerStep"):
            continue
        if e.self_cpu_time_total > 0:
            rows.append((e.key, e.count, e.self_cpu_time_total / 1e6))
    total = sum(r[2] for r in rows) or 1.0
    rows.sort(key=lambda r: r[2], reverse=True)
    return [OpTime(name, calls, s, s / steps, s / total) for name, calls, s in rows[:TOP_OPS]]


# ---- output ---------------------------------------------------------------------------------------------------


def phase_rows(phases: PhaseResult) -> list[tuple[str, str, str, str, str]]:
    """(phase, mean, median, IQR, share) per phase, in step order, times in ms."""
    return [(p, f"{1e3 * phases.mean_s[p]:.2f}", f"{1e3 * phases.median_s[p]:.2f}", f"{1e3 * phases.iqr_s[p]:.2f}",
             f"{100 * phases.share[p]:.1f}%") for p in PHASES]


def busy_line(phases: PhaseResult) -> str | None:
    """"device busy: 43% of the step (...)", or None where it was not measured (CPU)."""
    if phases.device_busy is None:
        return None
    return (f"device busy: {100 * phases.device_busy:.0f}% of the step: {1e3 * (phases.device_busy_s or 0):.2f} ms "
            f"of kernels, copies and memsets per step, {phases.device_ops_per_step or 0:.0f} of them averaging "
            f"{1e6 * (phases.device_op_s or 0):.0f} us ({phases.device_source})")


def to_markdown(result: Profile) -> str:
    ph = result.phases
    gpu = result.device.startswith("cuda")
    busy = busy_line(ph)
    lines = [
        f"# Profile: {result.workload} / {result.techniques}",
        "",
        f"{result.device}, {result.threads} threads, batch {result.batch_size}; warm-up steps "
        f"{', '.join(f'{s * 1e3:.0f} ms' for s in result.warmup_s)} (the first carries one-off costs).",
        "",
        f"**Diagnosis:** {ph.diagnosis}",
        "",
        *([f"**Device busy:** {busy.removeprefix('device busy: ')}", ""] if busy else []),
        f"## Where a step's time goes ({ph.steps} steps, no profiler attached; mean step {ph.step_s * 1e3:.2f} ms)",
        "",
        *_phase_table(result),
        "",
        "data: waiting for the next batch; h2d: inputs to the device; forward: forward and loss; backward: backward "
        "(and an all-reduce overlapped with it); optimizer: zero_grad, step, after-step hooks; other: the rest of "
        "the step. " + ("Each region is synchronised at its edges on the GPU: its time is the host's and the "
                        "device's together, so the shares do not say whether the device was busy (the device-busy "
                        "line does)." if gpu else "On CPU execution is synchronous: the regions are exact."),
        "",
        *_host_table(result),
        *_kernel_table(result),
        f"Trace: `{result.trace}` (open in https://ui.perfetto.dev or chrome://tracing; the phases are labelled "
        f"{', '.join(('data', *LOOP_PHASES))}).",
        "",
    ]
    return "\n".join(lines)


def _phase_table(result: Profile) -> list[str]:
    """The phase pass's table; on a GPU with a trace, also the device time each phase launched there."""
    tb = result.trace_busy
    if tb is None or not tb.launched_s:
        return ["| phase | mean ms | median ms | IQR ms | share |", "|---|---|---|---|---|",
                *(f"| {' | '.join(row)} |" for row in phase_rows(result.phases))]
    device = [f"{1e3 * tb.launched_s[p]:.2f}" if p in tb.launched_s else "-" for p in PHASES]
    return ["| phase | mean ms | median ms | IQR ms | share | device ms launched (trace) |",
            "|---|---|---|---|---|---|",
            *(f"| {' | '.join(row)} | {d} |" for row, d in zip(phase_rows(result.phases), device, strict=True)),
            "",
            f"device ms launched: per step, the device time of the kernels, copies and memsets each phase launched, "
            f"from the trace ({tb.source}; the device there is busy {100 * tb.fraction:.0f}% of the profiled steps, "
            "whose host is slowed by the profiler's recording of CPU operators)."]


def _host_table(result: Profile) -> list[str]:
    return [f"## Host operators by self CPU time ({result.profiled_steps} profiled steps)", "",
            "| operator | calls | self CPU ms per step | share of host self time |", "|---|---|---|---|",
            *(f"| `{o.name}` | {o.calls} | {o.per_step_s * 1e3:.3f} | {100 * o.share:.1f}% |" for o in result.top_ops),
            ""]


def _kernel_table(result: Profile) -> list[str]:
    if not result.top_kernels:
        return []
    return [f"## Device kernels, copies and memsets by device time ({result.profiled_steps} profiled steps)", "",
            "| kernel | calls | device ms per step | share of device time |", "|---|---|---|---|",
            *(f"| `{k.short}` | {k.calls} | {k.per_step_s * 1e3:.3f} | {100 * k.share:.1f}% |"
              for k in result.top_kernels),
            "", "Names shortened (namespaces, template arguments and parameters left out); profile.json has them "
            "in full.", ""]


def write(result: Profile, out_dir: Path) -> tuple[Path, Path]:
    data = json.dumps(dataclasses.asdict(result), indent=2, sort_keys=True)
    write_atomic(out_dir / "profile.json", data + "\n")
    write_atomic(out_dir / "profile.md", to_markdown(result))
    return out_dir / "profile.json", out_dir / "profile.md"


def default_out_dir(workload: str, techniques: str) -> Path:
    """``runs/profile-<workload>-<set>-<UTC time>/``, beside the sweeps (git-ignored, apart from reports/)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_.+=" else "_" for c in f"{workload}-{techniques}")
    return RUNS_DIR / f"profile-{safe}-{stamp}"
