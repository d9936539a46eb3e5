"""Check that the prose says no more than the data: a measured figure in README.md, docs/*.md or a method card (the
module docstring of techniques/*.py) stands only where a generator wrote it, and every reference resolves.

    .venv/bin/python -m bench.dev.docs_check     # one line per problem: file:line: what is wrong and the fix

Outside generated blocks (``bench.dev.docs_tables``), inline figures (``bench.dev.docs_figures``) and code, the check
fails on each of these:

- a number with a unit of measurement (``1.5x``, ``13%``, ``6 minutes``, ``69.3 ms``, ``1.07 GiB``, ``420 TFLOP/s``,
  ``668k tokens/s``, ``12 J``) or an interval (``[1.19, 2.67]``): a figure typed by hand goes stale the day the
  code or the machine changes. It belongs in a generated block or an inline figure, rendered from a committed
  report with its answer; a fact that is not a measurement (a datasheet peak, a published claim, a default, a
  version) stands in the allow-list (``ALLOWED``), each entry with its source, or names its publication in its own
  sentence ("et al.", an arXiv id, "published");
- a reference to a file the repository does not have (a markdown link, or a backticked path under one of its
  folders), and a link to a heading a page does not have;
- an internal issue number (the word "issue" or a hash sign followed by a number): the reader has no issue
  tracker; say what the issue was;
- an inline figure whose paragraph does not name its report (``reports/...``): the reader must be able to open it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.core.files import REPO_DIR

_NUMBER = r"(?<![\w.])[+-]?~?\d[\d,]*(?:\.\d+)?(?:k|M)?(?:\s?[-–]\s?\d[\d,]*(?:\.\d+)?)?"
UNITS = (r"x|%|ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hours?|days?|[KMGT]i?B|bytes|samples/s|tokens/s|"
         r"steps/s|[kMGTP]?FLOP/s|[kMGTP]?FLOPs?|[kM]?J|W|Hz")
MEASURED = re.compile(_NUMBER + r"\s?(?:" + UNITS + r")(?![\w/])")
RATIO = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?x(?![\w])")
INTERVAL = re.compile(r"\[\s*[+-]?\d[\d.,]*%?\s*,\s*[+-]?\d[\d.,]*%?\s*\]")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FENCE = re.compile(r"^\s*(```|~~~)")
GENERATED = re.compile(r"<!-- generated: [^\n]*-->\n.*?<!-- end generated -->", re.S)
FIGURE = re.compile(r"<!-- figure (\S+) [^>]*-->.*?<!-- /figure -->", re.S)
ISSUE = re.compile(r"(?<![\w/#&-])(?:issues? #?\d+|#\d+)\b", re.I)
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
        comment = bool(re.fullmatch(r"<!--.*?-->", stripped))  # a line that is wholly a comment (a marker's line)
        if not stripped or stripped.startswith(("#", "|")) or comment or re.match(r"[-*+]\s|\d+\.\s", stripped):
            yield from flush()
            if stripped.startswith("|"):
                yield from (Unit(first_line + i, cell) for cell in re.split(r"(?<!\\)\|", stripped) if cell.strip())
                continue
            if stripped.startswith("#"):
                yield Unit(first_line + i, stripped)
                continue
            if not stripped or comment:
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


@dataclass(frozen=True)
class Allowed:
    """A figure that is not a measurement: its text as it stands in the prose, a word its sentence holds (so a
    default's "5%" does not excuse every 5%), and where it comes from."""

    text: str
    near: str
    source: str


# The facts that are not measurements, each with its source. Add one only for a figure nobody measured here.
ALLOWED: tuple[Allowed, ...] = (
    Allowed("95%", "interval", "bench.analyze.stats.CONFIDENCE = 0.95: the level of every interval, a setting"),
)


def _allowed(token: str, sentence: str) -> bool:
    token = " ".join(token.split())
    return any(a.text == token and a.near.lower() in sentence.lower() for a in ALLOWED)


def hand_typed(path: str, unit: Unit) -> list[Problem]:
    """The sentences of ``unit`` that type a measured figure (a number with a unit, an interval) by hand."""
    found = []
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), unit.text)  # offsets kept, for the line
    text = FIGURE.sub(lambda m: " " * len(m.group(0)), text)  # a generated figure is not typed by hand
    at = 0
    for sentence in sentences(text):
        at = text.find(sentence, at)
        # a link's target is not its sentence: blanked, so that offsets stay the sentence's own
        prose = LINK.sub(lambda m: m.group(0).split("](")[0] + " " * (len(m.group(0)) - len(m.group(0).split("](")[0])),
                         sentence)
        if SOURCED.search(prose):
            continue
        hits = [m for m in (*MEASURED.finditer(prose), *INTERVAL.finditer(prose))
                if not _allowed(m.group(0), prose)]
        if hits:
            first = min(m.start() for m in hits)
            figures = ", ".join(dict.fromkeys(" ".join(m.group(0).split()) for m in hits))
            found.append(Problem(path, unit.line_at(at + first),
                                 f"{figures} typed by hand in {_quote(sentence)}: quote it as an inline figure "
                                 "(<!-- figure REPORT WORKLOAD SET QUANTITY -->, python -m bench.dev.docs_tables "
                                 "renders it), move it into a generated table, add a fact that is not a measurement "
                                 "to docs_check.ALLOWED with its source, or drop it"))
    return found


def issue_numbers(path: str, unit: Unit) -> list[Problem]:
    """Internal issue numbers: a reader has no tracker to look them up in."""
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), unit.text)
    text = LINK.sub(lambda m: " " * len(m.group(0)), text)
    return [Problem(path, unit.line_at(m.start()), f"{_quote(m.group(0))} is an internal issue number: say what it "
                                                   "was instead") for m in ISSUE.finditer(text)]


def figures_named(path: str, unit: Unit) -> list[Problem]:
    """An inline figure's paragraph (or list item) names the report the figure comes from."""
    return [Problem(path, unit.line_at(m.start()), f"the figure from reports/{m.group(1)} stands in a paragraph that "
                                                   f"does not name reports/{m.group(1)}: link the report beside it")
            for m in FIGURE.finditer(unit.text) if f"reports/{m.group(1)}" not in FIGURE.sub("", unit.text)]


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
        elif re.fullmatch(r"[A-Z][A-Z_]*\.md", token):  # README.md, CHANGES.md: a top-level page
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
            found += (hand_typed(path, unit) + references(path, unit, root) + issue_numbers(path, unit)
                      + figures_named(path, unit))
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
