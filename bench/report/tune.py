"""``bench tune``'s rendering: ``tune.md``, its frontier figure and the recommended set's snippets.

Everything here reads plain data: the result dict the search writes to ``tune.json`` (``bench.run.tune.result_dict``)
and the technique registry. The entry point runs the search and hands its result here (this layer never imports
the search).
"""

from __future__ import annotations

import io
import math
import re
import sys
from pathlib import Path
from typing import Any

import techniques
from bench.core.files import write_atomic
from bench.core.text import size_text

SNIPPET_HEADING = "In your own training loop"
FIGURE = "figures/tune-frontier.png"  # relative to the tune directory, as tune.md links it


# ---- tune.md ----------------------------------------------------------------------------------------------------


def to_markdown(result: dict[str, Any], snippets: str = "", figure: str | None = None) -> str:
    """tune.md: the recommendation with its comparisons, the search trace, the Pareto frontier (and ``figure``, a
    path relative to the file), what was not tried, and ``snippets`` (``snippets_for``)."""
    lines = [*_head(result), *_recommendation(result)]
    if not result["done"]:
        lines += ["The search has not finished: `python -m bench tune --resume --out DIR` continues it.", ""]
    lines += [*_trace(result), *_frontier(result)]
    if figure:
        lines += ["", f"![Speedup against peak memory of every measured set]({figure})"]
    lines += ["", "## Not tried", ""]
    if result["not_tried"]:
        lines += [f"- `{n['set']}`: {_cell(n['why'])}" for n in result["not_tried"]]
    else:
        lines.append("- nothing: every candidate and every combination the search reached was measured")
    if snippets:
        lines += ["", f"## {SNIPPET_HEADING}", "", snippets]
    return "\n".join(lines) + "\n"


