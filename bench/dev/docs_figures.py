"""Measured figures in prose, generated from the committed reports: a figure is never typed by hand.

A sentence of the README, a doc or a method card that quotes a measurement holds it in a marker naming the report,
the configuration and the quantity::

    bf16 on gpt:small ran <!-- figure example-cpu-bf16 gpt:small bf16 speedup -->1.66x [1.60, 1.72] faster<!-- /figure -->
    ([the report](reports/example-cpu-bf16/report.md)).

``python -m bench.dev.docs_tables`` rewrites every marker's text from the report (through the analysis and the one
presentation module, ``bench.report.cells``, so the figure carries its interval and its answer as the report words
them), and ``--check`` fails while one is stale. The quantities (``QUANTITIES``) are a configuration's (the workload
and set of the marker) or the sweep's (workload and set ``-``); those of ``AB_QUANTITIES`` count the answers of a
folder's A/B runs (``sweep --ab``'s ``a/``, ``b/`` and ``ab.json``, compared B against A as the CI gate compares
them), the marker's workload a pattern naming the runs (``aa-*``) and its set ``-``. The paragraph that holds a marker must name its
report (``bench.dev.docs_check`` holds it to that), so a reader can always open what the figure came from.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.analyze import analysis, compare, mfu, time_spent
from bench.core.files import REPO_DIR
from bench.core.words import CHANGES, say
from bench.report import cells
from bench.report.sections import summary as summary_section
from bench.report.sections.summary import decisions

MARKER = re.compile(r"<!-- figure (?P<report>\S+) (?P<workload>\S+) (?P<set>\S+) (?P<quantity>\S+) -->"
                    r"(?P<body>.*?)<!-- /figure -->", re.S)


class FigureError(ValueError):
    """A marker that names a report, configuration or quantity that does not exist (one line: which and where)."""


@dataclass(frozen=True)
class Marker:
    report: str  # the folder under reports/
    workload: str  # "gpt:small", or "-" for a quantity of the whole sweep
    technique: str  # "bf16", or "-"
    quantity: str  # a key of QUANTITIES

    @property
    def path(self) -> str:
        return f"reports/{self.report}"


def _config(a: analysis.Analysis, m: Marker) -> Any:
    rows = a.configs[(a.configs["workload"] == m.workload) & (a.configs["technique"] == m.technique)]
    if rows.empty:
        raise FigureError(f"{m.path} has no configuration {m.workload} {m.technique}")
    return next(rows.itertuples())


def _decided(a: analysis.Analysis) -> str:
    """As the report's Summary counts them (one function: an answer across unequal resources is not decided)."""
    speed = summary_section.speed_answers(a)
    return f"{summary_section.speed_decided(speed)} of {len(speed)}"


def _elapsed(a: analysis.Analysis) -> str:
    """The sweep's wall time: its first record's start (env.json's stamp) to its last record."""
    env = a.sweep.sources[0].env
    stamps = sorted(str(t) for t in a.frame["timestamp_utc"] if t)
    if not stamps or not env.get("timestamp_utc"):
        raise FigureError(f"{a.sweep.sources[0].path} has no timestamps to time the sweep by")
    seconds = (pd.Timestamp(stamps[-1]) - pd.Timestamp(env["timestamp_utc"])).total_seconds()
    return f"{seconds:.0f} s"


def _noise(a: analysis.Analysis) -> str:
    """The median spread of a set's samples/s over its trials (IQR / median), over the sweep's configurations."""
    spreads = [v for v in a.configs["sps_rel_iqr"] if cells.known(v)]
    if not spreads:
        raise FigureError(f"{a.sweep.sources[0].path} has no spread of samples/s")
    return f"{float(pd.Series(spreads).median()):.0%}"


# The quantities a marker may quote: of a configuration (its row of the report), or of the sweep ("-").
QUANTITIES: dict[str, Callable[[Any], str]] = {
    "speedup": cells.speed_brief,
    "memory": cells.memory_brief,
    "quality": lambda c: cells.quality_brief(c, 3),
    "time-to-target": lambda c: cells.ttt_brief(c),
    "samples/s": lambda c: f"{cells.fmt_num(c.sps_median)} samples/s",
    "mfu": lambda c: cells.fmt_pct(mfu.primary(c)),
    "one-off": lambda c: cells.one_off_cell(c).text,
    "peak": lambda c: cells.fmt_bytes(c.peak_bytes if cells.known(c.peak_bytes) else c.peak_rss_bytes),
    "step": lambda c: f"{c.step_time_s * 1e3:.1f} ms" if cells.known(c.step_time_s) else "-",
    "parity": cells.parity_brief,
}
SWEEP_QUANTITIES: dict[str, Callable[[analysis.Analysis], str]] = {
    "decided": _decided,
    "decisions": lambda a: decisions(a)[0] if decisions(a) else "-",
    "elapsed": _elapsed,
    "noise": _noise,
    "faster": lambda a: f"{sum(w == 'faster' for w in summary_section.speed_answers(a)['speedup_verdict'])} {say('faster')}",
}


