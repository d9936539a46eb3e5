"""The docs say no more than the data (bench.dev.docs_check): no measured figure typed by hand in README.md, docs/*.md
or a method card (it stands in a generated table or an inline figure, or in the allow-list with its source), no
internal issue number, and every link or backticked repository path resolves. The generated tables' and figures'
staleness is tests/test_docs_tables.py's and tests/test_docs_figures.py's; the docs' commands are
tests/test_doc_commands.py's."""

from __future__ import annotations

from pathlib import Path

from bench.core.files import REPO_DIR
from bench.dev import docs_check

CARD = '''"""A technique.

Method card
- When it pays: when the step is bound by memory bandwidth.
- Sources: Someone et al., 2.5x on a GPU.
"""
'''


def _repo(tmp_path: Path) -> Path:
    """A small repository: a README, one doc, one method card, one report directory."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "techniques").mkdir()
    (tmp_path / "reports" / "example-cpu").mkdir(parents=True)
    (tmp_path / "reports" / "example-cpu" / "report.md").write_text("# report\n\n## Setup\n")
    (tmp_path / "README.md").write_text("# t\n\nSee [methodology](docs/methodology.md#the-noise).\n")
    (tmp_path / "docs" / "methodology.md").write_text("# Methodology\n\n## The noise\n\nText.\n")
    (tmp_path / "techniques" / "thing.py").write_text(CARD)
    return tmp_path


def test_the_docs_say_no_more_than_the_data():
    found = docs_check.problems()
    assert found == [], "\n".join(map(str, found)) + "\n(python -m bench.dev.docs_check lists them)"


def test_a_clean_repository_passes(tmp_path):
    repo = _repo(tmp_path)
    (repo / "techniques" / "thing.py").write_text('"""A technique with no numbers."""\n')
    assert docs_check.problems(repo) == []


def test_each_planted_problem_is_caught_and_what_is_allowed_passes(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    monkeypatch.setattr(docs_check, "ALLOWED", (docs_check.Allowed("5%", "threshold", "the default --threshold"),))
    page = repo / "docs" / "methodology.md"
    page.write_text(page.read_text() + (
        "\nA default: the threshold is 5% unless set.\n"                                          # 7: allowed
        "\nPublished: Han et al. found 9-13x fewer weights.\n"                                     # 9: sourced
        "\nThe plant: compile gave 1.20x on the CNN.\nThe rest of its paragraph.\n"               # 11: a ratio
        "\nA step took 69.3 ms, and 5% of the cores were busy.\n"                                  # 14: units
        "\nAnd [the design](../DESIGN.md) with `bench/report/nothing.py`, a [bad anchor](#no-such-heading) and\n"
        "an interval alone [0.41, 2.05] on its second line.\n"                                      # 16-17
        "\nAs issue 40 said, and #41 too.\n"                                                       # 19: issues
        "\nA figure <!-- figure example-cpu gpt:tiny bf16 speedup -->0.09x faster<!-- /figure --> alone.\n"  # 21
        "\nA figure <!-- figure example-cpu gpt:tiny bf16 speedup -->0.09x<!-- /figure --> from "
        "[the report](../reports/example-cpu/report.md).\n"                                         # 23: named
        "\n```bash\npython -m bench sweep   # 3.0x in a code block is not prose\n```\n"
        "\n<!-- generated: t (note) -->\n| 2.0x [1.0, 3.0] |\n<!-- end generated -->\n"))
    found = [str(p) for p in docs_check.problems(repo) if p.path == "docs/methodology.md"]
    assert any(p.startswith("docs/methodology.md:11: 1.20x typed by hand") for p in found), found
    assert any(p.startswith("docs/methodology.md:14: 69.3 ms, 5% typed by hand") for p in found), found
    assert any(p.startswith("docs/methodology.md:16: the link '[the design](../DESIGN.md)' names ../DESIGN.md")
               for p in found), found
    assert any(p.startswith("docs/methodology.md:16: `bench/report/nothing.py` names bench/report/nothing.py")
               for p in found), found
    assert any("has no heading #no-such-heading" in p for p in found), found
    assert any(p.startswith("docs/methodology.md:17: [0.41, 2.05] typed by hand") for p in found), found
    assert any(p.startswith("docs/methodology.md:19: 'issue 40' is an internal issue number") for p in found), found
    assert any(p.startswith("docs/methodology.md:19: '#41' is an internal issue number") for p in found), found
    assert any(p.startswith("docs/methodology.md:21: the figure from reports/example-cpu stands in a paragraph")
               for p in found), found
    assert len(found) == 9, found  # the allowed, the published, the named figure, code and generated blocks pass


def test_a_method_card_types_no_measured_figure(tmp_path):
    assert docs_check.problems(_repo(tmp_path)) == []  # its published claim names its source
    card = tmp_path / "techniques" / "thing.py"
    card.write_text(CARD.replace("bandwidth.", "bandwidth: measured 1.54x [1.19, 2.67] here (reports/example-cpu)."))
    found = [str(p) for p in docs_check.problems(tmp_path)]
    assert len(found) == 1 and found[0].startswith("techniques/thing.py:4: 1.54x, [1.19, 2.67] typed by hand")


def test_every_allowed_figure_names_its_source():
    assert all(a.source and a.near for a in docs_check.ALLOWED)


def test_anchors_are_githubs():
    text = "# A\n## `python -m bench export DIR --to TARGET`\n## Measured: two gloo ranks on the AMD EPYC (AVX2 only)\n"
    assert docs_check.anchors(text + "## A\n") == {"a", "a-1", "python--m-bench-export-dir---to-target",
                                                    "measured-two-gloo-ranks-on-the-amd-epyc-avx2-only"}


def test_the_check_prints_file_line_and_the_fix(tmp_path, capsys):
    repo = _repo(tmp_path)
    (repo / "README.md").write_text("# t\n\nThe sweep ran 0.50x [0.40, 0.60].\n")
    assert docs_check.main([], repo) == 1
    out = capsys.readouterr().out
    assert out.startswith("README.md:3: 0.50x, [0.40, 0.60] typed by hand")
    assert "quote it as an inline figure" in out
    assert docs_check.main(["--bogus"], repo) == 2


# What a reader can take in: docs/ as a whole and the README as a front page. Generated blocks count (a reader reads
# them too); a page that outgrows its share is cut, not the budget raised.
DOCS_WORDS = 20_000
README_LINES = 120


def test_the_docs_keep_within_their_budget():
    words = sum(len(p.read_text().split()) for p in (REPO_DIR / "docs").glob("*.md"))
    assert words <= DOCS_WORDS, f"docs/ holds {words:,} words, over its {DOCS_WORDS:,}: cut prose, link instead"
    lines = len((REPO_DIR / "README.md").read_text().splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines, over its {README_LINES}: it is a front page"
