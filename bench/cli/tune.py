"""``bench tune``: the flags to the search's setup (``bench.run.tune_setup``), the search and its files through the
workflow (``bench.run.workflow.tune``: tune.json, tune.md and its figure, summary.md, the report), the result printed.
Ctrl-C or SIGTERM writes the partial result (the workflow) and says how to resume (here)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.cli.common import (
    command_line,
    err,
    interrupted_code,
    interrupted_word,
    one_line,
    out,
    progress_text,
    sigterm_as_interrupt,
)

if TYPE_CHECKING:
    from bench.run.runner import Progress
    from bench.run.tune_setup import Setup
    from bench.run.workflow import TuneResult


def cmd_tune(args: argparse.Namespace) -> int:
    with sigterm_as_interrupt():
        return _tune(args)


def _setup(args: argparse.Namespace) -> Setup:
    """The search's options and its trials' sweep settings, from the flags."""
    from bench.run import tune_setup

    given = {"objective": args.objective, "memory_limit": args.memory_limit, "quality": args.quality,
             "techniques": args.techniques, "budget": args.budget}
    budget = {"train_steps": args.steps, "max_train_seconds": args.seconds, "min_steps": args.window_steps,
              "min_seconds": args.window_seconds, "timeout_s": args.timeout}
    overrides = {"workloads": args.workloads, "models": args.model, "blocks": args.blocks,
                 "technique_plugins": args.technique, "seed": args.seed, "device": args.device,
                 "threads": args.threads, "nproc": args.nproc,
                 "budget": {k: v for k, v in budget.items() if v is not None} or None}
    return tune_setup.setup(given, overrides, preset=args.preset, config_path=args.config, out_dir=args.out,
                            resume=args.resume, max_repeats=args.max_repeats)


def _tune(args: argparse.Namespace) -> int:
    from bench.run import workflow

    t = _setup(args)
    if args.dry_run:
        return _dry_run(t)
    started: list[workflow.Start] = []

    def banner(s: workflow.Start) -> None:
        started.append(s)
        _banner(t, s.out_dir)

    try:
        done = workflow.tune(t, args.out, resume=args.resume, command=command_line(args), on_start=banner,
                             on_progress=_print_progress)
    except KeyboardInterrupt as exc:  # the workflow wrote the partial result
        if not started:
            raise
        out_dir = started[0].out_dir
        err.print(f"[yellow]{interrupted_word(exc)}[/]: finished trials are saved in {out_dir}/results.jsonl; "
                  f"continue with: python -m bench tune --resume --out {out_dir}")
        return interrupted_code(exc)
    return _finish(done)


def _banner(t: Setup, out_dir: Path) -> None:
    from bench.core.text import size_text

    s = t.settings
    limits = (f", memory limit {size_text(t.limit)}" if t.limit else "") + (
        f", budget {t.opts['budget']:g} s" if t.opts["budget"] else "")
    err.print(f"[bold]trainbench[/] tune {s.workload.label} on {t.device} ({s.objective}{limits}, "
              f"quality {s.quality.label}): {len(s.singles)} candidates, "
              f"{len(s.not_tried)} not tried -> {out_dir}")


def _print_progress(p: Progress) -> None:
    err.print(progress_text(p.trial.trial_id, p.record), markup=False, highlight=False)


def _finish(done: TuneResult) -> int:
    """Print the recommendation and the files the workflow wrote; the exit code."""
    from bench.core.text import size_text
    from bench.run import tune

    _print_result(done.result, done.snippets)
    for path in done.written:
        out.print(f"wrote {path}", markup=False, highlight=False)
    step, settings = done.step, done.settings
    if step.recommended is None:
        peak = step.smallest_peak
        if peak is not None:
            print(f"error: no measured set fits under --memory-limit {size_text(settings.memory_limit)}: the "
                  f"smallest peak found is {size_text(peak[1])} ({peak[2]}) of {peak[0]}", file=sys.stderr)
            return tune.EXIT_INFEASIBLE
        print(f"error: {one_line(step.stop)}", file=sys.stderr)
        return tune.EXIT_NOTHING
    return 0


def _print_result(result: dict[str, Any], snippets: str) -> None:
    from bench.report.tune import SNIPPET_HEADING

    if result["recommended"]:
        out.print(f"recommended: {result['recommended']} ({result['stop']})", markup=False, highlight=False)
        for against, c in result["comparisons"].items():
            role = "runner-up " if against == result["runner_up"] else ""
            out.print(f"  against the {role}{against}: speed {c['speed']}; memory {c['memory']}; quality "
                      f"{c['quality']}" + (f"; time to target {c['time_to_target']}" if "time_to_target" in c else ""),
                      markup=False, highlight=False)
    out.print(f"search: {result['trials']} trials, {result['trial_time_s']:.0f} s of trial time, "
              f"{len(result['trace'])} steps in the trace (tune.md)", markup=False, highlight=False)
    for n in result["not_tried"][:20]:
        out.print(f"  not tried: {n['set']}: {one_line(n['why'], 160)}", markup=False, highlight=False)
    if len(result["not_tried"]) > 20:
        out.print(f"  ... and {len(result['not_tried']) - 20} more (tune.md)", markup=False, highlight=False)
    if snippets:
        out.print(f"\n{SNIPPET_HEADING}:\n\n{snippets}", markup=False, highlight=False)


def _dry_run(t: Setup) -> int:
    """The plan: the candidates, what is not tried and why, the size of the exhaustive space and its sweep."""
    from bench.core.text import size_text
    from bench.run import tune

    settings = t.settings
    out.print(f"tune {settings.workload.label}: objective {settings.objective}, quality {settings.quality.label}, "
              f"memory limit {size_text(settings.memory_limit) if settings.memory_limit else 'none'}, world "
              f"size {settings.world_size}, cap {settings.cap}", markup=False, highlight=False)
    out.print(f"candidates ({len(settings.singles)}): " + (", ".join(f"{s.label} ({t.kinds[s.label]})"
                                                                     for s in settings.singles) or "none"),
              markup=False, highlight=False)
    for label, why in settings.not_tried:
        out.print(f"  not tried: {label}: {one_line(why, 200)}", markup=False, highlight=False)
    space, cut = tune.exhaustive(settings.singles, t.refuse)
    more = "more than " if cut else ""
    out.print(f"exhaustive space: {more}{len(space)} sets the planner accepts (and the baseline); the search measures "
              f"{len(settings.singles)} singles first, then at most one stage per technique added", markup=False,
              highlight=False)
    if space and not cut and len(space) <= 512:
        out.print("the exhaustive sweep of the same candidates: python -m bench sweep --workloads "
                  f"{settings.workload.label} --techniques {','.join(s.label for s in space)} --mode speed "
                  f"--repeats auto --max-repeats {settings.cap}"
                  + (f" --nproc {settings.world_size}" if settings.world_size > 1 else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 0
