"""Check that the prose says no more than the data: every ratio or interval in README.md, docs/*.md and the method
cards (the module docstrings of techniques/*.py) carries its verdict or is called an estimate, and every link or
file reference resolves inside the repository.

    .venv/bin/python -m bench.dev.docs_check     # one line per problem: file:line: what is wrong and the fix

A method card quotes only committed reports: a ratio or interval in one of its items (a list item or paragraph)
must also name the report (``reports/...``) in that item, unless it is a published figure (``SOURCED``).

A ratio is a number followed by x ("1.54x", "0.09-0.29x"), an interval two numbers in brackets ("[1.19, 2.67]").
Its sentence must hold a verdict word (``VERDICT_WORDS``: the answers of ``bench.analyze.stats.verdict`` and the
memory and time words of the generated tables) or "estimate". A reference is a markdown link or image, or a
backticked path under one of the repository's folders (``bench/...py``, ``docs/...md``, ``reports/...``); it must
name a file or folder that exists, and a link's #anchor a heading of the page it points to.

Generated tables are left to ``bench.dev.docs_tables`` (``tests/test_docs_tables.py`` checks that they are
current and that each comparison in them carries its verdict word). The exceptions are few and named
(``SKIPPED_BLOCKS``, ``NOT_PATHS``, ``SOURCED``, ``PENDING``; and the files tests/test_docs.py skips while another
branch rewrites them), each with its reason.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.core.files import REPO_DIR

VERDICT_WORDS = ("faster", "slower", "equivalent", "inconclusive", "better", "worse", "same", "no verdict", "less",
                 "more", "sooner", "later")
BACKED = re.compile(r"\b(?:" + "|".join(VERDICT_WORDS) + r"|estimated?s?)\b", re.I)
RATIO = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?x(?![\w])")
INTERVAL = re.compile(r"\[\s*[+-]?\d[\d.,]*%?\s*,\s*[+-]?\d[\d.,]*%?\s*\]")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s*(```|~~~)")
GENERATED = re.compile(r"<!-- generated: [^\n]*-->\n.*?<!-- end generated -->", re.S)
# The top-level folders whose backticked paths must resolve.
FOLDERS = ("bench", "docs", "examples", "reports", "scripts", "techniques", "tests")
# Backticked words that look like paths but name no file of this repository: placeholders and patterns.
NOT_PATHS = re.compile(r"[<>*{}]|\.\.\.|\bDIR\b|\bNAME\b|\bPATH\b")  # reports/<preset>-<time>/, tests/test_*.py
# Blocks whose numbers are checked elsewhere, each with its reason.
SKIPPED_BLOCKS = {
    "generated": "a generated table: tests/test_docs_tables.py checks it is current and every comparison's verdict",
    "code": "a code block: commands and snippets (tests/test_doc_commands.py and tests/test_snippets.py check them)",
}
# A figure quoted from a publication named in its own sentence is the source's claim, not a measurement here (a
# report's claims check tests such claims against the sweep): "et al.", an arXiv id, or the word "published".
SOURCED = re.compile(r"\bet al\.|arXiv|\bpublished\b", re.I)
# Files another branch adds, merged with this one: a link to them resolves once it is in.
PENDING: dict[str, str] = {}  # files another branch is writing, checked once merged (none now)
# Abbreviations whose full stop does not end a sentence.
ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "approx.", "Fig.", "No.")


@dataclass(frozen=True)
class Problem:
    path: str  # relative to the repository root
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Unit:
    """A piece of prose that must stand on its own: a paragraph, a list item, a heading or a table cell; its lines
    joined by spaces, ``starts`` the offset in ``text`` where each line after the first begins."""

    line: int
    text: str
    starts: tuple[int, ...] = ()

    def line_at(self, offset: int) -> int:
        """The file's line that holds ``text[offset]``."""
        return self.line + sum(1 for s in self.starts if s <= offset)


# ---- the documents --------------------------------------------------------------------------------------------


def documents(root: Path = REPO_DIR) -> Iterator[tuple[str, int, str]]:
    """(path relative to root, line of its first line in the file, markdown text) for README.md, docs/*.md and each
    technique's method card."""
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if path.is_file():
            yield str(path.relative_to(root)), 1, path.read_text()
    for path in sorted((root / "techniques").glob("*.py")):
        card = method_card(path)
        if card:
            yield str(path.relative_to(root)), card[0], card[1]


def method_card(path: Path) -> tuple[int, str] | None:
    """A module's docstring with the line it starts on (its text starts on the line after the opening quotes when
    they stand alone)."""
    tree = ast.parse(path.read_text(), str(path))
    if not tree.body or not isinstance(tree.body[0], ast.Expr) or not isinstance(tree.body[0].value, ast.Constant):
        return None
    node = tree.body[0].value
    if not isinstance(node.value, str):
        return None
    raw = path.read_text().splitlines()[node.lineno - 1]
    starts_after_quotes = raw.strip() in ('"""', "'''", 'r"""', "r'''")
    return node.lineno + (1 if starts_after_quotes else 0), node.value.removeprefix("\n")


