"""One voice: every answer a person reads is worded by one module.

Every word for an answer ("faster", "inconclusive", "no power", "within the claim", ...) is written by
``bench.core.words.say``; under ``marked()`` it brackets each word it writes (``⟦faster⟧``). These tests render what a
person reads (the terminal summary, summary.md, report.md and report.html, compare.md, tune.md and the docs tables)
from committed sweeps with the brackets on, and fail on any answer word outside them: a second renderer that words a
verdict itself (``f"{ratio:.2f}x faster"``) is caught, as the planted ones below show.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.analyze import analysis, compare
from bench.core import words
from bench.core.words import MARK_CLOSE, MARK_OPEN, marked
from bench.dev import docs_tables
from bench.records import reader
from bench.report import build, cells, html, markdown, summary
from bench.report import compare as compare_md
from tests.conftest import REPO

SWEEPS = [REPO / "tests" / "fixtures" / "report", REPO / "reports" / "example-cpu-auto",
          REPO / "reports" / "example-cpu-2rank", REPO / "reports" / "example-cpu-preference",
          REPO / "reports" / "example-h200-first", REPO / "reports" / "example-cpu-model-techniques" / "gpt",
          REPO / "reports" / "tune-lstm-20MiB"]

# Words that are answers wherever they stand. "more", "less", "same", "better", "higher", "ok" and the like are
# English too: they count as answers where they follow a number (a ratio, a difference, a percentage).
DISTINCT = sorted({w.text for w in words.glossary() if w.text not in words.TERMS} - {
    "more", "less", "same", "better", "worse", "higher", "lower", "later", "ok", "differs"}, key=len, reverse=True)
EVERY = sorted({w.text for w in words.glossary() if w.text not in words.TERMS}, key=len, reverse=True)
_MARKED = re.compile(re.escape(MARK_OPEN) + ".*?" + re.escape(MARK_CLOSE))
_NUMBER = r"(?:\d+\.\d+x|[+-]\d+\.\d+|\d+%)(?: \[[^\]]*\])?,? "
_DISTINCT_AFTER_NUMBER = re.compile(_NUMBER + "(" + "|".join(map(re.escape, DISTINCT)) + r")(?![\w-])")
# an English word after a number ("35% less throughput", "0.71x, less than") is not an answer; one that ends the
# phrase ("0.59x less |", "1.20x more (RSS)") is
_ANY_AFTER_NUMBER = re.compile(_NUMBER + "(" + "|".join(map(re.escape, EVERY)) + r")(?=\s*(?:$|[|;,()]))")
_ANYWHERE = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, DISTINCT)) + r")(?![\w-])")


def unmarked(text: str, table_rows: bool = False) -> list[str]:
    """The answer words in ``text`` that ``say`` did not write: after a number anywhere, and in a table's rows (a
    markdown table's, or with ``table_rows`` every line before the first blank one: the terminal's table) any
    distinct answer word."""
    found, in_table = [], table_rows
    for line in text.splitlines():
        in_table = in_table and bool(line.strip())
        bare = _MARKED.sub("⟦⟧", line)
        hits = [*_DISTINCT_AFTER_NUMBER.finditer(bare), *_ANY_AFTER_NUMBER.finditer(bare)]
        if in_table or line.startswith("|"):
            hits += _ANYWHERE.finditer(bare)
        found += sorted({f"{m.group(0)!r} in {line[:120]!r}" for m in hits})
    return found


# ---- what a person reads ------------------------------------------------------------------------------------------


def _report_md(d: Path) -> str:
    return markdown.render(build([d], with_figures=False)[1])


def _report_html(d: Path) -> str:
    text = html.render(build([d], with_figures=False)[1])
    return re.sub(r"<[^>]+>", "\n", text)  # the text a browser shows, cell by cell


def _summary_md(d: Path) -> str:
    return summary.markdown_of(d, "summary")


def _terminal(d: Path) -> str:
    result = analysis.analyze(reader.load([d]))
    return "\n".join(summary.terminal(result.configs, [f.text for f in result.findings],
                                      summary.decisions(result)))


RENDERERS: dict[str, Callable[[Path], str]] = {"report.md": _report_md, "report.html": _report_html,
                                                "summary.md": _summary_md, "terminal": _terminal}
AB = [REPO / "reports" / "example-cpu-trial-cost" / "ab-old-new", REPO / "reports" / "example-cpu-aa-rate" / "aa-0"]


def _compare_md(d: Path) -> str:
    return compare_md.to_markdown(compare.compare_dirs(d / "a", d / "b"))


@pytest.mark.parametrize("name", list(RENDERERS))
@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_answer_in_a_report_a_summary_and_the_terminal_is_said_by_the_one_module(name, sweep):
    with marked():
        text = RENDERERS[name](sweep)
    assert MARK_OPEN in text  # the answers are there, and marked
    assert unmarked(text, table_rows=name == "terminal") == []


@pytest.mark.parametrize("ab", AB, ids=lambda p: p.name)
def test_every_answer_in_a_comparison_is_said_by_the_one_module(ab):
    with marked():
        text = _compare_md(ab)
    assert MARK_OPEN in text and unmarked(text) == []


@pytest.mark.parametrize("ab", AB, ids=lambda p: p.name)
def test_every_answer_of_bench_reproduce_is_said_by_the_one_module(ab):
    from bench.report.reproduce import answer_lines

    with marked():
        text = "\n".join(answer_lines(compare.compare_dirs(ab / "a", ab / "b"), 0.05))
    assert MARK_OPEN in text and unmarked(text, table_rows=True) == []


def test_a_planted_second_renderer_in_a_comparison_is_caught(monkeypatch):
    monkeypatch.setattr(compare_md, "_fmt_verdict", lambda verdict, why, regression: verdict)
    with marked():
        text = _compare_md(AB[0])
    assert unmarked(text)


TUNES = [REPO / "reports" / name for name in ("tune-lstm-20MiB", "tune-gpt-small-160MiB", "tune-gpt-tiny-2rank")]


def _tune_md(d: Path) -> str:
    """tune.md of a committed search, replayed from its records (the search is a function of them) so that its
    words are said now, under the brackets."""
    from bench.report import tune as tune_report
    from bench.run import workflow

    return tune_report.to_markdown(workflow.replayed_tune(d))


@pytest.mark.parametrize("d", TUNES, ids=lambda p: p.name)
def test_every_answer_in_a_tune_report_is_said_by_the_one_module(d):
    with marked():
        text = _tune_md(d)
    assert MARK_OPEN in text and unmarked(text) == []


def test_every_answer_in_the_docs_tables_is_said_by_the_one_module():
    with marked():
        bodies = docs_tables.render()
    found = {name: unmarked(body) for name, body in bodies.items()}
    assert {name: f for name, f in found.items() if f} == {}


# ---- a second renderer is caught --------------------------------------------------------------------------------


def _second(c) -> str:  # a renderer of its own: the words are right, but not said by the one module
    return f"{c.speedup:.2f}x {c.speedup_verdict}" if not c.is_reference else "reference"


@pytest.mark.parametrize("name", list(RENDERERS))
def test_a_planted_second_renderer_is_caught(name, monkeypatch):
    from bench.report.sections import results

    monkeypatch.setattr(results, "speedup_cell", lambda c: cells.Cell(_second(c)))
    monkeypatch.setattr(cells, "speed_brief", _second)
    monkeypatch.setattr(cells, "speed_terse", _second)
    with marked():
        text = RENDERERS[name](SWEEPS[1])
    assert any("x slower" in line for line in unmarked(text, table_rows=name == "terminal"))


def test_a_planted_second_renderer_in_the_docs_tables_is_caught(monkeypatch):
    monkeypatch.setattr(cells, "speed_brief", _second)
    with marked():
        body = docs_tables.render(["readme-example-cpu-auto"])["readme-example-cpu-auto"]
    assert any("x slower" in line for line in unmarked(body))


def test_the_checker_reads_a_verdict_after_a_number_and_lets_prose_be():
    assert unmarked("| a | 1.20x [1.1, 1.3] faster |") and unmarked("it is 42% slower") and unmarked("+0.01 better")
    assert unmarked("0.59x less (RSS)") and unmarked("checkpointing is inconclusive", table_rows=True)
    assert unmarked("the more the better; the same samples, a later step; 35% less throughput") == []
    assert unmarked("table\n\ntrains no faster", table_rows=True) == []  # prose below the terminal's table
    assert unmarked(f"1.20x [1.1, 1.3] {MARK_OPEN}faster{MARK_CLOSE}") == []


def test_a_word_means_one_thing():
    texts = [w.text for w in words.glossary()]
    assert len(texts) == len(set(texts)), "a word is defined twice"
    assert words.PARITY["inconclusive"].text == "no power"  # not the interval's "inconclusive"
    assert all(w.means for w in words.glossary())
