"""The docs say no more than the data (bench.dev.docs_check): every ratio or interval in README.md, docs/*.md and
the method cards carries its verdict word or is called an estimate, a method card's numbers name their committed
report, and every link or backticked repository path resolves. The generated tables' staleness is
tests/test_docs_tables.py's; the docs' commands are tests/test_doc_commands.py's."""

from __future__ import annotations

from pathlib import Path

from bench.dev import docs_check

CARD = '''"""A technique.

Method card
- Measured here: 1.54x [1.19, 2.67] on the tiny MLP.
- Measured (reports/example-cpu): 0.91x [0.80, 1.02], inconclusive.
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


def test_a_planted_unbacked_sentence_and_a_planted_dead_link_are_flagged(tmp_path):
    repo = _repo(tmp_path)
    page = repo / "docs" / "methodology.md"
    page.write_text(page.read_text() + (
        "\nA backed one: bf16 ran 1.66x [1.60, 1.72] faster.\n"
        "An estimate: about 2x, an estimate from the peaks.\n"
        "Published: Han et al. found 9-13x fewer weights.\n"
        "\nThe plant: compile gave 1.20x on the CNN.\nThe rest of its paragraph.\n"
        "\nAnd [the design](../DESIGN.md) with `bench/report/nothing.py`, a [bad anchor](#no-such-heading) and\n"
        "an interval alone [0.41, 2.05] on its second line.\n"
        "\n```bash\npython -m bench sweep   # 3.0x in a code block is not prose\n```\n"
        "\n<!-- generated: t (note) -->\n| 2.0x [1.0, 3.0] |\n<!-- end generated -->\n"))
    found = [str(p) for p in docs_check.problems(repo) if p.path == "docs/methodology.md"]
    assert any(p.startswith("docs/methodology.md:11: 1.20x without a verdict word") for p in found), found
    assert any(p.startswith("docs/methodology.md:14: the link '[the design](../DESIGN.md)' names ../DESIGN.md")
               for p in found), found
    assert any(p.startswith("docs/methodology.md:14: `bench/report/nothing.py` names bench/report/nothing.py")
               for p in found), found
    assert any("has no heading #no-such-heading" in p for p in found), found
    assert any(p.startswith("docs/methodology.md:15: [0.41, 2.05] without a verdict word") for p in found), found
    assert len(found) == 5, found  # the backed, the estimate, the published, code and generated blocks pass


def test_a_method_card_names_the_committed_report_of_its_numbers(tmp_path):
    found = [str(p) for p in docs_check.problems(_repo(tmp_path))]
    # line 4 of the file: no verdict and no report; line 5 names its report and its verdict; line 6 is published
    assert len(found) == 1 and found[0].startswith("techniques/thing.py:4: 1.54x, [1.19, 2.67] without a verdict")
    card = tmp_path / "techniques" / "thing.py"
    card.write_text(CARD.replace("on the tiny MLP.", "on the tiny MLP, faster."))
    found = [str(p) for p in docs_check.problems(tmp_path)]
    assert len(found) == 1 and "in a method card with no committed report named in its item" in found[0]
    card.write_text(CARD.replace("on the tiny MLP.", "on the tiny MLP, faster (reports/example-cpu)."))
    assert docs_check.problems(tmp_path) == []


def test_anchors_are_githubs():
    text = "# A\n## `python -m bench export DIR --to TARGET`\n## Measured: two gloo ranks on the AMD EPYC (AVX2 only)\n"
    assert docs_check.anchors(text + "## A\n") == {"a", "a-1", "python--m-bench-export-dir---to-target",
                                                    "measured-two-gloo-ranks-on-the-amd-epyc-avx2-only"}


def test_the_check_prints_file_line_and_the_fix(tmp_path, capsys):
    repo = _repo(tmp_path)
    (repo / "README.md").write_text("# t\n\nThe sweep ran 0.50x [0.40, 0.60].\n")
    assert docs_check.main([], repo) == 1
    out = capsys.readouterr().out
    assert out.startswith("README.md:3: 0.50x, [0.40, 0.60] without a verdict word or 'estimate'")
    assert "add the verdict its report gives" in out
    assert docs_check.main(["--bogus"], repo) == 2