def _overall_speed(runs: list[compare.Comparison]) -> str:
    """How often each answer was the overall throughput answer of B against A: "slower in 6 of 10, inconclusive
    in 4"."""
    answers = Counter(next((o.verdict for o in c.overall if o.quantity == "throughput"), None) for c in runs)
    ranked = [f"{say(w)} in {n}" for w, n in answers.most_common()]
    return f"{ranked[0]} of {len(runs)}" + "".join(f", {r}" for r in ranked[1:])


def _changed(runs: list[compare.Comparison]) -> str:
    """The runs that found a change anywhere (faster, slower, more, less, better or worse, in a configuration or
    overall): what an A/A gate must not find."""
    def changed(c: compare.Comparison) -> bool:
        verdicts = [q.verdict for r in c.rows for q in r.quantities] + [o.verdict for o in c.overall]
        return any(v in CHANGES for v in verdicts)

    return f"{sum(map(changed, runs))} of {len(runs)}"


# The quantities of a folder of A/B runs, each run compared B against A at the threshold its ab.json records.
AB_QUANTITIES: dict[str, Callable[[list[compare.Comparison]], str]] = {
    "ab-overall": _overall_speed,
    "ab-changes": _changed,
}


# ---- the harness's own cost per trial (docs/overhead.md) -----------------------------------------------------


def _fixed_cost(a: analysis.Analysis) -> str:
    """What the sweep's trials cost besides their measured steps, from the records' stage times, as the report's
    "Where the sweep's time went" adds them up: "3.62 s per trial; 26% of the trials' 344.0 s in measured steps;
    largest: imports 84 s, build 72 s, one_off 68 s"."""
    spent = time_spent.of_records(a.sweep.records)
    if spent is None or not spent.trials:
        raise FigureError(f"{a.sweep.sources[0].path} has no trial with stage times (an older trainbench)")
    largest = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in spent.largest_fixed())
    return (f"{cells.fmt_secs(spent.fixed_s / spent.trials)} per trial; {spent.share(spent.measured_s):.0%} of the "
            f"trials' {cells.fmt_secs(spent.wall_s)} in measured steps; largest: {largest}")


SWEEP_QUANTITIES["fixed-cost"] = _fixed_cost


def ab_runs(marker: Marker, root: Path = REPO_DIR) -> list[compare.Comparison]:
    """The A/B runs the marker names (its workload a pattern of folders under its report), each compared."""
    runs = sorted(d for d in (root / marker.path).glob(marker.workload) if (d / "ab.json").is_file())
    if not runs:
        raise FigureError(f"{marker.path} has no A/B run (a folder with ab.json) matching {marker.workload!r}")
    return [compare.compare_dirs(d / "a", d / "b", json.loads((d / "ab.json").read_text())["threshold"])
            for d in runs]


def render(marker: Marker, a: analysis.Analysis) -> str:
    """The marker's text, from the report's analysis."""
    if marker.workload == "-":
        if marker.quantity not in SWEEP_QUANTITIES:
            raise FigureError(f"no sweep quantity {marker.quantity!r} (valid: {', '.join(SWEEP_QUANTITIES)})")
        return SWEEP_QUANTITIES[marker.quantity](a)
    if marker.quantity not in QUANTITIES:
        raise FigureError(f"no quantity {marker.quantity!r} (valid: {', '.join([*QUANTITIES, *AB_QUANTITIES])})")
    return QUANTITIES[marker.quantity](_config(a, marker))


def markers(text: str) -> list[Marker]:
    return [Marker(m["report"], m["workload"], m["set"], m["quantity"]) for m in MARKER.finditer(text)]


def update(text: str, analyse: Callable[[str], analysis.Analysis], root: Path = REPO_DIR) -> str:
    """``text`` with every marker's text rendered again (``analyse(report)`` gives a report's analysis; an A/B
    quantity reads its runs under ``root``)."""

    def replace(m: re.Match[str]) -> str:
        marker = Marker(m["report"], m["workload"], m["set"], m["quantity"])
        if marker.quantity in AB_QUANTITIES:
            body = AB_QUANTITIES[marker.quantity](ab_runs(marker, root))
        else:
            body = render(marker, analyse(marker.path))
        return m.group(0)[: m.start("body") - m.start()] + body + "<!-- /figure -->"

    return MARKER.sub(replace, text)
