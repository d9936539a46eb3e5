"""Measured figures in prose are generated from the committed reports (bench.dev.docs_figures): a marker's text is
rendered from its report, a stale one is caught and rewritten, a broken one is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.dev import docs_figures, docs_tables
from tests.conftest import REPO

REPORT = "example-cpu-bf16"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one committed report, a README quoting it, and a method card quoting it."""
    shutil.copytree(REPO / "reports" / REPORT, tmp_path / "reports" / REPORT,
                    ignore=shutil.ignore_patterns("figures", "*.html"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "techniques").mkdir()
    return tmp_path


def _marker(quantity: str, workload: str = "gpt:small", technique: str = "bf16", body: str = "?") -> str:
    return f"<!-- figure {REPORT} {workload} {technique} {quantity} -->{body}<!-- /figure -->"


def test_a_figure_is_rendered_from_its_report_with_its_interval_and_answer(repo):
    analyse = docs_tables.analyser(repo)
    a = analyse(f"reports/{REPORT}")
    speed = docs_figures.render(docs_figures.Marker(REPORT, "gpt:small", "bf16", "speedup"), a)
    assert speed.startswith("1.66x [1.60, 1.72] ") and speed.endswith("faster")
    assert docs_figures.render(docs_figures.Marker(REPORT, "-", "-", "decided"), a) == "3 of 3"  # 3 sets, 3 answers


def test_a_stale_figure_is_caught_rewritten_and_a_broken_one_named(repo):
    readme = repo / "README.md"
    readme.write_text(f"bf16 ran {_marker('speedup', body='1.70x faster')} ([report](reports/{REPORT}/report.md)).\n")
    card = repo / "techniques" / "thing.py"
    card.write_text(f'"""A technique.\n\nMeasured: {_marker("memory")} (reports/{REPORT}).\n"""\n')
    found, rewritten = docs_tables.figure_problems(repo)
    assert found == ["README.md is out of date (its figures): run python -m bench.dev.docs_tables",
                     "techniques/thing.py is out of date (its figures): run python -m bench.dev.docs_tables"]
    assert "-->1.66x [1.60, 1.72] faster<!-- /figure -->" in rewritten["README.md"]
    for path, text in rewritten.items():
        (repo / path).write_text(text)
    assert docs_tables.figure_problems(repo) == ([], {})

    readme.write_text(_marker("speedup", workload="gpt:huge") + _marker("velocity") + "\n")
    found, _ = docs_tables.figure_problems(repo)
    assert found == [f"README.md: a figure marker cannot be rendered: reports/{REPORT} has no configuration "
                     "gpt:huge bf16"]
    readme.write_text(_marker("velocity") + "\n")
    assert "no quantity 'velocity' (valid: speedup, memory" in docs_tables.figure_problems(repo)[0][0]
    readme.write_text("<!-- figure no-such-report - - decided -->5 of 12<!-- /figure -->\n")
    assert "reports/no-such-report is not a committed report" in docs_tables.figure_problems(repo)[0][0]


def test_an_ab_figure_counts_the_answers_of_its_runs_compared_b_against_a(tmp_path):
    """A/B runs (sweep --ab: a/, b/, ab.json) are compared as the CI gate compares them, at their own threshold."""
    gates = REPO / "reports" / "example-cpu-aa-rate"
    for run in ("aa-7", "slow-0", "slow-8"):  # overall: equivalent; slower; inconclusive with one slower configuration
        shutil.copytree(gates / run, tmp_path / "reports" / "gates" / run)
    (tmp_path / "docs").mkdir()

    def figure(runs: str, quantity: str) -> str:
        return docs_figures.update(f"<!-- figure gates {runs} - {quantity} -->?<!-- /figure -->",
                                   docs_tables.analyser(tmp_path), tmp_path)

    assert "-->slower in 1 of 2, inconclusive in 1<!--" in figure("slow-*", "ab-overall")
    assert "-->equivalent in 1 of 1<!--" in figure("aa-*", "ab-overall")
    assert "-->2 of 2<!--" in figure("slow-*", "ab-changes")  # slow-8 found one configuration slower
    assert "-->0 of 1<!--" in figure("aa-*", "ab-changes")
    with pytest.raises(docs_figures.FigureError, match="no A/B run"):
        figure("none-*", "ab-overall")


def test_the_fixed_cost_figure_is_the_one_the_report_adds_up_from_the_stage_times():
    """docs/overhead.md quotes a sweep's fixed cost per trial: the same figure as its report's "Where the sweep's
    time went", and an error for a sweep whose records hold no stage times."""
    analyse = docs_tables.analyser(REPO)
    report = "example-cpu-trial-cost/smoke-after"
    text = docs_figures.render(docs_figures.Marker(report, "-", "-", "fixed-cost"), analyse(f"reports/{report}"))
    per_trial = text.split(" per trial")[0]
    assert f"of fixed cost, {per_trial} per trial." in (REPO / "reports" / report / "report.md").read_text()
    assert "in measured steps; largest: imports" in text
    older = "example-cpu-trial-cost/default-before"
    with pytest.raises(docs_figures.FigureError, match="no trial with stage times"):
        docs_figures.render(docs_figures.Marker(older, "-", "-", "fixed-cost"), analyse(f"reports/{older}"))
