"""The sequential phase of a ``--repeats auto`` sweep: speed-only pairs where a verdict is still open.

After the planned trials (``repeats`` full trials per configuration), the runner asks ``next_round`` for more, round
after round, until no configuration is open, the cap is reached or the time budget is spent:

- **Open** configurations are read off the records by the analysis itself (``bench.analyze.analysis.configurations``, the
  repeated intervals of the sweep's sequential design): a speed or memory verdict that is inconclusive (or has
  fewer pairs than a verdict needs) with fewer than ``max_repeats`` pairs.
- **Most informative first**: the configurations closest to a decision (the fewest pairs ``needed`` at the spread
  seen) go first. Those the cap could not decide even on an optimistic reading get none in a sweep (``next_round``:
  futility stopping, ``bench.analyze.sequential.futile``; it can only turn a would-be verdict into "inconclusive",
  never make a false one): on the default quick sweep they were near-1 effects that stayed inconclusive after every
  pair the cap allowed. A larger ``--max-repeats`` makes room for them. ``sweep --ab`` keeps giving them pairs, last
  (a regression gate also reads the overall verdict, which pools its configurations).
- **Speed-only, paired, ABBA**: each round adds one trial of every chosen configuration beside one trial of its
  workload's reference set, with the same seed (the speed window does not depend on the weights, and a seed the
  sweep already has reuses its cached parity reference); the order alternates between rounds (reference first, then
  last), so the machine's drift within a round hits both sides of a pair alike. The quality run is deterministic for
  a seed and is not repeated.
- **The budget** (``--decide-within``, default half the wall time the planned trials took) is shared by the open
  configurations and counted from the records' own wall times, so a resumed sweep keeps what it spent.

``sweep --ab --repeats auto`` (``bench.run.ab``) applies the same rules to the verdicts of B against A, through the
helpers below (``open_of``, ``informative_first``, ``next_repeat``, ``speed_trial``, ``trial_cost``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.analyze import analysis, stats
from bench.plan.config import SweepConfig, TechniqueSet, WorkloadSpec
from bench.plan.planner import Trial, trial_id
from bench.records.frame import records_frame
from bench.records.results import TrialRecord

log = logging.getLogger(__name__)

ADDED_BY = "sequential"
PLANNED_SPEED_SHARE = 0.5  # before a configuration's first speed-only trial: a full (speed and quality) trial's share
BUDGET_SHARE = 0.5  # --decide-within's default: this share of the planned trials' wall time


@dataclass(frozen=True)
class Open:
    """A configuration whose speed or memory verdict is still open."""

    workload: WorkloadSpec
    techniques: TechniqueSet
    world_size: int
    pairs: int  # the pairs its open verdicts are read from now
    needed: int | None  # about how many pairs would decide it at the spread seen (None: unknown)
    what: str  # "speed", "memory" or "speed and memory"
    cost_s: float  # the estimated wall time of one more speed-only trial of it
    futile: bool = False  # every open verdict is futile (bench.analyze.sequential.futile): the cap cannot decide it


def budget_s(cfg: SweepConfig, records: list[TrialRecord]) -> float:
    """The sequential phase's time budget: ``decide_within``, or a share of the planned trials' wall time."""
    if cfg.decide_within is not None:
        return float(cfg.decide_within)
    return BUDGET_SHARE * sum(r.wall_s or 0.0 for r in records if r.added_by is None)


def spent_s(records: list[TrialRecord]) -> float:
    return sum(r.wall_s or 0.0 for r in records if r.added_by == ADDED_BY)


def labelled(cfg: SweepConfig) -> tuple[dict[str, WorkloadSpec], dict[str, TechniqueSet]]:
    """The sweep's workloads and technique sets (the baseline among them) by label."""
    return {w.label: w for w in cfg.workloads}, {t.label: t for t in (*cfg.techniques, TechniqueSet(()))}


def exhausted(cfg: SweepConfig, n_trials: int) -> bool:
    """Whether a configuration has had as many trials as the cap allows pairs: then it gets no more, even when some
    failed or stayed contended (trials that keep failing must not keep the rounds going)."""
    return n_trials >= cfg.max_repeats


def open_configurations(cfg: SweepConfig, records: list[TrialRecord]) -> list[Open]:
    """The configurations of ``cfg`` whose speed or memory verdict is open, the most informative first."""
    frame = records_frame(records, max_looks=cfg.max_repeats)
    if frame.empty or analysis.BASELINE not in set(frame["technique"]):
        return []
    workloads, sets = labelled(cfg)
    found: list[Open] = []
    for c in analysis.configurations(frame).itertuples():
        if c.is_reference or not c.n_ok or c.workload not in workloads or c.technique not in sets:
            continue
        if exhausted(cfg, int(c.n_total)):
            continue
        # across unequal resources the speed answer is the one per core or device (the analysis's)
        speed = "speedup_per_unit" if getattr(c, "resource_unit", None) else "speedup"
        verdicts = [(name, getattr(c, f"{prefix}_verdict"), getattr(c, f"{prefix}_n"),
                     getattr(c, f"{prefix}_needed", None), bool(getattr(c, f"{prefix}_futile", False)))
                    for name, prefix in (("speed", speed), ("memory", "mem_ratio"))]
        found += open_of(verdicts, cfg.max_repeats, workloads[c.workload], sets[c.technique],
                         int(c.world_size or 1), trial_cost(records, c.workload, c.technique))
    return informative_first(found)


