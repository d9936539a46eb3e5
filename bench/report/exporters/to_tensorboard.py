"""Trials as TensorBoard runs: one event file per trial under ``OUT/<sweep id>/<trial id>/``.

Each run holds the quality run's curves ``train/loss`` and ``eval/<metric>`` against the samples trained (the same
x for every technique set of a workload), stamped with the trial's start plus its training clock; the
single-number results (``TrialView.metrics``: samples/s, step times of the speed window, peak memory, MFU, final
metric, time-to-target, ...) as scalars at step 0; and the trial's parameters with those numbers in the HParams
dashboard, where the trials of a sweep line up as one table. Written with ``torch.utils.tensorboard``; a second
export of the same sweep replaces each trial's event file, so no point appears twice.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from bench.core.errors import ConfigError
from bench.report.exporters import Exported
from bench.report.exporters.trials import TrialView

log = logging.getLogger(__name__)

EVENT_FILES = "events.out.tfevents.*"


def run_dir(root: Path, view: TrialView) -> Path:
    """``ROOT/<sweep id>/<trial id>`` with the id's ':' turned into '-' (and anything odd into '_'), its '/'s kept
    as subdirectories, so TensorBoard's run selector groups by workload and technique set."""
    parts = [view.sweep_id, *view.record.trial_id.split("/")]
    return root.joinpath(*(re.sub(r"[^A-Za-z0-9._=+,-]", "_", p.replace(":", "-")) or "_" for p in parts))


def export(views: Sequence[TrialView], out: Path) -> Exported:
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"cannot write TensorBoard logs to {out}: {existing} is a file, not a directory")
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    created = updated = 0
    for view in views:
        where = run_dir(out, view)
        old = sorted(where.glob(EVENT_FILES)) if where.is_dir() else []
        for path in old:  # this trial's previous export: replaced, not added to
            path.unlink()
        created, updated = created + (not old), updated + bool(old)
        start = view.start_s
        metrics = view.metrics()
        with SummaryWriter(log_dir=str(where)) as writer:
            for name, points in view.curves().items():
                tag = "train/loss" if name == "train_loss" else f"eval/{name}"
                for samples, clock, value in points:
                    writer.add_scalar(tag, value, global_step=samples, walltime=start + clock)
            for name, value in metrics.items():
                writer.add_scalar(name, value, global_step=0, walltime=start)
            params = {k: _hparam(v) for k, v in view.params().items()}
            for summary in hparams(params, metrics):
                writer.file_writer.add_summary(summary, walltime=start)
    return Exported("tensorboard", str(out), len(views), created, updated, f"tensorboard --logdir {out}")


def _hparam(text: str) -> float | str:
    """A number where the parameter is one (the HParams table sorts and filters numbers as numbers)."""
    return float(text) if re.fullmatch(r"-?\d+(\.\d*)?([eE][-+]?\d+)?", text) else text
