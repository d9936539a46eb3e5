"""What every command's printing shares: the consoles, the one-line error, a trial's progress line, SIGTERM as
Ctrl-C."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from bench.records.results import TrialRecord

EXIT_USAGE = 2

# Piped output (CI logs, files) gets a wide console instead of rich's 80-column default.
out = Console() if sys.stdout.isatty() else Console(width=180)
err = Console(stderr=True)


def one_line(message: str, limit: int = 1000) -> str:
    """The error as one line (echoed input is quoted and cut where it is echoed; this is the last guard)."""
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def command_line(args: argparse.Namespace) -> str:
    """How to reproduce this run (recorded in env.json)."""
    return "python -m bench " + shlex.join(args.argv)


def progress_text(trial_id: str, record: TrialRecord | None, side: str = "") -> str:
    """The progress bar's last line: ``gpt:tiny/bf16/seed0/r0: ok 1,234 samples/s`` (or why it is not ok)."""
    head = f"{side} {trial_id}" if side else trial_id
    if record is None:
        return f"{head}: already done"
    sps = record.speed.samples_per_s if record.speed else None
    detail = f"{sps:,.0f} samples/s" if record.status == "ok" and sps else (record.reason or "")[:60]
    return f"{head}: {record.status} {detail}"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``): handled like Ctrl-C, so finished trials are kept and the running
    trial's processes are killed."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` (a KeyboardInterrupt) inside the block; the previous handler after it."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_word(exc: BaseException) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def interrupted_code(exc: BaseException) -> int:
    return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130