def open_of(verdicts: list[tuple[str, str | None, Any, Any, bool]], max_repeats: int, workload: WorkloadSpec,
            techniques: TechniqueSet, world_size: int, cost_s: float) -> list[Open]:
    """``[Open]`` when any of ``verdicts`` = [(what, verdict word, pairs, pairs needed, futile), ...] is still open:
    undecided (inconclusive, or no verdict for want of pairs) with fewer than ``max_repeats`` pairs; else ``[]``. The
    pairs it needs: the inconclusive verdict's estimate, or the fewest that give a verdict; None when more than the
    cap. It is futile when every open verdict is."""
    what, pairs, needed, futile = [], [], [], []
    for name, word, n, want, hopeless in verdicts:
        if n is None or word is None or word not in stats.UNDECIDED or n >= max_repeats:
            continue
        what.append(name)
        pairs.append(int(n))
        futile.append(hopeless)  # only an inconclusive verdict can be futile (stats.verdict)
        want = want if word == stats.INCONCLUSIVE else stats.MIN_REPEATS
        needed.append(int(want) if want is not None and not math.isnan(want) and want <= max_repeats else None)
    if not what:
        return []
    known = [x for x in needed if x is not None]
    return [Open(workload, techniques, world_size, min(pairs), min(known) if known else None, " and ".join(what),
                 cost_s, all(futile))]


def informative_first(found: list[Open]) -> list[Open]:
    """The closest to a decision first (the fewest pairs needed); those the cap leaves no room for, then the futile,
    last."""
    return sorted(found, key=lambda o: (o.futile, o.needed is None, o.needed or 0, o.pairs))


def next_repeat(records: list[TrialRecord], workload: str) -> int:
    """The repeat number of a workload's next speed-only round: one past every repeat it has recorded."""
    return 1 + max((r.repeat for r in records if r.workload_label == workload), default=-1)


def speed_trial(cfg: SweepConfig, workload: WorkloadSpec, techniques: TechniqueSet, world_size: int, repeat: int,
                position: int) -> Trial:
    """A speed-only trial of the sequential phase. Its seed is one the sweep has (``repeat % repeats``), so its
    parity reference is cached; its id is the planned form with ``/speed``, so it never collides with a planned one."""
    seed = cfg.seed + repeat % cfg.repeats
    return Trial(trial_id=trial_id(workload, techniques, seed, repeat, world_size) + "/speed", workload=workload,
                 techniques=techniques, seed=seed, repeat=repeat, world_size=world_size, position=position,
                 mode="speed", added_by=ADDED_BY)


def trial_cost(records: list[TrialRecord], workload: str, technique: str) -> float:
    """The estimated wall time of one more speed-only trial of this configuration: the median of the speed-only
    trials it has, those the sequential phase added first, then planned trials that were speed-only already (a
    ``--mode speed`` sweep: the same stages as an added one), those that found their compile cache warm first (as
    an added trial will); else a share of its full trials' (a quality run is most of a full trial)."""
    mine = [r for r in records if r.workload_label == workload and r.technique_label == technique
            and r.status == "ok" and r.wall_s]
    added = [r.wall_s for r in mine if r.added_by == ADDED_BY]
    if added:
        return float(np.median(added))
    speed_only = [r for r in mine if r.mode == "speed"]
    if speed_only:
        warm = [r.wall_s for r in speed_only if (r.caches or {}).get("inductor") == "warm"]
        return float(np.median(warm or [r.wall_s for r in speed_only]))
    full = [r.wall_s for r in mine]
    return PLANNED_SPEED_SHARE * float(np.median(full)) if full else 0.0


def next_round(cfg: SweepConfig, records: list[TrialRecord], budget_left: float) -> list[Trial]:
    """The next round of speed-only trials (empty: nothing open, or no budget left for the most informative)."""
    chosen: dict[WorkloadSpec, list[Open]] = {}
    cost = 0.0
    for o in open_configurations(cfg, records):
        if o.futile:  # futility stopping: its pairs are better spent elsewhere, or not at all
            log.info("sequential phase: %s %s could not be decided within the cap of %d pairs even on an optimistic "
                     "reading; none added (a larger --max-repeats makes room)", o.workload.label, o.techniques.label,
                     cfg.max_repeats)
            continue
        extra = o.cost_s + (0.0 if o.workload in chosen else trial_cost(records, o.workload.label,
                                                                         analysis.BASELINE))
        if cost + extra > budget_left:
            continue  # a cheaper configuration further down may still fit
        chosen.setdefault(o.workload, []).append(o)
        cost += extra
    if not chosen:
        return []
    rounds = {r.repeat for r in records if r.added_by == ADDED_BY}
    reference_first = len(rounds) % 2 == 0  # ABBA across rounds
    trials: list[Trial] = []
    for workload, opens in chosen.items():
        repeat = next_repeat(records, workload.label)
        sides = [(TechniqueSet(()), 1), *((o.techniques, o.world_size) for o in opens)]
        for techs, world in (sides if reference_first else sides[::-1]):
            trials.append(speed_trial(cfg, workload, techs, world, repeat, len(records) + len(trials)))
    log.info("sequential round: %d speed-only trials for %s", len(trials),
             ", ".join(f"{w.label} {o.techniques.label} ({o.what}, {o.pairs} pairs)" for w, os_ in chosen.items()
                       for o in os_))
    return trials