def _head(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    limit = size_text(s["memory_limit_bytes"]) if s["memory_limit_bytes"] else "none"
    return [f"# tune: {s['workload']}", "",
            f"Objective **{s['objective']}**, memory limit **{limit}**, quality **{s['quality']}**, cap "
            f"{s['cap']} pairs per comparison, "
            + (f"budget {s['budget_s']:g} s; " if s["budget_s"] is not None else "no budget; ") +
            f"{result['trials']} trials, {result['trial_time_s']:.0f} s of trial time.", ""]


def _recommendation(result: dict[str, Any]) -> list[str]:
    """The recommended set and its comparisons table, or why none is recommended."""
    if not result["recommended"]:
        peak = result["smallest_peak"]
        return [f"**No set recommended**: {result['stop']}." + (
            f" The smallest peak found: {size_text(peak[1])} ({peak[2]}) of `{peak[0]}`." if peak else ""), ""]
    lines = [f"**Recommended: `{result['recommended']}`** ({result['stop']}).", ""]
    if result["comparisons"]:
        ttt = result["settings"]["objective"] == "time-to-target"
        lines += ["| against | speed | memory | quality |" + (" time to target |" if ttt else ""),
                  "|---|---|---|---|" + ("---|" if ttt else "")]
        for against, c in result["comparisons"].items():
            name = f"{against} (runner-up)" if against == result["runner_up"] else against
            lines.append(f"| {name} | {c['speed']} | {c['memory']} | {c['quality']} |"
                         + (f" {c.get('time_to_target', '-')} |" if ttt else ""))
        lines.append("")
    return lines


def _trace(result: dict[str, Any]) -> list[str]:
    lines = ["## Search trace", "", "| # | stage | what | set | detail | trial time so far |", "|---|---|---|---|---|---|"]
    for e in result["trace"]:
        lines.append(f"| {e['n']} | {e['stage']} | {e['what']} | {e['set'] and '`' + e['set'] + '`'} | "
                     f"{_cell(e['detail'])} | {e['spent_s']:.0f} s |")
    return lines


def _frontier(result: dict[str, Any]) -> list[str]:
    lines = ["", "## Pareto frontier (speed, memory, quality against the baseline)", "",
             "| set | kind | speedup [95% CI] | peak memory | quality at equal samples | fits | on the frontier |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(result["frontier"], key=lambda r: (not r["pareto"], -(r["speedup"] or 0))):
        mark = " (recommended)" if r["recommended"] else ""
        lines.append(f"| `{r['set']}`{mark} | {r['kind']} | {r['speed']} | {size_text(r['peak_bytes'])} "
                     f"({r['peak_source'] or '-'}) | {r['quality']} | {'yes' if r['feasible'] else 'no'} | "
                     f"{'yes' if r['pareto'] else ''} |")
    lines += ["", "*Speedups against the baseline over every pair in this directory (the report's pairing: each "
              "trial with the baseline's trial of the same seed and repeat), so they can differ from the trace's, "
              "which reads a stage's rounds against the stage's reference when the candidate was closed. On the "
              "frontier: no other measured set is at least as fast, as small and as good (point estimates; a quality "
              "not measured counts as the worst); a set that does not fit can still be on it.*"]
    return lines


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def write(out_dir: Path, result: dict[str, Any], snippets: str = "") -> dict[str, Path]:
    """tune.md (and the frontier figure, when any set has a speed and a peak) into ``out_dir``; the paths by kind."""
    paths = {"md": out_dir / "tune.md"}
    figure = frontier_figure(result)
    if figure is not None:
        (out_dir / "figures").mkdir(exist_ok=True)
        paths["figure"] = out_dir / FIGURE
        paths["figure"].write_bytes(figure)
    write_atomic(paths["md"], to_markdown(result, snippets, FIGURE if figure else None))
    return paths


# ---- the figure -------------------------------------------------------------------------------------------------


def frontier_figure(result: dict[str, Any]) -> bytes | None:
    """Speedup against peak memory of every measured set, the frontier's sets filled, the limit as a line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in result["frontier"] if r["speedup"] is not None and r["peak_bytes"]]
    if not rows:
        return None
    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r in rows:
        x, y = r["peak_bytes"] / 2**20, r["speedup"]
        colour = "#c62828" if r["recommended"] else "#4c72b0"
        ax.scatter([x], [y], s=46, edgecolors=colour, facecolors=colour if r["pareto"] else "none", zorder=3)
        ax.annotate(str(r["set"]).replace("$", r"\$"), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    front = _staircase(rows)
    if len(front) > 1:
        ax.step([r["peak_bytes"] / 2**20 for r in front], [r["speedup"] for r in front], where="post",
                color="#9e9e9e", lw=1, zorder=2, label="speed-memory frontier")
    limit = result["settings"]["memory_limit_bytes"]
    if limit:
        ax.axvline(limit / 2**20, color="#c62828", ls="--", lw=1, label="memory limit")
    if limit or len(front) > 1:
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="#555555", lw=0.6)
    ax.set_xlabel("peak memory (MiB; tensors, or RSS where the tracker is blind)")
    ax.set_ylabel("speedup vs baseline")
    ax.set_title(f"tune {result['settings']['workload']}: filled = on the (speed, memory, quality) frontier, "
                 "red = recommended",
                 fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _staircase(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frontier in the figure's two dimensions (speed up, memory down), drawn as a staircase: the filled markers
    are the three-dimensional one (quality too), which a line through them would draw as a zig-zag."""
    front, best = [], -math.inf
    for r in sorted(rows, key=lambda r: (r["peak_bytes"], -r["speedup"])):
        if r["speedup"] > best:
            front.append(r)
            best = r["speedup"]
    return front


# ---- snippets ---------------------------------------------------------------------------------------------------


def snippet_of(cls: type) -> str | None:
    """The plain-PyTorch snippet of a technique's method card (its module docstring's "In your own training loop"
    section, the first fenced python block after the heading), or None."""
    doc = sys.modules[cls.__module__].__doc__ or ""
    at = doc.find(SNIPPET_HEADING)
    if at < 0:
        return None
    match = re.search(r"```python\n(.*?)```", doc[at:], re.S)
    return match.group(1) if match else None


def snippets_for(label: str | None) -> str:
    """The snippets of a set's techniques in the order the harness applies them (phase order), as markdown.
    ``label`` is a set's label as records and tune.json spell it (``bf16+grad_accum:steps=4``; options in their
    canonical order)."""
    if not label or label == "baseline":
        return ""
    parts = []
    specs = [part.strip() for part in label.split("+") if part.strip()]
    for spec in sorted(specs, key=lambda s: techniques.get(_name(s)).phase):
        code = snippet_of(techniques.get(_name(spec)))
        parts.append(f"### {spec}\n\n" + (f"```python\n{code}```" if code else
                                          "(no snippet yet: see the technique's method card)"))
    return "\n\n".join(parts)


def _name(spec: str) -> str:
    return spec.partition(":")[0].strip()
