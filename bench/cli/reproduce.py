"""``bench reproduce DIR``: a committed sweep's recorded command (``bench.report.reproduce.rerun_words``) parsed
as its flags, run again into a new directory and compared with the committed run (``bench.run.workflow.reproduce``);
each configuration's answer is printed in the words of ``bench.report.reproduce.reproduce_answer``. A report, not a
gate: exit code 0 whatever the answers, 2 for bad input."""

from __future__ import annotations

import argparse
import shlex
import textwrap
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from bench.cli.common import err, interrupted_code, interrupted_word, out, progress_text, sigterm_as_interrupt
from bench.core.errors import ConfigError

if TYPE_CHECKING:
    from bench.run.runner import Progress
    from bench.run.workflow import ReproduceResult, Start


def cmd_reproduce(args: argparse.Namespace) -> int:
    with sigterm_as_interrupt():
        return _reproduce(args)


def _reproduce(args: argparse.Namespace) -> int:
    from bench.analyze.compare import parse_threshold
    from bench.cli.sweep import _progress_bar
    from bench.report import reproduce as reproduce_mod
    from bench.run import workflow

    threshold = parse_threshold(args.threshold)
    committed = args.dir
    words = reproduce_mod.rerun_words(committed)  # not a sweep: one line (InputError)
    out_dir = args.out or workflow.reproduce_out_dir(committed)
    words = [*words[:-2], "--out", str(out_dir)]  # rerun_words ends in --out DIR: the new run gets its own
    if words[0] == "sweep":  # one side of an A/B run: reran as a sweep of its own, so recorded as one
        words = _without(words, ("--ab", "--threshold"))
    rerun = _recorded(words, committed, out_dir)
    started: list[Start] = []
    with ExitStack() as stack:  # the bar starts with the banner, after the claim: bad input is one line
        bar: list = []

        def banner(s: Start) -> None:
            started.append(s)
            err.print(f"[bold]trainbench[/] reproduce {committed}: its recorded configuration again, on "
                      f"{s.device} -> {s.out_dir}", soft_wrap=True)
            bar.append(stack.enter_context(_progress_bar()))

        def on_progress(p: Progress) -> None:
            bar[0](p.total, p.done, progress_text(p.trial.trial_id, p.record))

        try:
            done = workflow.reproduce(committed, rerun, out_dir, threshold=threshold,
                                      command="python -m bench " + shlex.join(words), on_start=banner,
                                      on_progress=on_progress)
        except KeyboardInterrupt as exc:
            if not started:
                raise
            err.print(f"[yellow]{interrupted_word(exc)}[/]: the new run's finished trials are saved in {out_dir}; "
                      f"continue with: python -m bench {words[0]} --resume --out {out_dir}, then compare with: "
                      f"python -m bench compare {committed} {out_dir}", soft_wrap=True)
            return interrupted_code(exc)
    _print_answers(done, threshold)
    return 0


def _without(words: list[str], flags: tuple[str, ...]) -> list[str]:
    """``words`` less each of ``flags`` with its value (``--ab .``, ``--threshold=2%``)."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.split("=", 1)[0] in flags:
            skip = "=" not in word
        else:
            kept.append(word)
    return kept


def _recorded(words: list[str], committed: Path, out_dir: Path):  # type: ignore[no-untyped-def]
    """The recorded command's flags as this version parses them: a sweep's config or a tune's setup. A command that
    no longer parses (a flag since removed, a --model file since deleted) is one line naming it."""
    from bench.cli.parser import build_parser
    from bench.cli.sweep import sweep_config_from_args

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"{committed}: its recorded command no longer parses ({message}): python -m bench "
                          f"{shlex.join(words)}")

    parser = build_parser()
    parser.error = fail  # type: ignore[method-assign]
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():
            sub.error = fail
    recorded = parser.parse_args(words)
    recorded.argv = words
    if recorded.command == "tune":
        from bench.cli.tune import _setup

        recorded.resume = False
        return _setup(recorded)
    recorded.resume = recorded.extend = False
    cfg = sweep_config_from_args(recorded, None)
    if cfg.nnodes > 1:
        raise ConfigError(f"{committed} is a sweep of {cfg.nnodes} nodes; reproduce reruns on this machine only: run "
                          f"its command on every node (python -m bench {shlex.join(words)} --node-rank R "
                          "--rdzv-endpoint HOST:PORT), then python -m bench compare")
    return cfg


def _print_answers(done: ReproduceResult, threshold: float) -> None:
    """The answers as lines of at most 100 columns (a long line wraps, indented): what differs about the machine,
    each configuration's answer, what the answers stand on, and where to read on."""
    from bench.report.reproduce import answer_lines, machine_difference
    from bench.report.summary import WIDTH

    comp = done.comparison
    lines = [line for line in [machine_difference(comp.environment_mismatch)] if line]
    lines += answer_lines(comp, threshold, WIDTH)
    lines += [f"note: {row.key.label}: {'; '.join(row.notes)}".replace("BASE", "committed").replace("NEW", "new run")
              for row in comp.rows if row.notes]  # what the answers stand on: failed or contended trials, noise
    lines += [f"{where}: " + ", ".join(k.label for k in keys) for keys, where in (
        (comp.only_base, "only in the committed run (not rerun here)"), (comp.only_new, "only in the new run")) if keys]
    lines.append(f"the new run and its report: {done.out_dir}; the full comparison: python -m bench compare "
                 f"{done.committed} {done.out_dir}")
    for line in lines:
        for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [""]:
            out.print(part, markup=False, highlight=False, soft_wrap=True)
