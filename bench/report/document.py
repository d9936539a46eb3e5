"""A report as plain data: sections of blocks (paragraphs, lists, facts, tables, code, figures).

Each section of the report is one module of ``bench.report.sections`` that returns a ``Section``; the two
renderers (``markdown.py``, ``html.py``) draw any section from its blocks and never compute a number. Every string
here is plain text, never markup: names from records and configs (a workload called ``<script>``) are escaped by the
renderer, markdown and HTML alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class Cell:
    """A table cell: text, and a tone the HTML colours (good / bad / warn / muted); markdown ignores the tone."""

    text: str
    tone: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass
class Table:
    kind: ClassVar[str] = "table"  # what the HTML template draws
    columns: list[str]
    rows: list[list[Cell]]
    wrap: tuple[int, ...] = ()  # columns whose long text may wrap (reasons, explanations)


@dataclass
class Figure:
    """A rendered figure: ``figures/<name>.png`` beside the markdown, embedded in the HTML."""

    name: str
    title: str
    caption: str
    png: bytes
    width: int = 0
    height: int = 0

    @property
    def path(self) -> str:
        return f"figures/{self.name}.png"


@dataclass
class Paragraph:
    """Prose. ``quiet``: an aside (the HTML draws it smaller and grey)."""

    kind: ClassVar[str] = "paragraph"  # what the HTML template draws
    text: str
    quiet: bool = False


@dataclass
class Lines:
    """Short lines that belong together (one paragraph in markdown, one per line in HTML)."""

    kind: ClassVar[str] = "lines"  # what the HTML template draws
    lines: list[str]


@dataclass
class Item:
    """A list item: its text (``strong`` draws it bold) and the items nested under it."""

    text: str
    strong: bool = False
    children: list[str] = field(default_factory=list)


@dataclass
class Bullets:
    kind: ClassVar[str] = "bullets"  # what the HTML template draws
    items: list[Item]

    @classmethod
    def of(cls, texts: list[str]) -> Bullets:
        return cls([Item(t) for t in texts])


@dataclass
class Facts:
    """Key-value pairs (the setup's machine and sweep)."""

    kind: ClassVar[str] = "facts"  # what the HTML template draws
    pairs: list[tuple[str, str]]


@dataclass
class Code:
    """Lines to copy into a shell."""

    kind: ClassVar[str] = "code"  # what the HTML template draws
    text: str


@dataclass
class FigureRef:
    """Where a figure goes; drawn only when the report holds a figure of that name."""

    kind: ClassVar[str] = "figure"  # what the HTML template draws
    name: str


Block = Paragraph | Lines | Bullets | Facts | Code | Table | FigureRef


@dataclass
class Part:
    """A titled part inside a section (one workload's results, one machine's facts)."""

    title: str
    blocks: list[Block]
    anchor: str = ""


@dataclass
class Section:
    """One section of the report: its heading, a short name for the HTML's navigation, and its blocks, then its
    titled parts."""

    title: str
    anchor: str
    nav: str
    blocks: list[Block]
    parts: list[Part] = field(default_factory=list)
    after: list[Block] = field(default_factory=list)  # blocks below the parts (the results' figures)


@dataclass
class Report:
    title: str
    subtitle: str
    merge_note: str | None  # what a merge of several sweeps means for the numbers
    input_notes: list[str]  # what was wrong with the input and what was done about it
    sections: list[Section]
    figures: dict[str, Figure] = field(default_factory=dict)

    def section(self, anchor: str) -> Section | None:
        return next((s for s in self.sections if s.anchor == anchor), None)
