"""What the techniques found: what each technique chose, estimated, built or communicated, seed by seed, in the
words of its own ``summarize``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

import techniques
from bench.report.document import Cell, FigureRef, Paragraph, Section, Table
from bench.report.sections import Context
from techniques.base import Technique

ORDER = 60


def build(ctx: Context) -> Section | None:
    table = tuning_table(ctx.analysis.frame, lambda machine, workload: ctx.where(workload, machine))
    if table is None:
        return None
    curves = [FigureRef(t.result_curve.name) for t in techniques.registry().values() if t.result_curve]
    return Section("What the techniques found", "tuning", "Found", [
        Paragraph("What the techniques chose, estimated, built or communicated, seed by seed (learning rates, batch "
                  "sizes, stops, sparsity, model sizes, bytes); their probes' time is the one-off cost in the "
                  "workload tables, and work cached for the whole sweep (a teacher, a pretrained checkpoint, a "
                  "scorer) is reported here instead."), table, *curves])


def tuning_table(frame: pd.DataFrame, where: Callable[[str, str], str]) -> Table | None:
    """What the techniques found: one row per configuration and technique that reported results, in the words of
    the technique's own ``summarize`` (the seeds of a configuration side by side, in seed order); a technique this
    session has not registered (a plugin not loaded here) reads as the base class lists results: by their keys.
    ``where(machine, workload)`` names the configuration's place."""
    ok = frame[frame["status"] == "ok"]
    known = techniques.registry()
    rows = []
    for (machine, workload, technique), g in ok.groupby(["machine", "workload", "technique"], sort=False):
        per_name: dict[str, list[dict[str, Any]]] = {}
        for results in g.sort_values("seed")["technique_results"]:
            for name, found in (results or {}).items():
                per_name.setdefault(name, []).append(found)
        for name, found in per_name.items():
            text = known.get(name, Technique).summarize(found)
            rows.append([Cell(where(machine, workload)), Cell(technique), Cell(name), Cell(text)])
    if not rows:
        return None
    return Table(["where", "technique set", "technique", "what it found (seeds in order)"], rows, wrap=(3,))