def units(text: str, first_line: int = 1) -> Iterator[Unit]:
    """The prose units of a markdown text, each with its line; code blocks and generated blocks left out
    (``SKIPPED_BLOCKS``)."""
    text = GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    para: list[str] = []
    start = 0
    in_code = False

    def flush() -> Iterator[Unit]:
        if para:
            parts = [s.strip() for s in para]
            starts = [sum(len(p) + 1 for p in parts[:k]) for k in range(1, len(parts))]
            yield Unit(first_line + start, " ".join(parts), tuple(starts))
            para.clear()

    for i, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            yield from flush()
            in_code = not in_code
            continue
        stripped = line.strip()
        if in_code:
            continue
        if not stripped or stripped.startswith(("#", "|", "<!--")) or re.match(r"[-*+]\s|\d+\.\s", stripped):
            yield from flush()
            if stripped.startswith("|"):
                yield from (Unit(first_line + i, cell) for cell in re.split(r"(?<!\\)\|", stripped) if cell.strip())
                continue
            if stripped.startswith("#"):
                yield Unit(first_line + i, stripped)
                continue
            if not stripped or stripped.startswith("<!--"):
                continue
        if not para:
            start = i
        para.append(line)
    yield from flush()


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences: at a full stop, question or exclamation mark or a semicolon (the items of a list
    in one sentence each need their verdict) followed by a space and a capital, a backtick or a bracket; never
    inside an abbreviation."""
    for i, abbr in enumerate(ABBREVIATIONS):
        text = text.replace(abbr, f"\x00{i}\x00")
    parts = re.split(r"(?<=[.!?;])\s+(?=[A-Z`\[(*])", text)
    out = []
    for part in parts:
        for i, abbr in enumerate(ABBREVIATIONS):
            part = part.replace(f"\x00{i}\x00", abbr)
        out.append(part)
    return out


# ---- the checks -----------------------------------------------------------------------------------------------


def unbacked(path: str, unit: Unit) -> list[Problem]:
    """The sentences of ``unit`` that quote a ratio or an interval with no verdict word and no "estimate"."""
    found = []
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), unit.text)  # offsets kept, for the line
    at = 0
    for sentence in sentences(text):
        at = text.find(sentence, at)
        prose = LINK.sub(lambda m: m.group(0).split("](")[0], sentence)  # a link's target is not its sentence
        numbers = [m.group(0) for m in (*RATIO.finditer(prose), *INTERVAL.finditer(prose))]
        if numbers and not BACKED.search(prose) and not SOURCED.search(prose):
            found.append(Problem(path, unit.line_at(at + _first(sentence)), f"{', '.join(numbers)} without a "
                                 f"verdict word or 'estimate' in {_quote(sentence)}: add the verdict its report "
                                 "gives (faster, slower, equivalent, inconclusive, no verdict, ...), call it an "
                                 "estimate, or drop the number"))
        elif numbers and path.startswith("techniques/") and "reports/" not in unit.text and not SOURCED.search(prose):
            found.append(Problem(path, unit.line_at(at + _first(sentence)), f"{', '.join(numbers)} in a method card "
                                 f"with no committed report named in its item ({_quote(sentence)}): name the report "
                                 "(reports/...) it comes from, or drop the number"))
    return found


def _first(sentence: str) -> int:
    """Where the first ratio or interval of ``sentence`` starts."""
    return min(m.start() for m in (*RATIO.finditer(sentence), *INTERVAL.finditer(sentence)))


def references(path: str, unit: Unit, root: Path = REPO_DIR) -> list[Problem]:
    """The links and backticked repository paths of ``unit`` that do not resolve."""
    found = []
    base = (root / path).parent if path.endswith(".md") else root
    for m in LINK.finditer(unit.text):
        target = m.group(1)
        if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
            continue
        found += _resolve(path, unit.line_at(m.start()), target, base, root, f"the link {_quote(m.group(0))}")
    for m in CODE_SPAN.finditer(unit.text):
        token = m.group(2).strip().split(":")[0]  # examples/lstm_lm.py:build names a file
        first = token.split("/")[0]
        if first in FOLDERS and "/" in token and " " not in token and not NOT_PATHS.search(token):
            found += _resolve(path, unit.line_at(m.start()), token, root, root, f"`{m.group(2)}`")
        elif re.fullmatch(r"[A-Z][A-Z_]*\.md", token):  # README.md, DESIGN.md: a top-level page
            found += _resolve(path, unit.line_at(m.start()), token, root, root, f"`{token}`")
    return found


def _resolve(path: str, line: int, target: str, base: Path, root: Path, what: str) -> list[Problem]:
    file, _, anchor = target.partition("#")
    where = (base / file).resolve() if file else (root / path).resolve()
    if file and str(where.relative_to(root.resolve()) if root.resolve() in where.parents else "") in PENDING:
        return []
    if file and (not where.exists() or root.resolve() not in (where, *where.parents)):
        return [Problem(path, line, f"{what} names {file}, which is not in the repository: point it at a file "
                                    "that exists, or drop it")]
    if anchor and where.suffix == ".md" and anchor not in anchors(where.read_text()):
        return [Problem(path, line, f"{what}: {where.relative_to(root.resolve())} has no heading #{anchor}: "
                                    "link a heading it has")]
    return []


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a markdown page: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _quote(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def problems(root: Path = REPO_DIR, skip: Iterable[str] = ()) -> list[Problem]:
    """Every unbacked number and unresolved reference in the docs under ``root``, but in the files ``skip`` names
    (a page another branch is rewriting: tests/test_docs.py names them with the reason)."""
    found: list[Problem] = []
    for path, first, text in documents(root):
        if path in skip:
            continue
        for unit in units(text, first):
            found += unbacked(path, unit) + references(path, unit, root)
    return found


def main(argv: list[str] | None = None, root: Path = REPO_DIR) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print("usage: python -m bench.dev.docs_check", file=sys.stderr)
        return 2
    found = problems(root)
    for problem in found:
        print(problem)
    print(f"{len(found)} problem(s); generated tables: python -m bench.dev.docs_tables --check", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
