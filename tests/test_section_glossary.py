"""The report's "Words in this report": the answer words the report uses, each with what it means, and no other."""

from __future__ import annotations

from pathlib import Path

from bench.core import words
from bench.report import build, markdown
from bench.report.sections import glossary
from tests.conftest import REPO

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report"


def _texts(d: Path) -> list[str]:
    return [w.text for w in glossary.used_words(build([d], with_figures=False)[0])]


def test_the_section_defines_the_words_the_report_uses_and_no_other():
    used = _texts(FIXTURE)
    # the fixture's answers: faster bf16 on mlp:tiny, less memory, an exact set the same, parity ok, a claim
    # inconclusive, a combination consistent with multiplying, two sets with too few pairs
    for text in ("faster", "less", "same", "ok", "inconclusive", "no verdict", "consistent with multiplying"):
        assert text in used
    for text in ("no power", "mismatch", "reproduced", "infeasible", "gains partly cancel"):
        assert text not in used
    section = markdown.render(build([FIXTURE], with_figures=False)[1]).split("## Words in this report\n")[1]
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| word")]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table] == [
        w.text for w in words.glossary() if w.text in used]  # the glossary's order, each word once
    assert f"| same | {words.SAME.means} |" in section


def test_a_report_whose_parity_failed_defines_mismatch():
    assert "mismatch" in _texts(REPO / "reports" / "example-h200-first")  # bf16's parity in its loss spike
