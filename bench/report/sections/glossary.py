"""Words in this report: what each answer word the report uses means, from the one vocabulary
(``bench.core.words``), narrowed to the words its answers hold, so a reader meets no word left undefined."""

from __future__ import annotations

from bench.analyze.analysis import Analysis
from bench.core import words
from bench.core.words import Word, say, tone, word_of
from bench.report.cells import EXACT_WORDS, known
from bench.report.document import Cell, Paragraph, Section, Table
from bench.report.sections import Context

ORDER = 160

# The analysis's answer columns, by the family of words they are said in.
ANSWER_COLUMNS = ("speedup", "mem_ratio", "delta", "delta_at_time", "ttt_ratio")


def build(ctx: Context) -> Section | None:
    used = used_words(ctx.analysis)
    if not used:
        return None
    rows = [[Cell(say(w), tone(w)), Cell(words.definition(w))] for w in words.glossary() if w in used]
    return Section("Words in this report", "glossary", "Words", [
        Paragraph("Each answer this report gives, and what it means; every report, summary and comparison uses the "
                  "same words (docs/methodology.md has them all)."), Table(["word", "what it means"], rows, (1,))])


def used_words(a: Analysis) -> list[Word]:
    """The words of this analysis's answers: each comparison's (an estimate without one has no verdict), parity's,
    an exact set's quality, the claims check's, the combinations', and "futile" where the cap's pairs could not
    decide."""
    found: list[Word] = []
    c = a.configs
    for prefix in ANSWER_COLUMNS:
        for value, verdict in zip(c[prefix], c[f"{prefix}_verdict"], strict=True):
            if known(value):
                found.append(word_of(verdict))
    found += [word_of(v, words.PARITY) for v in c["parity_answer"] if v]
    found += [EXACT_WORDS[q] for q in c["exact_quality"] if q in EXACT_WORDS]
    found += [word_of(v, words.CLAIMS) for v in a.claims.get("verdict", []) if v in words.CLAIMS]
    found += [word_of(v, words.COMBINATION) for v in a.interactions.get("verdict", []) if v]
    if any(bool(f) for f in c.get("speedup_futile", []) if known(f)):
        found.append(words.FUTILE)
    known_words = {w.text for w in words.glossary()}
    return [w for w in dict.fromkeys(found) if w.text in known_words]
