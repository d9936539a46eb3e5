"""Time-budgeted continuations: the trials that give a faster set the training time its speed buys.

Quality at equal samples trains every set the same samples; quality at equal *time* asks what a set reaches in the
reference's training clock. A set whose quality run finished sooner than the reference's has trained less than
that clock allows, so its own curve cannot say: after a sweep's planned trials, each such run (a ``numeric`` or
``algorithmic`` set, a complete quality run, faster than the reference set's run of the same workload and seed in
the same sweep) gets one more trial that trains the same budget again (deterministic for a seed: the same curve) and
then trains on to the reference's clock (``bench.trial``, ``TrialSpec.train_until_s``). Its record carries
``continues`` (the original's trial id) and is kept out of every statistic but quality at equal time
(``bench.analyze.analysis``). Exact sets compute the baseline's math, so their curve at any clock is the baseline's curve
at fewer or more samples: they need none. A set whose technique cannot be continued past its planned budget
(``Technique.continuation_blocker``) or whose run a technique stopped gets a skipped trial with the reason, so the
report can say why, and a resumed sweep does not schedule it again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from bench.plan.config import SweepConfig, TechniqueSet
from bench.plan.planner import Trial
from bench.records.results import TrialRecord
from techniques.base import Context, Kind

log = logging.getLogger(__name__)

REFERENCE = "baseline"  # the technique label of the reference set every sweep plans
SUFFIX = "/continue"
CONTINUED_KINDS = (Kind.NUMERIC.value, Kind.ALGORITHMIC.value)


def continuation_id(trial_id: str) -> str:
    """The id of the trial continuing ``trial_id`` (an id, never parsed back: records carry ``continues``)."""
    return trial_id + SUFFIX


def continuation_trials(cfg: SweepConfig, records: Iterable[TrialRecord], done_ids: set[str]) -> list[Trial]:
    """One continuation trial per complete, faster numeric or algorithmic quality run of this sweep that has none
    recorded yet (``done_ids``), in the order the originals ran; blocked ones carry their ``skip_reason``."""
    planned = _latest_planned(records)
    references = {(r.workload_label, r.seed): r for r in planned.values()
                  if r.technique_label == REFERENCE and _complete(r)}
    workloads = {w.label: w for w in cfg.workloads}
    sets = {t.label: t for t in cfg.techniques}
    position = max((r.position for r in planned.values()), default=-1) + 1
    trials = []
    for r in sorted(planned.values(), key=lambda r: r.position):
        ref = references.get((r.workload_label, r.seed))
        new_id = continuation_id(r.trial_id)
        if (new_id in done_ids or r.kind not in CONTINUED_KINDS or not _complete(r) or ref is None
                or r.quality.train_time_s >= ref.quality.train_time_s):
            continue
        workload, techs = workloads.get(r.workload_label), sets.get(r.technique_label)
        if workload is None or techs is None:  # a record of another plan (resumed with other settings)
            log.info("no continuation for %s: its workload or set is not in this sweep's plan", r.trial_id)
            continue
        trials.append(Trial(
            trial_id=new_id, workload=workload, techniques=techs, seed=r.seed, repeat=r.repeat,
            world_size=r.world_size, skip_reason=blocker(r, techs), position=position + len(trials), mode="quality",
            train_until_s=ref.quality.train_time_s, continues=r.trial_id, added_by="continuation"))
    return trials


def blocker(record: TrialRecord, techs: TechniqueSet) -> str | None:
    """Why the run of ``record`` (of the set ``techs``) cannot be trained on past its budget, or None: a technique
    stopped it, or a technique of the set says so (``Technique.continuation_blocker`` on the planning context)."""
    if record.quality is not None and record.quality.stopped_by:
        return f"{record.quality.stopped_by}: a run a technique ended is complete where it stopped"
    instances = [spec.resolve() for spec in techs.specs]
    ctx = Context(device=torch.device(record.device or "cpu"), workload=record.workload.get("name", ""),
                  seed=record.seed, world_size=record.world_size, technique_names=techs.names,
                  metric=record.workload.get("metric") or "",
                  higher_is_better=bool(record.workload.get("higher_is_better", True)))
    reasons = [why for t in instances if (why := t.continuation_blocker(ctx))]
    return "; ".join(reasons) or None


def _latest_planned(records: Iterable[TrialRecord]) -> dict[str, TrialRecord]:
    """The planned trials (not continuations) by id, the last record of an id winning."""
    return {r.trial_id: r for r in records if r.continues is None}


def _complete(r: TrialRecord) -> bool:
    """An ok record whose quality run trained its whole budget (a run the safety cap cut is not compared)."""
    q = r.quality
    return r.status == "ok" and q is not None and q.cut is None and bool(q.curve) and q.continuation is None
