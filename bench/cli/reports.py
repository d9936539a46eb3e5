"""``bench compare``, ``bench report`` and ``bench export``: reading sweep directories. Unusable input
(``InputError``, ``CompareError``) reaches ``bench.cli.main`` as one line and exit code 2."""

from __future__ import annotations

import argparse
import logging

from bench.analyze import cost
from bench.cli.common import err, out
from bench.core.files import write_atomic


def cmd_compare(args: argparse.Namespace) -> int:
    from bench.analyze import compare as compare_mod
    from bench.records.reader import blocking_file
    from bench.report import compare as compare_md

    threshold = compare_mod.parse_threshold(args.threshold)
    fail_on = compare_mod.parse_fail_on(args.fail_on)
    comp = compare_mod.compare_dirs(args.base, args.new, threshold)
    md = compare_md.to_markdown(comp, title=f"Compare {args.new} against {args.base}")
    if args.out:
        blocker = blocking_file(args.out.parent)
        if blocker is not None:
            raise compare_mod.CompareError(f"cannot write {args.out}: {blocker} is a file, not a directory")
        try:  # whole or not at all: a CI step may read it while another writes
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.out, md)
        except OSError as exc:  # a directory, a path under a file, unwritable: exit 2 through main
            raise compare_mod.CompareError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    out.print(md, markup=False, highlight=False)
    failing = comp.failing(fail_on)
    if failing:
        for key, why in failing:
            err.print(f"regression: {key.label}: {', '.join(sorted(why))}", markup=False, highlight=False)
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from bench.analyze.analysis import Thresholds
    from bench.analyze.compare import parse_threshold
    from bench.report import parse_formats, write_report

    price = cost.resolve(args.price_per_hour, args.instance)  # an unknown instance: one line, exit 2 (main)
    thresholds = Thresholds(speed=parse_threshold(args.threshold))
    paths = write_report(args.dirs, out_dir=args.out, baseline=args.baseline, formats=parse_formats(args.format),
                         thresholds=thresholds, price=price)
    for path in paths.values():
        out.print(f"report: {path}", markup=False, highlight=False)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from bench.report.exporters import export

    if args.to == "mlflow" and not args.verbose:  # MLflow and its migrations log each step at INFO
        try:
            import mlflow  # noqa: F401  (its import sets its loggers' levels: lower them after it)
        except ImportError:
            pass  # export() says which extra to install
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
    done = export(args.dirs, args.to, args.out)
    news = f" ({done.created} new, {done.updated} updated)" if args.to in ("mlflow", "tensorboard") else ""
    out.print(f"{args.to}: {done.trials} trials{news} -> {done.where}", markup=False, highlight=False)
    out.print(f"view with: {done.view}", markup=False, highlight=False)
    return 0
