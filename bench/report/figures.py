"""The report's figures (matplotlib, Agg, no pyplot state): PNG bytes written to ``figures/`` and embedded in HTML.

One panel per machine x workload in each figure:

- ``speedup``: speedup vs the reference with 95% interval whiskers;
- ``memory``: the tensor-level peak stacked by category (params, grads, optimizer, activations, other);
- ``pareto``: final metric against training wall-clock, the Pareto front drawn through the sets nobody beats;
- ``curves``: the evaluation metric over training wall-clock, every trial;
- ``interaction``: for combined sets, the observed speedup against the product of the single ones;
- ``phases``: where a step's time goes, one stacked bar per set (data, h2d, forward, backward, optimizer, other);
- ``frontier``: a workload that records a proxy reward and KL beside its metric: gold metric against KL over the run
  (``bench.report.frontier``);
- one per technique that keeps a curve in its results (``Technique.result_curve``: the LR range tests).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

# The Agg canvas is attached to each figure explicitly: no pyplot, no global backend switch, no display needed.
from matplotlib import transforms
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure

import techniques
from bench.analyze import stats
from bench.analyze.analysis import Analysis
from bench.measure.phases import PHASES
from bench.records.frame import BREAKDOWN, MODEL_STATE
from bench.report.cells import say
from bench.report.document import Figure
from bench.report.frontier import KL, frontier_trials
from techniques.base import ResultCurve

DPI = 100
PANEL_W = 5.6  # inches per panel column
MIB = 2**20
CATEGORY_COLORS = {"params": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "activations": "#dd8452",
                   "other": "#8c8c8c"}
PHASE_COLORS = {"data": "#c44e52", "h2d": "#937860", "forward": "#4c72b0", "backward": "#55a868",
                "optimizer": "#dd8452", "other": "#b0b0b0"}
VERDICT_COLORS = {"faster": "#2e7d32", "slower": "#c62828", "equivalent": "#1565c0"}
NEUTRAL = "#9e9e9e"
PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
           "#64b5cd"]


def _t(text: Any) -> str:
    """Text from records, safe for matplotlib: a '$' would start mathtext."""
    return str(text).replace("$", r"\$")


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def technique_colors(analysis: Analysis) -> dict[str, str]:
    """One colour per technique set across every figure; the reference is grey."""
    labels = list(dict.fromkeys(analysis.configs["technique"]))
    out, i = {}, 0
    for label in labels:
        if label == analysis.baseline:
            out[label] = "#555555"
        else:
            out[label] = PALETTE[i % len(PALETTE)]
            i += 1
    return out


def _panels(analysis: Analysis) -> list[tuple[str, str, Any]]:
    several = analysis.configs["machine"].nunique() > 1
    names = {m: f"machine {i}" for i, m in enumerate(analysis.machines, 1)}
    out = []
    for (machine, workload), rows in analysis.configs.groupby(["machine", "workload"], sort=False):
        title = workload + (f" ({names[machine]})" if several else "")
        out.append((machine, title, rows))
    return out


def _grid(n: int, row_h: float, cols_max: int = 2) -> tuple[MplFigure, list[Axes]]:
    cols = min(cols_max, max(n, 1))
    rows = math.ceil(max(n, 1) / cols)
    fig = MplFigure(figsize=(PANEL_W * cols, row_h * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(max(n, 1))]
    return fig, axes


def _png(fig: MplFigure) -> tuple[bytes, int, int]:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, facecolor="white")
    w, h = fig.canvas.get_width_height()
    return buf.getvalue(), int(w), int(h)


def _finish(fig: MplFigure, name: str, title: str, caption: str) -> Figure:
    png, w, h = _png(fig)
    return Figure(name, title, caption, png, w, h)


def _style(ax: Axes, title: str) -> None:
    ax.set_title(_t(title), fontsize=11, loc="left")
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=9)


# ---- speedup ------------------------------------------------------------------------------------------------


def speedup_figure(analysis: Analysis) -> Figure | None:
    panels = [(m, t, r[~r["is_reference"].astype(bool) & r["speedup"].notna()]) for m, t, r in _panels(analysis)]
    panels = [p for p in panels if len(p[2])]
    if not panels:
        return None
    most = max(len(p[2]) for p in panels)
    fig, axes = _grid(len(panels), max(2.4, 0.5 * most + 1.3))
    for ax, (_, title, rows) in zip(axes, panels, strict=False):
        rows = rows.iloc[::-1]
        y = list(range(len(rows)))
        est = [float(v) for v in rows["speedup"]]
        lo = [float(r.speedup_lo) if _ok(r.speedup_lo) else float(r.speedup) for r in rows.itertuples()]
        hi = [float(r.speedup_hi) if _ok(r.speedup_hi) else float(r.speedup) for r in rows.itertuples()]
        colors = [VERDICT_COLORS.get(v, NEUTRAL) for v in rows["speedup_verdict"]]
        # Log scale, bars from 1: a 2x speedup and a 2x slowdown look the same size. The view is limited to a few
        # times the estimates so one huge interval cannot flatten the rest; the label gives the interval anyway.
        ax.set_xscale("log")
        ax.barh(y, [e - 1 for e in est], left=1, color=colors, height=0.6, alpha=0.85)
        ax.errorbar(est, y, xerr=[[e - a for e, a in zip(est, lo, strict=True)],
                                  [b - e for e, b in zip(est, hi, strict=True)]],
                    fmt="none", ecolor="black", elinewidth=1.2, capsize=4)
        ax.axvline(1.0, color="black", linewidth=0.8)
        left = max(min(lo + est + [1.0]) / 1.3, min(est + [1.0]) / 4)
        right = min(max(hi + est + [1.0]) * 1.3, max(est + [1.0]) * 4)
        ax.set_xlim(left, right)
        # Labels in a column right of the panel (axes x, data y), where no whisker can run through them.
        where = transforms.blended_transform_factory(ax.transAxes, ax.transData)
        for yi, e, a, b, r in zip(y, est, lo, hi, rows.itertuples(), strict=True):
            ci = f"\n[{a:.2f}, {b:.2f}]" if _ok(r.speedup_lo) else ""
            ax.text(1.02, yi, f"{e:.2f}x{ci}", va="center", fontsize=8, transform=where, clip_on=False)
        ax.set_yticks(y, [_t(label) for label in rows["technique"]])
        fine = right / left < 12
        ticks = [t for t in ((0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10) if fine else
                             (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)) if left <= t <= right]
        ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(f"speedup vs {_t(analysis.baseline)} (log scale)", fontsize=9)
        _style(ax, title)
    return _finish(fig, "speedup", "Speedup vs the reference",
                   "Bars: geometric mean over seeds of samples/s against the reference set's trial of the same "
                   "seed, from 1 (no change) on a log scale; whiskers and brackets: 95% interval (t, or a sequential "
                   f"design's repeated interval). Green: {say('faster')}, red: {say('slower')} (the whole interval "
                   f"beyond the threshold); blue: {say(stats.EQUIVALENT)} (the whole interval within it); grey: "
                   f"{say(stats.INCONCLUSIVE)}, or {say(stats.NONE)} (fewer than 3 pairs).")


# ---- memory -------------------------------------------------------------------------------------------------


def memory_figure(analysis: Analysis) -> Figure | None:
    panels = []
    for machine, title, rows in _panels(analysis):
        rows = rows[rows["n_ok"].astype(int) > 0]
        has = [any(_ok(getattr(r, f"mem_{c}_bytes")) for c in BREAKDOWN) or _ok(r.peak_rss_bytes)
               for r in rows.itertuples()]
        if any(has):
            panels.append((machine, title, rows[has]))
    if not panels:
        return None
    most = max(len(p[2]) for p in panels)
    fig, axes = _grid(len(panels), max(2.4, 0.5 * most + 1.6))
    any_sharded = False
    for ax, (_, title, rows) in zip(axes, panels, strict=False):
        rows = rows.iloc[::-1]
        y = list(range(len(rows)))
        left = [0.0] * len(rows)
        for cat in BREAKDOWN:
            vals = [float(v) / MIB if _ok(v) else 0.0 for v in rows[f"mem_{cat}_bytes"]]
            ax.barh(y, vals, left=left, color=CATEGORY_COLORS[cat], height=0.6, label=cat)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        # Multi-process sets: the largest rank's model state (no activations measured there), hatched.
        sharded = [not any(_ok(getattr(r, f"mem_{c}_bytes")) for c in BREAKDOWN) and _ok(r.state_params_bytes)
                   for r in rows.itertuples()]
        any_sharded = any_sharded or any(sharded)
        for cat in MODEL_STATE if any(sharded) else ():
            vals = [float(v) / MIB if _ok(v) and s else 0.0 for v, s in zip(rows[f"state_{cat}_bytes"], sharded,
                                                                             strict=True)]
            ax.barh(y, vals, left=left, color=CATEGORY_COLORS[cat], height=0.6, hatch="//", edgecolor="white")
            left = [a + b for a, b in zip(left, vals, strict=True)]
        top = max(left) if max(left) > 0 else 1.0
        for yi, total, r, s in zip(y, left, rows.itertuples(), sharded, strict=True):
            if total > 0 and s:
                ax.text(total + top * 0.02, yi, f"{total:.1f} MiB per rank (model state only)", va="center",
                        fontsize=9)
            elif total > 0:
                ax.text(total + top * 0.02, yi, f"{total:.1f} MiB", va="center", fontsize=9)
            elif _ok(r.peak_rss_bytes):
                ax.text(top * 0.02, yi, f"no tensor breakdown; peak RSS {r.peak_rss_bytes / MIB:.0f} MiB",
                        va="center", fontsize=9, color="#555555")
        ax.set_yticks(y, [_t(t) for t in rows["technique"]])
        ax.set_xlim(0, top * (1.9 if any(sharded) else 1.3))
        ax.set_xlabel("tensor memory at the step's peak (MiB)", fontsize=9)
        _style(ax, title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=len(BREAKDOWN), fontsize=8, frameon=False)
    caption = ("Live tensor bytes at the peak of one tracked training step, by category (medians over repeats). "
               "Compiled sets have no tensor breakdown (the tracker cannot see inside torch.compile graphs); "
               "their peak RSS is given instead.")
    if any_sharded:
        caption += (" Hatched bars: multi-process sets, the largest rank's model state (params, grads, optimizer "
                    "state of its local shards) between steps; activations are not tracked there.")
    return _finish(fig, "memory", "Peak memory by category", caption)


# ---- phases -------------------------------------------------------------------------------------------------


def phases_figure(analysis: Analysis) -> Figure | None:
    panels = []
    for machine, title, rows in _panels(analysis):
        rows = rows[rows["phase_step_s"].notna()]
        if len(rows):
            panels.append((machine, title, rows))
    if not panels:
        return None
    most = max(len(p[2]) for p in panels)
    fig, axes = _grid(len(panels), max(2.4, 0.45 * most + 1.5))
    for ax, (_, title, rows) in zip(axes, panels, strict=False):
        rows = rows.iloc[::-1]
        y = list(range(len(rows)))
        left = [0.0] * len(rows)
        for phase in PHASES:
            ms = [1e3 * float(r.phase_step_s) * float(getattr(r, f"phase_{phase}_share") or 0.0)
                  for r in rows.itertuples()]
            ax.barh(y, ms, left=left, color=PHASE_COLORS[phase], height=0.6, label=phase)
            left = [a + b for a, b in zip(left, ms, strict=True)]
        ax.set_yticks(y, [_t(label) for label in rows["technique"]])
        ax.set_xlabel("ms per step (phase pass, median over seeds)", fontsize=9)
        _style(ax, title)
    axes[0].legend(fontsize=8, frameon=False, ncols=len(PHASES), loc="lower left", bbox_to_anchor=(0, 1.08))
    return _finish(fig, "phases", "Where a step's time goes",
                   "Each bar is one step of the set split into its labelled phases (median share over seeds times "
                   "the phase pass's median step time): data = waiting for the batch, h2d = copying inputs to the "
                   "device, forward (with the loss), backward (with any all-reduce it overlaps), optimizer "
                   "(zero_grad, step, hooks), other = the rest. Timed in a pass of its own after the timed window.")


# ---- accuracy vs time ---------------------------------------------------------------------------------------


def pareto_figure(analysis: Analysis, colors: dict[str, str]) -> Figure | None:
    panels = []
    for machine, title, rows in _panels(analysis):
        rows = rows[rows["final_mean"].notna() & rows["train_time_s"].notna()]
        if len(rows):
            panels.append((machine, title, rows))
    if not panels:
        return None
    fig, axes = _grid(len(panels), 3.6)
    for ax, (_, title, rows) in zip(axes, panels, strict=False):
        hib = next((h for h in rows["higher_is_better"] if h is not None), True)
        pts = [(float(r.train_time_s), float(r.final_mean), float(r.final_std or 0.0), r.technique)
               for r in rows.itertuples()]
        for x, yv, err, label in pts:
            ax.errorbar([x], [yv], yerr=[err], fmt="o", color=colors.get(label, NEUTRAL), capsize=3, markersize=7)
            ax.annotate(_t(label), (x, yv), textcoords="offset points", xytext=(6, 5), fontsize=8)
        front, best = [], None
        for x, yv, _, _ in sorted(pts, key=lambda p: (p[0], -p[1] if hib else p[1])):
            if best is None or (yv > best if hib else yv < best):
                front.append((x, yv))
                best = yv
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#2e7d32", linewidth=1,
                    linestyle=":", label="Pareto front")
            ax.legend(fontsize=8, frameon=False, loc="best")
        metric = next((m for m in rows["metric"] if m), "metric")
        if not hib:
            ax.invert_yaxis()
        xs = [p[0] for p in pts]
        ax.set_xlim(0, max(xs) * 1.3)
        ax.set_xlabel("training clock for the sample budget, median (s; eval and one-off excluded)", fontsize=9)
        ax.set_ylabel(f"{_t(metric)} at equal samples ({'higher' if hib else 'lower'} is better, up)", fontsize=9)
        _style(ax, title)
    return _finish(fig, "pareto", "Quality at equal samples vs training time",
                   "The metric after the same sample budget (mean ± std over seeds) against the training clock the "
                   "budget took (evaluation and one-off costs excluded). Up and left is better; the dotted line "
                   "joins the sets that no faster set beats on the metric.")


def curves_figure(analysis: Analysis, colors: dict[str, str]) -> Figure | None:
    frame = analysis.frame
    ok = frame[frame["status"] == "ok"]
    panels = []
    for machine, title, rows in _panels(analysis):
        workload = rows["workload"].iloc[0]
        recs = ok[(ok["machine"] == machine) & (ok["workload"] == workload)]
        recs = recs[[len(c) > 1 for c in recs["curve"]]]
        if len(recs):
            panels.append((title, rows, recs))
    if not panels:
        return None
    fig, axes = _grid(len(panels), 3.6)
    for ax, (title, rows, recs) in zip(axes, panels, strict=False):
        seen = set()
        for r in recs.itertuples():
            pts = [(p[2], p[-1]) for p in r.curve if p[2] is not None and p[-1] is not None]
            if not pts:
                continue
            label = None if r.technique in seen else _t(r.technique)
            seen.add(r.technique)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, linewidth=1.2, alpha=0.8,
                    color=colors.get(r.technique, NEUTRAL), label=label)
        target = next((t for t in rows["target"] if t is not None), None)
        if target is not None:
            ax.axhline(float(target), color="black", linewidth=0.8, linestyle="--", label="target")
        hib = next((h for h in rows["higher_is_better"] if h is not None), True)
        metric = next((m for m in rows["metric"] if m), "metric")
        ax.set_xlabel("training clock (s; eval and one-off excluded)", fontsize=9)
        ax.set_ylabel(f"eval {_t(metric)} ({'higher' if hib else 'lower'} is better)", fontsize=9)
        ax.legend(fontsize=8, frameon=False, loc="best")
        _style(ax, title)
    return _finish(fig, "curves", "Evaluation metric over training time",
                   "Held-out metric at each evaluation against the training clock (evaluation time and one-off "
                   "costs excluded), one line per trial; every set evaluates at the same sample counts. Dashed: the "
                   "workload size's validation target (time-to-target is when a line first reaches it).")


# ---- combined techniques ------------------------------------------------------------------------------------


def interaction_figure(analysis: Analysis, colors: dict[str, str]) -> Figure | None:
    inter = analysis.interactions
    inter = inter[inter["product"].notna() & inter["observed"].notna()]
    if inter.empty:
        return None
    several = analysis.configs["machine"].nunique() > 1
    names = {m: f"machine {i}" for i, m in enumerate(analysis.machines, 1)}
    fig = MplFigure(figsize=(6.4, 4.6), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs, ys = [], []
    markers = "osD^vP*X"
    workloads = list(dict.fromkeys(inter["workload"]))
    for it in inter.itertuples():
        x, yv = float(it.product), float(it.observed)
        lo = float(it.observed_lo) if _ok(it.observed_lo) else yv
        hi = float(it.observed_hi) if _ok(it.observed_hi) else yv
        ax.errorbar([x], [yv], yerr=[[yv - lo], [hi - yv]], fmt=markers[workloads.index(it.workload) % len(markers)],
                    color=colors.get(it.technique, NEUTRAL), capsize=4, markersize=8)
        where = it.workload + (f" ({names[it.machine]})" if several else "")
        ax.annotate(_t(f"{it.technique}\n{where}"), (x, yv), textcoords="offset points", xytext=(8, -4),
                    fontsize=8)
        xs.append(x)
        ys += [lo, hi]
    top = max(xs + ys) * 1.2
    bottom = min(xs + ys) * 0.8
    ax.plot([bottom, top], [bottom, top], color="black", linewidth=0.8, linestyle="--",
            label="gains multiply (observed = product)")
    ax.set_xlim(bottom, top * 1.15)
    ax.set_ylim(bottom, top)
    ax.set_xlabel("product of the parts' speedups (each measured alone)", fontsize=9)
    ax.set_ylabel("observed speedup of the combination", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    _style(ax, "Do the gains multiply?")
    return _finish(fig, "interaction", "Combined techniques: observed vs product of parts",
                   "Each point is a combined set: its observed speedup (whiskers: 95% interval) against the product "
                   "of its parts' speedups. On the dashed line the gains multiply; below it they partly cancel.")


# ---- what the techniques found -------------------------------------------------------------------------------


def result_curve_figure(analysis: Analysis, name: str, curve: ResultCurve) -> Figure | None:
    """A curve a technique keeps in its results (``Technique.result_curve``: the LR range test's smoothed loss
    against the LR), one panel per workload and one line per trial, the value it marks drawn dotted."""
    ok = analysis.frame[analysis.frame["status"] == "ok"]
    panels: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for r in ok.itertuples():
        found = (r.technique_results or {}).get(name)
        if found and found.get(curve.key):
            panels.setdefault(r.workload, []).append((f"{r.technique} seed {r.seed}", found))
    if not panels:
        return None
    fig, axes = _grid(len(panels), 3.4)
    for ax, (workload, runs) in zip(axes, panels.items(), strict=False):
        for label, found in runs:
            xs = [p[curve.x] for p in found[curve.key]]
            ys = [p[curve.y] for p in found[curve.key]]
            line = ax.plot(xs, ys, linewidth=1.2, alpha=0.8, label=_t(label))[0]
            if curve.mark and found.get(curve.mark) is not None:
                ax.axvline(found[curve.mark], color=line.get_color(), linewidth=0.8, linestyle=":")
        if curve.xlog:
            ax.set_xscale("log")
        ax.set_xlabel(curve.xlabel, fontsize=9)
        ax.set_ylabel(curve.ylabel, fontsize=9)
        if len(runs) <= 6:
            ax.legend(fontsize=8, frameon=False, loc="best")
        _style(ax, _t(workload))
    return _finish(fig, curve.name, curve.title, curve.caption)


# ---- all ----------------------------------------------------------------------------------------------------


def frontier_figure(analysis: Analysis, colors: dict[str, str]) -> Any:
    """Gold metric against KL to the start over each set's run (mean over seeds per evaluation point)."""
    panels = []
    for machine, title, rows in _panels(analysis):
        trials = frontier_trials(analysis, machine, rows["workload"].iloc[0])
        if len(trials):
            panels.append((title, rows, trials))
    if not panels:
        return None
    fig, axes = _grid(len(panels), 3.8)
    for ax, (title, rows, trials) in zip(axes, panels, strict=False):
        for label, g in trials.groupby("technique", sort=False):
            n = min(len(c) for c in g["curve"])
            kl = np.nanmean([[np.nan if v is None else v for v in e[KL][:n]] for e in g["curve_extra"]], axis=0)
            gold = np.nanmean([[np.nan if p[4] is None else p[4] for p in c[:n]] for c in g["curve"]], axis=0)
            color = colors.get(label, NEUTRAL)
            ax.plot(kl, gold, marker="o", markersize=3, linewidth=1.2, color=color, label=_t(label))
            ax.plot(kl[-1:], gold[-1:], marker="s", markersize=7, color=color)  # the run's end
        target = next((t for t in rows["target"] if t is not None and not pd.isna(t)), None)
        if target is not None:
            ax.axhline(float(target), color="black", linewidth=0.8, linestyle="--", label="target")
        metric = next((m for m in rows["metric"] if m), "metric")
        ax.set_xlabel("KL(policy || start), nats per completion (estimated from samples)", fontsize=9)
        ax.set_ylabel(f"{_t(metric)} (higher is better)", fontsize=9)
        ax.legend(fontsize=8, frameon=False, loc="best")
        _style(ax, title)
    return _finish(fig, "frontier", "Gold reward against KL to the start",
                   "Each line is one set's run, the mean over seeds at each evaluation point (the first at step 0, "
                   "the start; a square: the run's end). Up and left is better: more gold reward for less drift "
                   "from the starting policy. Best-of-n's KL is its closed form, log n - (n-1)/n.")


def make_figures(analysis: Analysis) -> dict[str, Figure]:
    """Every figure that has data, by name, in the order the report shows them."""
    colors = technique_colors(analysis)
    makers: list[Callable[[], Figure | None]] = [
        lambda: speedup_figure(analysis),
        lambda: memory_figure(analysis),
        lambda: pareto_figure(analysis, colors),
        lambda: curves_figure(analysis, colors),
        lambda: interaction_figure(analysis, colors),
        lambda: phases_figure(analysis),
        lambda: frontier_figure(analysis, colors),
    ]
    for name, tech in techniques.registry().items():  # the curves techniques keep in their results
        if tech.result_curve is not None:
            makers.append(lambda name=name, curve=tech.result_curve: result_curve_figure(analysis, name, curve))
    out = {}
    for make in makers:
        fig = make()
        if fig is not None:
            out[fig.name] = fig
    return out
