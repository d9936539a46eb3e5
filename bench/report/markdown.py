"""``report.md``: the report as GitHub-flavoured markdown, figures linked from ``figures/``.

Deterministic: the same records give the same bytes (no render time, no random numbers),
which is what the golden-file test relies on. Text from records is escaped so a name like ``<script>`` or ``a|b``
stays text and cannot break a table.
"""

from __future__ import annotations

import re

from bench.core.text import cell, escape
from bench.report.content import Figure, Report, Section, Table


def table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in t.columns) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(cell(c.text) for c in row) + " |" for row in t.rows]
    return lines


def _code(text: str) -> list[str]:
    longest = max((len(m) for m in re.findall("`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def _figure(fig: Figure | None) -> list[str]:
    if fig is None:
        return []
    return [f"![{escape(fig.title)}]({fig.path})", "", f"*{escape(fig.caption)}*", ""]


def extra_section(s: Section | None) -> list[str]:
    if s is None:
        return []
    out = [f"## {escape(s.title)}", ""]
    for line in s.lines:
        out += [escape(line), ""]
    if s.table is not None:
        out += table(s.table) + [""]
    for note in s.notes:
        out += [escape(note), ""]
    return out


def render(report: Report) -> str:
    """The whole report as markdown: each part below in the order a reader needs it."""
    out = [*_head(report), *_setup(report), *_results(report), *_optional_sections(report), *_tail(report)]
    return "\n".join(out) + "\n"


def _head(report: Report) -> list[str]:
    out: list[str] = [f"# {escape(report.title)}", "", escape(report.subtitle), ""]
    if report.merge_note:
        out += [f"> {escape(report.merge_note)}", ""]
    for note in report.input_notes:
        out += [f"> **Input:** {escape(note)}", ""]
    out += ["## Summary", ""]
    out += [escape(d) + "\n" for d in report.decisions]
    for h in report.headline:
        out.append(f"- **{escape(h.label)}**")
        out += [f"  - {escape(p)}" for p in h.points]
    return out + [""] + _figure(report.figures.get("speedup"))


def _setup(report: Report) -> list[str]:
    out = ["## Setup", ""]
    for name, facts in report.machines:
        if len(report.machines) > 1:
            out += [f"### {escape(name)}", ""]
        out += [f"- {escape(k)}: {escape(v)}" for k, v in facts]
        out.append("")
    if len(report.machines) > 1:
        out += ["### Sweep", ""]
    out += [f"- {escape(k)}: {escape(v)}" for k, v in report.sweep]
    out += ["", "Reproduce:", ""]
    return out + _code("\n".join(report.reproduce)) + [""]


def _results(report: Report) -> list[str]:
    out = ["## Results per workload", ""]
    for section in report.workloads:
        out += [f"### {escape(section.title)}", "", escape(section.about), ""]
        out += table(section.table) + [""]
        out += [escape(n) for n in section.notes]
        if section.notes:
            out.append("")
    for name in ("memory", "pareto", "curves", "frontier"):
        out += _figure(report.figures.get(name))
    return out


def _optional_sections(report: Report) -> list[str]:
    """The sections a sweep has only when it measured what they show."""
    figs, out = report.figures, []
    if report.phases is not None:
        out += ["## Where the step's time goes", "",
                "Each set's step split into its labelled phases, timed in a pass of its own after the timed "
                "window (median share over seeds), and the bottleneck the shares point to "
                "(`python -m bench profile WORKLOAD --techniques SET` adds a trace and the top operators).", ""]
        out += table(report.phases) + [""]
        out += _figure(figs.get("phases"))
    if report.interactions is not None:
        out += ["## Combined techniques", "",
                "Do the gains multiply? Each combination's observed speedup beside the product of its parts' "
                "speedups, each measured alone on the same workload.", ""]
        out += table(report.interactions) + [""]
        out += _figure(figs.get("interaction"))
    if report.tuning is not None:
        out += ["## What the techniques found", "",
                "What the techniques chose, estimated, built or communicated, seed by seed (learning rates, batch "
                "sizes, stops, sparsity, model sizes, bytes); their probes' time is the one-off cost in the workload "
                "tables, and work cached for the whole sweep (a teacher, a pretrained checkpoint, a scorer) is "
                "reported here instead.", ""]
        out += table(report.tuning) + [""]
        for name in report.tuning_figures:
            out += _figure(figs.get(name))
    if report.distributed is not None:
        out += ["## Data-parallel and sharded trials", ""]
        out += table(report.distributed) + [""]
        out += [escape(n) + "\n" for n in report.distributed_notes]
    for extra in (report.energy, report.cost, report.time_spent):
        out += extra_section(extra)
    return out


def _tail(report: Report) -> list[str]:
    out = ["## Claims check", ""]
    if report.claims is not None:
        out += ["Each technique's published effect beside what this sweep measured on this hardware.", ""]
        out += table(report.claims) + [""]
        if report.claims_note:
            out += [escape(report.claims_note), ""]
    else:
        out += ["No technique measured alone in this sweep carries a published claim.", ""]
    out += ["## Failures and skips", ""]
    out += table(report.problems) + [""] if report.problems is not None else ["None: every trial finished.", ""]
    out += ["## Noise warnings", ""]
    out += [f"- {escape(n)}" for n in report.noise] + [""]
    out += ["## What to try next", ""]
    out += [f"- {escape(n)}" for n in report.next_steps] + [""]
    out += ["## How to read this report", ""]
    return out + [f"- {escape(n)}" for n in report.method]
