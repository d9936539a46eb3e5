"""Command line: ``python -m bench {sweep,list,report,compare,profile,env,export,tune,reproduce}``. The only package
that prints.

``parser`` holds the options; each command's module (``sweep``, ``tune``, ``profile``, ``reports``, ``info``,
``reproduce``) turns them into calls of its layer and prints what comes back. Bad input (unknown workload or
technique, bad option, malformed TOML, unusable records) gets one line on stderr naming what is valid, and exit code
2, here in ``main``.
Results already recorded are never lost: an interrupted sweep resumes with --resume.
"""

from __future__ import annotations

import logging
import sys

from bench import workloads
from bench.cli.common import (
    EXIT_USAGE,
    Terminated,
    interrupted_code,
    interrupted_word,
    one_line,
    progress_text,
)
from bench.cli.info import cmd_env, cmd_list
from bench.cli.parser import OBJECTIVE_NAMES, build_parser
from bench.cli.profile import cmd_profile
from bench.cli.reports import cmd_compare, cmd_export, cmd_report
from bench.cli.reproduce import cmd_reproduce
from bench.cli.sweep import cmd_sweep, sweep_config_from_args
from bench.cli.tune import cmd_tune
from bench.core.errors import ConfigError
from bench.records.reader import InputError
from bench.records.results import RecordError

COMMANDS = {"tune": cmd_tune, "profile": cmd_profile, "sweep": cmd_sweep, "list": cmd_list, "env": cmd_env,
            "compare": cmd_compare, "report": cmd_report, "export": cmd_export, "reproduce": cmd_reproduce}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded in env.json: how to reproduce this run
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:  # whole: the reader has cut what it echoes of the records already
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, workloads.WorkloadError, RecordError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)  # one line, never wrapped
        return EXIT_USAGE


__all__ = ["COMMANDS", "EXIT_USAGE", "OBJECTIVE_NAMES", "ConfigError", "InputError", "Terminated", "build_parser",
           "interrupted_code", "interrupted_word", "main", "one_line", "progress_text", "sweep_config_from_args"]
