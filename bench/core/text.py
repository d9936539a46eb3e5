"""Text from the user and from records: quoted in one-line error messages, escaped in markdown."""

from __future__ import annotations

import math
import re
from typing import Any


def shown(text: object, limit: int = 60) -> str:
    """User input quoted for a one-line error message: newlines and control characters escaped, a long value cut.

    ``'grad_accum'``; ``'a\\nb'``; ``'xxxx...' (10000 characters)``; a non-string as Python writes it (``2.7``).
    Errors echo what the user typed so they can find it, but a 10,000-character name or an embedded newline must
    not swamp or split the line.
    """
    quote = "'" if isinstance(text, str) else ""  # a number or a list from TOML is shown as written: 2.7, [1]
    text = text if isinstance(text, str) else repr(text)
    body = text[:limit].encode("unicode_escape").decode("ascii")
    if quote:
        body = body.replace("'", "\\'")
    return f"{quote}{body}...{quote} ({len(text)} characters)" if len(text) > limit else f"{quote}{body}{quote}"


# "<" starts HTML, "&name;" an entity, "*" and "`" emphasis and code, "](" an inline link, "\\" an escape. ">" and
# "[" alone are literal in GitHub-flavoured markdown and stay readable.
_ESCAPES = {"<": "&lt;", "&": "&amp;", "*": "\\*", "`": "\\`", "](": "]\\(", "\\": "\\\\"}
_ESCAPE_RE = re.compile(r"<|&(?=#?\w+;)|\*|`|\]\(|\\")


def escape(text: object) -> str:
    """Plain text for markdown: HTML, entities, emphasis, code and links neutralised; one line."""
    s = " ".join(str(text).split())  # no newlines inside a paragraph or a cell
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], s)


def cell(text: object) -> str:
    """``escape`` plus the table separator: safe in a table cell, and anywhere else (``\\|`` renders as ``|``)."""
    return escape(text).replace("|", "\\|")


def _ok(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def fmt_bytes(b: float | None) -> str:
    """Bytes in KiB, MiB or GiB, about 3 significant digits ("-" for none)."""
    if not _ok(b):
        return "-"
    mib = b / 2**20
    if mib >= 1024:
        return f"{mib / 1024:.2f} GiB"
    if mib >= 100:
        return f"{mib:.0f} MiB"
    if mib >= 1:
        return f"{mib:.1f} MiB"
    return f"{b / 1024:.0f} KiB"


def size_text(b: float | None) -> str:
    """Bytes as tune writes a memory limit or a peak: ``1.50 GiB``, ``80.00 MiB``, whole units from 100 up
    (``316 MiB``), ``12 B``; "-" for none."""
    if b is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}" if b < 100 * scale else f"{b / scale:.0f} {unit}"
    return f"{b:.0f} B"


def fmt_secs(s: float | None) -> str:
    """Seconds, 3 significant digits ("-" for none)."""
    if not _ok(s):
        return "-"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


__all__ = ["cell", "escape", "fmt_bytes", "fmt_secs", "shown", "size_text"]
