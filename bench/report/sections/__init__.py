"""The report's sections, one module each, in the order a reader needs them.

A section module holds ``ORDER`` (its place: the report sorts the sections by it) and ``build(ctx) -> Section |
None`` (None: the sweep measured nothing this section shows). The modules are found by themselves, as techniques
are: adding a section is adding its module (and its test), nothing else. Both renderers draw any section from its
blocks (``bench.report.document``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType

from bench.analyze import cost
from bench.analyze.analysis import Analysis
from bench.report.document import Figure, Section


@dataclass
class Context:
    """What every section reads: the analysis, the figures already rendered, the price per machine-hour given to
    the report (None: each sweep's own), and the name each machine goes by ("" when the report has one machine)."""

    analysis: Analysis
    figures: dict[str, Figure] = field(default_factory=dict)
    price: cost.Price | None = None
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.names:
            machines = self.analysis.machines
            self.names = {machines[0]: ""} if len(machines) == 1 else {
                m: f"machine {i}" for i, m in enumerate(machines, 1)}

    @property
    def several(self) -> bool:
        """The report holds several machines, so every row says which."""
        return len(self.names) > 1

    def where(self, workload: str, machine: str) -> str:
        """A workload as the tables name it: with its machine when the report holds several."""
        name = self.names.get(machine, "")
        return workload + (f" ({name})" if name else "")


def modules() -> list[ModuleType]:
    """Every section module, in report order."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted(found, key=lambda m: m.ORDER)


def build(ctx: Context) -> list[Section]:
    """The report's sections (those with something to show), in order."""
    return [s for s in (m.build(ctx) for m in modules()) if s is not None]


def anchor(text: str, prefix: str = "w-") -> str:
    """An HTML id from a title: lower case, words joined by "-"."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return prefix + (slug or "workload")
