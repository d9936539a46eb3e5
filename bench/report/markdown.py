"""``report.md``: the report as GitHub-flavoured markdown, figures linked from ``figures/``.

Deterministic: the same records give the same bytes (no render time, no random numbers),
which is what the golden-file test relies on. Text from records is escaped so a name like ``<script>`` or ``a|b``
stays text and cannot break a table. Any section is drawn from its blocks (``bench.report.document``).
"""

from __future__ import annotations

import re

from bench.core.text import cell, escape
from bench.report.document import (
    Block,
    Bullets,
    Code,
    Facts,
    Figure,
    FigureRef,
    Lines,
    Paragraph,
    Report,
    Section,
    Table,
)


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


def block(b: Block, figures: dict[str, Figure]) -> list[str]:
    """One block's lines, a blank line after it."""
    if isinstance(b, Paragraph):
        return [escape(b.text), ""]
    if isinstance(b, Lines):
        return [escape(line) for line in b.lines] + [""]
    if isinstance(b, Bullets):
        out = []
        for item in b.items:
            out.append(f"- **{escape(item.text)}**" if item.strong else f"- {escape(item.text)}")
            out += [f"  - {escape(child)}" for child in item.children]
        return out + [""]
    if isinstance(b, Facts):
        return [f"- {escape(k)}: {escape(v)}" for k, v in b.pairs] + [""]
    if isinstance(b, Code):
        return _code(b.text) + [""]
    if isinstance(b, Table):
        return table(b) + [""]
    if isinstance(b, FigureRef):
        return _figure(figures.get(b.name))
    raise TypeError(f"no markdown for a block of type {type(b).__name__}")


def section(s: Section, figures: dict[str, Figure]) -> list[str]:
    out = [f"## {escape(s.title)}", ""]
    for b in s.blocks:
        out += block(b, figures)
    for part in s.parts:
        out += [f"### {escape(part.title)}", ""]
        for b in part.blocks:
            out += block(b, figures)
    for b in s.after:
        out += block(b, figures)
    return out


def head(report: Report) -> list[str]:
    """The report's title and subtitle, and the notes on its input."""
    out: list[str] = [f"# {escape(report.title)}", "", escape(report.subtitle), ""]
    if report.merge_note:
        out += [f"> {escape(report.merge_note)}", ""]
    for note in report.input_notes:
        out += [f"> **Input:** {escape(note)}", ""]
    return out


def render(report: Report) -> str:
    """The whole report as markdown: its head, then each section in order."""
    out = head(report)
    for s in report.sections:
        out += section(s, report.figures)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"
