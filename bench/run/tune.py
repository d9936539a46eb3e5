"""``python -m bench tune``: the best technique set for one model under a user's limits, found by search.

The search (docs/tune.md says why this one):

1. **Candidates**: the registry's techniques that run here, each with the option values its class offers the search
   (``Technique.tune_options``; ``--techniques`` restricts them), every one validated as a single set by the planner
   (``bench.plan.planner.incompatibility``, what a sweep skips); the refused ones are listed with their reasons.
2. **Singles first**: every candidate beside the baseline, in paired rounds.
3. **Greedy forward selection**: add each remaining technique to the current best set (only sets the planner
   accepts: slots, conflicts, checks, batch splits); keep the addition that helps most, and only when its verdict
   against the current best says it helps; stop when none does.
4. **Sequential stopping**: a stage is measured in rounds. A round runs the stage's reference (the baseline, then the
   current best), the baseline (so every set is paired with it), and every candidate still open, each once, with
   one seed and repeat shared by the round (ABBA order from round to round). After each round a candidate's verdict
   against the reference is read off the repeated confidence interval of the sweep's sequential design
   (``bench.analyze.stats.verdict`` on ``bench.analyze.stats.ratio(..., max_looks=cap)``, ``bench.analyze.sequential``): a decided candidate
   (faster, slower, equivalent; for memory less / more; for time to target sooner / later) is closed and never
   measured again; so is one at the cap, one whose peak memory exceeds ``--memory-limit`` (after its first trial:
   tensor bytes repeat exactly) and one whose trial failed.
5. **Quality**: exact sets are the same by construction; a numeric or algorithmic set is checked (three quality runs
   beside the baseline's, seeds paired) only when it would become the current best, against ``--quality``.

Everything the search does is a deterministic function of the records so far (``next_step``): resuming re-derives
its state from ``results.jsonl`` and runs the trials the interrupted step lacked. The trials are sweep trials (one
process each, through the sweep's runner: ``search``, the same records in the same directory), so ``bench report``
renders the directory.

The options and the setup (flags, or a resumed directory's ``tune.toml``, resolved to ``Settings``) are
``bench.run.tune_setup``'s; tune.md, its figure and the snippets are rendered from ``result_dict`` by
``bench.report.tune``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bench.analyze import pairs, stats
from bench.core import words
from bench.core.files import write_atomic
from bench.core.text import shown, size_text
from bench.core.words import say
from bench.plan.config import ConfigError, TechniqueSet, TechniqueSpec, WorkloadSpec
from bench.plan.planner import Trial, trial_id, world_size_for
from bench.records.frame import records_frame
from bench.records.results import TrialRecord
from bench.report import cells

if TYPE_CHECKING:
    from bench.run.runner import Progress, SweepRunner

log = logging.getLogger(__name__)

ADDED_BY = "tune"
BASELINE = TechniqueSet(())
QUALITY_SEEDS = 3  # quality runs per checked set (bench.analyze.stats.MIN_REPEATS: the fewest that give a verdict)
FIRST_ROUND_REPEAT = QUALITY_SEEDS  # rounds use repeats from here on; quality runs use 0 .. QUALITY_SEEDS - 1
EXIT_INFEASIBLE = 2  # no measured set fits under --memory-limit (documented in docs/tune.md)
EXIT_NOTHING = 1  # the reference could not be measured, so nothing could be compared
MAX_ENUMERATED = 2_000  # the exhaustive space is counted up to this many sets (--dry-run)


# ---- options --------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """``"512MiB"``, ``"8GiB"``, ``"1.5GB"``, ``"2000000"`` (bytes) -> bytes. Binary (KiB, MiB, GiB, TiB, and the bare
    K, M, G, T) and decimal (kB, MB, GB, TB) units; bad input is a ConfigError naming the valid forms."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ConfigError(f"--memory-limit {shown(text)}: give a size such as 512MiB, 8GiB, 1.5GB or a number of "
                          "bytes (units B, KiB, MiB, GiB, TiB, K, M, G, T binary; kB, MB, GB, TB decimal)")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"--memory-limit {shown(text)}: the limit must be at least 1 byte")
    return int(value)


@dataclass(frozen=True)
class Quality:
    """``--quality``: ``same`` (give up nothing: a numeric or algorithmic set must be shown equivalent at a margin of
    0, or better), ``within=X`` (equivalent within X of the metric, or better), ``any`` (not checked)."""

    rule: str = "same"
    margin: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Quality:
        raw = str(text).strip()
        if raw in ("same", "any"):
            return cls(raw, 0.0)
        key, sep, value = raw.partition("=")
        if key == "within" and sep:
            try:
                margin = float(value)
            except ValueError:
                margin = math.nan
            if math.isfinite(margin) and margin >= 0:
                return cls("within", margin)
        raise ConfigError(f"--quality {shown(text)}: give same, any, or within=X with X >= 0 in the metric's units "
                          "(e.g. within=0.01)")

    @property
    def label(self) -> str:
        return f"within={self.margin:g}" if self.rule == "within" else self.rule


@dataclass(frozen=True)
class Objective:
    """What the search maximises, read as a ratio candidate / reference with the engine's verdict words."""

    name: str
    higher_is_better: bool
    threshold: float
    words: tuple[str, str]  # stats.verdict's (higher, lower)
    mode: str  # what a round's trials measure
    quantity: str  # what is compared, as the report pairs it (bench.analyze.pairs)

    @property
    def better(self) -> str:
        return self.words[0] if self.higher_is_better else self.words[1]

    @property
    def worse(self) -> str:
        return self.words[1] if self.higher_is_better else self.words[0]


OBJECTIVES = {
    "throughput": Objective("throughput", True, stats.THRESHOLDS["speed"], ("faster", "slower"), "speed",
                            pairs.THROUGHPUT),
    "time-to-target": Objective("time-to-target", False, stats.THRESHOLDS["time_to_target"], ("later", "sooner"),
                                "both", pairs.TIME_TO_TARGET),
    "memory": Objective("memory", False, stats.THRESHOLDS["memory"], ("more", "less"), "speed", pairs.PEAK_MEMORY),
}


def objective_of(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise ConfigError(f"--objective {shown(name)}: give one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]


@dataclass(frozen=True)
class Settings:
    """What the search is a function of (besides the records): written to ``tune.json``'s ``settings``."""

    workload: WorkloadSpec
    singles: tuple[TechniqueSet, ...]
    objective: str = "throughput"
    memory_limit: int | None = None
    quality: Quality = field(default_factory=Quality)
    cap: int = 8  # pairs per comparison at most (the sequential design's cap)
    budget_s: float | None = None  # trial wall time the whole search may spend (None: no limit)
    seed: int = 0
    world_size: int = 1
    not_tried: tuple[tuple[str, str], ...] = ()  # (candidate, why it was not offered), from the candidate list

    @property
    def goal(self) -> Objective:
        return objective_of(self.objective)


Refuse = Callable[[TechniqueSet], str | None]  # why the planner would refuse a set (None: it would run it)


# ---- candidates -----------------------------------------------------------------------------------------------


def candidate_singles(workload: WorkloadSpec, refuse: Refuse, restrict: Sequence[TechniqueSet] | None = None
                      ) -> tuple[list[TechniqueSet], list[tuple[str, str]]]:
    """The single-technique sets the search starts from, and those it does not try with the reason (refused by the
    planner here: missing hardware, --nproc, a package, the model's structure)."""
    import techniques

    offered: list[TechniqueSet] = []
    if restrict is not None:
        for s in restrict:
            if len(s.specs) > 1:
                raise ConfigError(f"--techniques {shown(s.label)}: give single techniques (with options); tune "
                                  "combines them itself")
            if s.specs:
                offered.append(s)
    skipped: list[tuple[str, str]] = []
    if restrict is None:
        for name, cls in sorted(techniques.registry().items()):
            if name == "baseline":
                continue
            if not cls.tune_options:
                skipped.append((name, "not offered to the search by default (name it in --techniques to try it)"))
            for options in cls.tune_options:
                offered.append(TechniqueSet((TechniqueSpec.parse(f"{name}:{options}" if options else name),)))
    singles = []
    for s in dict.fromkeys(offered):
        reason = refuse(s)
        if reason:
            skipped.append((s.label, reason.removeprefix(f"{s.names[0]}: ")))  # the planner names the technique
        else:
            singles.append(s)
    return singles, skipped


def combined(base: TechniqueSet, add: TechniqueSet) -> TechniqueSet:
    """``base`` with ``add``'s technique, in a canonical order (by name), so one set has one label."""
    return TechniqueSet(tuple(sorted((*base.specs, *add.specs), key=lambda s: s.name)))


def exhaustive(singles: Sequence[TechniqueSet], refuse: Refuse, limit: int = MAX_ENUMERATED
               ) -> tuple[list[TechniqueSet], bool]:
    """The combinations of the candidates (one option value per technique) the planner accepts, baseline excluded,
    grown one technique at a time from accepted sets (a slot or a conflict refuses every superset too), up to
    ``limit`` sets; the flag says whether the enumeration was cut."""
    names = sorted({s.names[0] for s in singles})
    by_name = {n: [s for s in singles if s.names[0] == n] for n in names}
    found: list[TechniqueSet] = []
    level: list[tuple[int, TechniqueSet]] = []
    for i, n in enumerate(names):
        for s in by_name[n]:
            if refuse(s) is None:
                found.append(s)
                level.append((i, s))
    while level:
        grown = []
        for last, techs in level:
            for j in range(last + 1, len(names)):
                for s in by_name[names[j]]:
                    if len(found) >= limit:
                        return found, True
                    bigger = combined(techs, s)
                    if refuse(bigger) is None:
                        found.append(bigger)
                        grown.append((j, bigger))
        level = grown
    return found, False


# ---- reading records ------------------------------------------------------------------------------------------


def peak_of(r: TrialRecord) -> tuple[int | None, str]:
    """A trial's peak memory and where it comes from: the tensor-level peak (CUDA: the allocator's) when measured,
    else the process's peak RSS (compiled sets hide their tensors from the tracker)."""
    m = r.memory
    if m is None:
        return None, ""
    if m.peak_bytes is not None:
        return int(m.peak_bytes), "tensors"
    if m.peak_rss_bytes is not None:
        return int(m.peak_rss_bytes), "RSS"
    return None, ""


def set_peak(records: Sequence[TrialRecord]) -> tuple[int | None, str]:
    """A set's peak over its ok trials: the largest tensor peak when every trial has one, else the largest RSS."""
    ok = [r for r in records if r.status == "ok" and r.memory is not None]
    if not ok:
        return None, ""
    if all(r.memory.peak_bytes is not None for r in ok):
        return max(int(r.memory.peak_bytes) for r in ok), "tensors"
    rss = [r.memory.peak_rss_bytes for r in ok if r.memory.peak_rss_bytes is not None]
    return (max(int(x) for x in rss), "RSS") if rss else (None, "")


def compare(mine: pd.DataFrame, ref: pd.DataFrame, goal: Objective, cap: int
            ) -> tuple[stats.Estimate, stats.Verdict]:
    """The candidate's ratio to the reference on the objective, from their trials' rows of the records' frame
    (``bench.records.frame``), with the sequential design's repeated interval (a round is a look, whatever the
    objective) and the engine's verdict. The samples are the report's (``bench.analyze.pairs``): the search's trials
    are one directory, paired by (seed, repeat)."""
    p = pairs.pair(mine, ref, goal.quantity)
    a, b = p.mine, p.ref
    a_miss, b_miss = p.misses
    if a_miss or b_miss:
        est = stats.ratio(a, b, cap) if a and b else stats.Estimate(None, None, None, 0, False, True, "no values")
        return est, stats.Verdict(stats.NONE, f"missed the target in {a_miss} of the candidate's and {b_miss} of "
                                              "the reference's runs: no ratio of times")
    est = stats.ratio(a, b, cap)
    return est, stats.verdict(est, goal.threshold, *goal.words)


def gain(value: float | None, goal: Objective) -> float:
    """How much better a ratio is, higher is better whatever the objective (None: worst)."""
    if value is None or not math.isfinite(value) or value <= 0:
        return -math.inf
    return value if goal.higher_is_better else 1.0 / value


def quality_values(rows: pd.DataFrame) -> tuple[dict[Any, float], bool | None, str | None]:
    """{key: final metric} of the complete quality runs among a set's trials' rows (``bench.analyze.pairs``), the
    metric's direction and name."""
    runs = pairs.quality_runs(rows)
    if runs.empty:
        return {}, None, None
    return pairs.values(runs, "final"), runs["higher_is_better"].iloc[-1], runs["metric"].iloc[-1]


# ---- the search ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """How the search left one measured set."""

    label: str
    stage: int
    reference: str
    status: str  # a verdict word, "infeasible", "failed", "inconclusive at the cap", "budget", "reference failed"
    estimate: float | None = None
    lo: float | None = None
    hi: float | None = None
    pairs: int = 0
    why: str | None = None
    peak: int | None = None
    peak_source: str = ""
    quality: str | None = None  # "same (exact)", "passed: equivalent ...", "failed: ...", None: not checked


@dataclass
class Step:
    """What ``next_step`` found: the trials to run next (``pending``), or the finished search (``done``)."""

    pending: list[Trial]
    trace: list[dict[str, Any]]
    done: bool = False
    recommended: str | None = None
    runner_up: str | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    not_tried: list[tuple[str, str]] = field(default_factory=list)
    stop: str = ""  # why the search ended
    smallest_peak: tuple[str, int, str] | None = None  # (set, bytes, source) when nothing fits
    spent_s: float = 0.0
    stages: list[dict[str, Any]] = field(default_factory=list)


class _Pending(Exception):
    def __init__(self, trials: list[Trial]) -> None:
        super().__init__(f"{len(trials)} trials to run")
        self.trials = trials


class _Replay:
    """The search, replayed over the records: each measurement it asks for is looked up by trial id, and the first
    one missing stops the replay with the trials to run (``_Pending``)."""

    def __init__(self, settings: Settings, records: Sequence[TrialRecord], refuse: Refuse) -> None:
        self.s = settings
        self.goal = settings.goal
        self.by_id = {r.trial_id: r for r in records}
        # The records as the report frames them, once: a comparison reads its trials' rows (bench.analyze.pairs).
        self.frame = records_frame(list(self.by_id.values()), max_looks=settings.cap).set_index("trial_id",
                                                                                                  drop=False)
        self.refuse = refuse
        self.used: list[TrialRecord] = []
        self.used_ids: set[str] = set()
        self.position = 0
        self.round = 0
        self.trace: list[dict[str, Any]] = []
        self.outcomes: dict[str, Outcome] = {}
        self.quality: dict[str, tuple[bool, str]] = {}
        self.not_tried: list[tuple[str, str]] = list(settings.not_tried)
        self.stages: list[dict[str, Any]] = []

    # ---- measuring ----------------------------------------------------------------------------------------

    def note(self, stage: int, what: str, label: str = "", detail: str = "") -> None:
        self.trace.append({"n": len(self.trace) + 1, "stage": stage, "what": what, "set": label, "detail": detail,
                           "spent_s": round(self.spent(), 1)})

    def spent(self) -> float:
        return float(sum(r.wall_s or 0.0 for r in self.used))

    def trial(self, techs: TechniqueSet, seed: int, repeat: int, mode: str) -> Trial:
        world = world_size_for(techs, self.s.world_size)
        tid = trial_id(self.s.workload, techs, seed, repeat, world) + ("/speed" if mode == "speed" else "")
        t = Trial(trial_id=tid, workload=self.s.workload, techniques=techs, seed=seed, repeat=repeat,
                  world_size=world, position=self.position, mode=mode, added_by=ADDED_BY)
        self.position += 1
        return t

    def measure(self, trials: list[Trial]) -> list[TrialRecord]:
        missing = [t for t in trials if t.trial_id not in self.by_id]
        if missing:
            raise _Pending(missing)
        got = [self.by_id[t.trial_id] for t in trials]
        for r in got:
            if r.trial_id not in self.used_ids:
                self.used_ids.add(r.trial_id)
                self.used.append(r)
        return got

    def of(self, techs: TechniqueSet) -> list[TrialRecord]:
        return [r for r in self.used if r.technique_label == techs.label]

    def rows(self, records: Sequence[TrialRecord]) -> pd.DataFrame:
        """The rows of ``records`` in the records' frame."""
        return self.frame.loc[[r.trial_id for r in records]]

    def cost(self, techs: TechniqueSet, mode: str) -> float:
        """The expected wall time of one more trial: the median of the set's trials in this mode, else of all the
        search's trials in this mode, else 0 (nothing known yet)."""
        mine = [r.wall_s for r in self.of(techs) if r.wall_s and r.mode == mode]
        every = [r.wall_s for r in self.used if r.wall_s and r.mode == mode]
        return float(np.median(mine or every)) if (mine or every) else 0.0

    def affordable(self, cost: float) -> bool:
        return self.s.budget_s is None or self.spent() + cost <= self.s.budget_s

    # ---- the parts --------------------------------------------------------------------------------------

    def kind(self, techs: TechniqueSet) -> str:
        from techniques.base import set_kind

        return set_kind(s.resolve() for s in techs.specs).value

    def feasible(self, techs: TechniqueSet) -> bool:
        if self.s.memory_limit is None:
            return True
        peak, _ = set_peak(self.of(techs))
        return peak is not None and peak <= self.s.memory_limit

    def quality_ok(self, techs: TechniqueSet, stage: int) -> bool:
        """Whether ``techs`` meets ``--quality`` (quality runs made on demand: may raise ``_Pending``)."""
        if techs.label in self.quality:
            return self.quality[techs.label][0]
        if self.s.quality.rule == "any":
            return True
        if self.kind(techs) == "exact":
            self.quality[techs.label] = (True, "same (exact: the same math as the baseline)")
            return True
        mine, _, _ = quality_values(self.rows(self.of(techs)))
        base, _, _ = quality_values(self.rows(self.of(BASELINE)))
        if len(set(mine) & set(base)) < QUALITY_SEEDS:
            trials = [t for i in range(QUALITY_SEEDS)
                      for t in (self.trial(BASELINE, self.s.seed + i, i, "both"),
                                self.trial(techs, self.s.seed + i, i, "both"))
                      if t.trial_id not in self.used_ids]
            cost = sum(self.cost(t.techniques, "both") for t in trials)
            if not self.affordable(cost):
                self.quality[techs.label] = (False, "not checked: the budget is spent")
                self.note(stage, "quality not checked", techs.label, "the budget left does not buy its quality runs")
                return False
            self.note(stage, "quality runs", techs.label, f"{QUALITY_SEEDS} seeds beside the baseline's "
                      f"({self.kind(techs)} set; --quality {self.s.quality.label})")
            self.measure(trials)
            mine, _, _ = quality_values(self.rows(self.of(techs)))
            base, _, _ = quality_values(self.rows(self.of(BASELINE)))
        _, hib, metric = quality_values(self.rows(self.of(BASELINE)))
        words = ("better", "worse") if hib is not False else ("worse", "better")
        est = stats.difference(mine, base)
        v = stats.verdict(est, self.s.quality.margin, *words)
        shown_est = (f"{metric} {est.value:+.4f} [{est.lo:+.4f}, {est.hi:+.4f}]" if est.has_interval
                     else f"{metric}: {v.why or 'no estimate'}")
        passed = v.word in ("better", stats.EQUIVALENT)
        text = f"{'passed' if passed else 'failed'}: {say(v.word)} at margin {self.s.quality.margin:g} ({shown_est})"
        self.quality[techs.label] = (passed, text)
        self.note(stage, "quality " + ("passed" if passed else "failed"), techs.label, text)
        return passed

    def stage(self, index: int, reference: TechniqueSet, candidates: list[TechniqueSet]) -> dict[str, Outcome]:
        """Paired rounds of the reference, the baseline and the open candidates until each is closed."""
        mode = self.goal.mode
        open_ = list(candidates)
        recs: dict[str, list[TrialRecord]] = {t.label: [] for t in (reference, BASELINE, *candidates)}
        needed: dict[str, int | None] = {}
        out: dict[str, Outcome] = {}
        self.note(index, "stage", reference.label, f"{len(candidates)} candidate(s) against {reference.label}: "
                  + (", ".join(c.label for c in candidates) or "none (the reference is measured once)"))
        if not candidates:  # nothing to compare: the reference once, for its speed and peak
            repeat, seed = self.round_seed()
            self.measure([self.trial(reference, seed, repeat, mode)])
            self.round += 1
            return out
        j = 0
        while open_:
            repeat, seed = self.round_seed()
            fixed = [reference] + ([BASELINE] if reference != BASELINE else [])
            chosen = self.affordable_round(fixed, open_, needed)
            if not chosen:
                for c in open_:
                    out[c.label] = self.close(index, reference, c, recs, "budget", "the budget is spent")
                self.note(index, "budget spent", "", f"{len(open_)} candidate(s) left open")
                break
            sides = fixed + [c for c in open_ if c in chosen]
            trials = [self.trial(t, seed, repeat, mode) for t in (sides if j % 2 == 0 else sides[::-1])]
            got = self.measure(trials)
            self.round += 1
            j += 1
            for t, r in zip(trials, got, strict=True):
                recs[t.techniques.label].append(r)
            ref_rec = next(r for t, r in zip(trials, got, strict=True) if t.techniques == reference)
            if ref_rec.status != "ok":
                for c in open_:
                    out[c.label] = self.close(index, reference, c, recs, "reference failed",
                                              f"{reference.label}: {ref_rec.status}: {(ref_rec.reason or '')[:200]}")
                self.note(index, "reference failed", reference.label, f"{ref_rec.status}: {ref_rec.reason or ''}"[:300])
                break
            for c in chosen:
                outcome = self.judge(index, reference, c, recs, needed)
                if outcome is not None:
                    out[c.label] = outcome
                    open_.remove(c)
        return out

    def round_seed(self) -> tuple[int, int]:
        """The next round's repeat and seed (rounds of speed trials cycle through the quality runs' seeds)."""
        repeat = FIRST_ROUND_REPEAT + self.round
        return repeat, self.s.seed + (repeat if self.goal.mode == "both" else repeat % QUALITY_SEEDS)

    def affordable_round(self, fixed: list[TechniqueSet], open_: list[TechniqueSet], needed: dict[str, int | None]
                         ) -> list[TechniqueSet]:
        """The open candidates the budget left buys one more trial of, beside ``fixed``'s: those not judged yet and
        those closest to a decision (fewest pairs ``needed``) first, those whose verdict gives no such number last."""
        mode = self.goal.mode
        cost = sum(self.cost(t, mode) for t in fixed)
        chosen = []
        for c in sorted(open_, key=lambda c: (needed.get(c.label) is None and c.label in needed,
                                              needed.get(c.label) or 0)):
            extra = self.cost(c, mode)
            if self.affordable(cost + extra):
                chosen.append(c)
                cost += extra
        return chosen

    def judge(self, index: int, reference: TechniqueSet, c: TechniqueSet, recs: dict[str, list[TrialRecord]],
              needed: dict[str, int | None]) -> Outcome | None:
        """After a round: ``c`` closed (its trial failed, it does not fit, its verdict is decided, it is at the cap),
        or None while it stays open (``needed`` then holds the pairs its verdict expects to need)."""
        mine = recs[c.label]
        last = mine[-1]
        if last.status != "ok":
            return self.close(index, reference, c, recs, "failed", f"{last.status}: {(last.reason or '')[:200]}")
        if not self.feasible(c):
            peak, source = set_peak(self.of(c))
            return self.close(index, reference, c, recs, "infeasible",
                              f"peak {size_text(peak)} ({source}) > limit {size_text(self.s.memory_limit)}")
        est, v = compare(self.rows(mine), self.rows(recs[reference.label]), self.goal, self.s.cap)
        needed[c.label] = v.needed
        if v.decided:
            return self.close(index, reference, c, recs, v.word, None, est)
        if len(mine) >= self.s.cap:
            return self.close(index, reference, c, recs, "inconclusive at the cap", v.why, est)
        return None

    def close(self, index: int, reference: TechniqueSet, c: TechniqueSet, recs: dict[str, list[TrialRecord]],
              status: str, why: str | None, est: stats.Estimate | None = None) -> Outcome:
        if est is None and status not in ("failed", "reference failed"):
            est, _ = compare(self.rows(recs[c.label]), self.rows(recs[reference.label]), self.goal, self.s.cap)
        peak, source = set_peak(self.of(c))
        o = Outcome(c.label, index, reference.label, status, est.value if est else None, est.lo if est else None,
                    est.hi if est else None, est.n if est else 0, why, peak, source)
        self.outcomes[c.label] = o
        interval = (f" {o.estimate:.2f}x [{o.lo:.2f}, {o.hi:.2f}]" if o.lo is not None and o.hi is not None
                    else (f" {o.estimate:.2f}x" if o.estimate is not None else ""))
        self.note(index, "closed", c.label, f"{said(status)}{interval} against {reference.label} after "
                  f"{len(recs[c.label])} trial(s)" + (f": {why}" if why else ""))
        return o

    def best(self, index: int, order: list[TechniqueSet]) -> TechniqueSet | None:
        """The first set of ``order`` that fits and meets --quality (quality runs on demand)."""
        for techs in order:
            if not self.of(techs) or not self.feasible(techs):
                continue
            passed = self.quality_ok(techs, index)
            o = self.outcomes.get(techs.label)
            if o is not None:
                o.quality = self.quality.get(techs.label, (True, "not checked (--quality any)"))[1]
            if passed:
                return techs
        return None

    def run(self) -> Step:
        first = self.singles()
        if isinstance(first, Step):
            return first
        return self.greedy(*first)

    def singles(self) -> Step | tuple[TechniqueSet, dict[str, Outcome], bool]:
        """Stage 0, the singles beside the baseline: the search's end (a Step), or where greedy selection starts
        (the current best, the singles' outcomes, whether the baseline fits)."""
        goal, s = self.goal, self.s
        outcomes = self.stage(0, BASELINE, list(s.singles))
        base_recs = self.of(BASELINE)
        self.stages.append({"stage": 0, "reference": BASELINE.label, "candidates": [c.label for c in s.singles]})
        if not base_recs or all(r.status != "ok" for r in base_recs):
            why = next((r.reason for r in base_recs if r.reason), "not measured")
            return self.finish(None, f"the baseline could not be measured ({why})")
        baseline_fits = self.feasible(BASELINE)
        if not baseline_fits:
            peak, source = set_peak(base_recs)
            self.note(0, f"baseline {say(words.INFEASIBLE)}", BASELINE.label, f"peak {size_text(peak)} ({source}) > limit "
                      f"{size_text(s.memory_limit)}: the best set is the best that fits, whatever its verdict")
        measured = [c for c in s.singles if c.label in outcomes and self.of(c)]
        if baseline_fits:
            winners = sorted((c for c in measured if outcomes[c.label].status == goal.better),
                             key=lambda c: -gain(outcomes[c.label].estimate, goal))
            order = [*winners, BASELINE]
        else:
            order = sorted((c for c in measured if outcomes[c.label].status not in ("failed", "reference failed")),
                           key=lambda c: -gain(outcomes[c.label].estimate, goal))
        current = self.best(0, order)
        if current is None:
            return self.finish(None, "no measured set fits under the memory limit" if s.memory_limit else
                               "no measured set met the quality constraint")
        self.note(0, "current best", current.label, "after the singles")
        if current == BASELINE:  # every addition to the baseline is a single, measured already
            spent = any(o.status == "budget" for o in outcomes.values())
            return self.finish(current, "the budget is spent" if spent else
                               f"no single technique is decided {say(goal.better)} than the baseline")
        return current, outcomes, baseline_fits

    def greedy(self, current: TechniqueSet, outcomes: dict[str, Outcome], baseline_fits: bool) -> Step:
        """Greedy forward selection from ``current``. An infeasible set stays an addition (with a technique that
        saves memory it may fit); with an infeasible baseline, "worse than the baseline" says nothing about helping
        the best that fits."""
        goal, s = self.goal, self.s
        dropped_words = {goal.worse, stats.EQUIVALENT, "failed", "reference failed"}
        first_dropped = dropped_words if baseline_fits else {"failed", "reference failed"}
        additions = [c for c in s.singles if c != current and c.label in outcomes
                     and outcomes[c.label].status not in first_dropped
                     and self.quality.get(c.label, (True, ""))[0]]
        for c in s.singles:
            if c.label in outcomes and c not in additions and c != current:
                self.note(0, "not offered as an addition", c.label, said(outcomes[c.label].status))
        index = 0
        while True:
            index += 1
            combos, refused = [], []
            for a in additions:
                if a.names[0] in current.names:
                    continue
                techs = combined(current, a)
                if techs.label in self.outcomes:
                    continue  # measured before: never again
                reason = self.refuse(techs)
                (refused if reason else combos).append((a, techs, reason))
            for _, techs, reason in refused:
                self.not_tried.append((techs.label, f"refused by the planner: {reason}"))
                self.note(index, "refused", techs.label, reason or "")
            if not combos:
                return self.finish(current, "no technique is left to add" if not refused else
                                   "every remaining addition is refused by the planner")
            if self.s.budget_s is not None and not self.affordable(self.cost(current, goal.mode)):
                for _, techs, _ in combos:
                    self.not_tried.append((techs.label, "the budget was spent"))
                return self.finish(current, "the budget is spent")
            results = self.stage(index, current, [t for _, t, _ in combos])
            self.stages.append({"stage": index, "reference": current.label, "candidates": [t.label for _, t, _ in combos]})
            winners = sorted((t for _, t, _ in combos if results[t.label].status == goal.better
                              and self.feasible(t)), key=lambda t: -gain(results[t.label].estimate, goal))
            chosen = self.best(index, winners)
            spent_out = any(o.status == "budget" for o in results.values())
            if chosen is None:
                return self.finish(current, "the budget is spent" if spent_out else
                                   f"no addition is {say(goal.better)} than {current.label}")
            self.note(index, "current best", chosen.label, f"{say(goal.better)} than {current.label}")
            added = next(a for a, t, _ in combos if t == chosen)
            additions = [a for a, t, _ in combos if a != added and results[t.label].status not in dropped_words
                         and self.quality.get(t.label, (True, ""))[0]]
            for a, t, _ in combos:
                if a != added and a not in additions:
                    self.note(index, "not offered again", a.label, f"{t.label}: {said(results[t.label].status)}")
            current = chosen
            if spent_out:
                return self.finish(current, "the budget is spent")

    def finish(self, recommended: TechniqueSet | None, stop: str) -> Step:
        self.note(len(self.stages), "done", recommended.label if recommended else "", stop)
        smallest = None
        if recommended is None and self.s.memory_limit is not None:
            peaks = [(label, *set_peak([r for r in self.used if r.technique_label == label]))
                     for label in dict.fromkeys(r.technique_label for r in self.used)]
            peaks = [p for p in peaks if p[1] is not None]
            if peaks:
                smallest = min(peaks, key=lambda p: p[1])
        return Step([], self.trace, True, recommended.label if recommended else None,
                    self.runner_up(recommended), self.outcomes, self.not_tried, stop, smallest, self.spent(),
                    self.stages)

    def runner_up(self, recommended: TechniqueSet | None) -> str | None:
        """The best other set that fits and met --quality, preferring those measured in the same rounds as the
        recommended set (so the comparison is paired)."""
        if recommended is None:
            return None
        rec_keys = set(pairs.trials(self.rows(self.of(recommended)))["key"])
        base_est = {}
        labels = [BASELINE.label, *self.outcomes]
        for label in labels:
            techs = BASELINE if label == BASELINE.label else TechniqueSet.parse(label)
            if techs == recommended or not self.feasible(techs) or not any(r.status == "ok" for r in self.of(techs)):
                continue
            q = self.quality.get(label)
            if self.s.quality.rule != "any" and self.kind(techs) != "exact" and not (q and q[0]):
                continue
            est, _ = compare(self.rows(self.of(techs)), self.rows(self.of(BASELINE)), self.goal, self.s.cap)
            value = 1.0 if techs == BASELINE else est.value
            shared = len(rec_keys & set(pairs.trials(self.rows(self.of(techs)))["key"]))
            base_est[label] = (shared >= stats.MIN_REPEATS, gain(value, self.goal))
        return max(base_est, key=lambda k: base_est[k]) if base_est else None


def next_step(settings: Settings, records: Sequence[TrialRecord], refuse: Refuse) -> Step:
    """The search as a function of the records so far: the trials to run next, or the finished search. Only the
    records of trials the search itself asked for are read (by trial id), in the order it asked for them."""
    replay = _Replay(settings, records, refuse)
    try:
        return replay.run()
    except _Pending as pending:
        return Step(pending.trials, replay.trace, spent_s=replay.spent(), outcomes=replay.outcomes,
                    not_tried=replay.not_tried, stages=replay.stages)


def search(runner: SweepRunner, settings: Settings, refuse: Refuse, env: dict,
           on_progress: Callable[[Progress], None] | None = None) -> Step:
    """The search run to its end through ``runner`` (claimed; ``env`` is its ``prepare()``): each step's trials,
    their parity references first, until ``next_step`` is done. Interrupted, nothing recorded is lost: ``next_step``
    on the records is where ``--resume`` continues."""
    while True:
        step = next_step(settings, runner.records(), refuse)
        if step.done:
            return step
        runner.run_trials(step.pending, env, on_progress, references=True)


# ---- the result -----------------------------------------------------------------------------------------------


def _row(configs: Any, label: str) -> dict[str, Any] | None:
    rows = configs[configs["technique"] == label]
    return None if rows.empty else rows.iloc[0].to_dict()


def _fmt_ratio(row: dict[str, Any] | None, prefix: str) -> str:
    if row is None or not cells.known(row.get(prefix)):
        return "-"
    return cells.ratio_text(row[prefix], row.get(f"{prefix}_lo"), row.get(f"{prefix}_hi"), row.get(f"{prefix}_verdict"),
                            row.get(f"{prefix}_why"), brief=True)


def _fmt_quality(row: dict[str, Any] | None, kind: str) -> str:
    if kind == "exact":
        return f"{say(words.SAME)} (exact)"
    if row is None or not cells.known(row.get("delta")):
        return "not measured"
    text = cells.delta_cell(row["delta"], row.get("delta_lo"), row.get("delta_hi"), row.get("delta_verdict"),
                            row.get("delta_why"), brief=True).text
    return f"{row.get('metric') or 'metric'} {text}"


def said(status: str) -> str:
    """An outcome's status as a person reads it: an answer in the one vocabulary's words; a trial's status
    (failed, budget, reference failed) as it is."""
    if status == "infeasible":
        return say(words.INFEASIBLE)
    if status == "inconclusive at the cap":
        return f"{say(stats.INCONCLUSIVE)} at the cap"
    return say(status) if status in words.ANSWERS else status


def comparisons(records: Sequence[TrialRecord], step: Step, settings: Settings) -> dict[str, Any]:
    """The recommended set against the baseline and against the runner-up: speed, memory, quality (and time to
    target), each with its verdict, from the analysis (``bench.analyze.analysis.configurations``)."""
    from bench.analyze import analysis

    out: dict[str, Any] = {}
    if step.recommended is None:
        return out
    frame = records_frame(list(records), max_looks=settings.cap)
    th = analysis.Thresholds(metric=settings.quality.margin)
    kinds = {r.technique_label: r.kind for r in records}
    for against in (analysis.BASELINE, step.runner_up):
        if against is None or against == step.recommended:
            continue
        configs = analysis.configurations(frame, against, th)
        row = _row(configs, step.recommended)
        entry = {"speed": _fmt_ratio(row, "speedup"), "memory": _fmt_ratio(row, "mem_ratio"),
                 "quality": _fmt_quality(row, kinds.get(step.recommended, "exact")),
                 "speedup": row.get("speedup") if row else None,
                 "speed_verdict": row.get("speedup_verdict") if row else None,
                 "memory_ratio": row.get("mem_ratio") if row else None,
                 "memory_verdict": row.get("mem_ratio_verdict") if row else None}
        if settings.objective == "time-to-target":
            entry["time_to_target"] = _fmt_ratio(row, "ttt_ratio")
        out[against] = entry
    return out


def frontier(records: Sequence[TrialRecord], step: Step, settings: Settings) -> list[dict[str, Any]]:
    """Every measured set with its speedup, peak memory and quality against the baseline, and whether it is on the
    Pareto frontier of (speed up, memory down, quality up) by point estimates; a quality not measured counts as
    the worst (it cannot dominate on quality)."""
    from bench.analyze import analysis

    frame = records_frame(list(records), max_looks=settings.cap)
    if frame.empty or analysis.BASELINE not in set(frame["technique"]):
        return []
    configs = analysis.configurations(frame, analysis.BASELINE,
                                      analysis.Thresholds(metric=settings.quality.margin))
    rows = []
    for c in configs.to_dict("records"):
        label = c["technique"]
        mine = [r for r in records if r.technique_label == label]
        if not any(r.status == "ok" for r in mine):
            continue
        peak, source = set_peak(mine)
        kind = c.get("kind") or "exact"
        if label == analysis.BASELINE or kind == "exact":
            q = 0.0
        elif c.get("delta") is not None and not math.isnan(c["delta"]):
            q = float(c["delta"]) if c.get("higher_is_better") is not False else -float(c["delta"])
        else:
            q = None
        speed = 1.0 if label == analysis.BASELINE else c.get("speedup")
        speed = None if speed is None or (isinstance(speed, float) and math.isnan(speed)) else float(speed)
        rows.append({"set": label, "kind": kind, "speedup": speed, "speed": "reference" if label == "baseline"
                     else _fmt_ratio(c, "speedup"), "peak_bytes": peak, "peak_source": source,
                     "quality_score": q, "quality": "reference" if label == "baseline" else _fmt_quality(c, kind),
                     "feasible": settings.memory_limit is None or (peak is not None and peak <= settings.memory_limit),
                     "recommended": label == step.recommended})

    def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
        sa, sb = a["speedup"] or -math.inf, b["speedup"] or -math.inf
        ma, mb = a["peak_bytes"] or math.inf, b["peak_bytes"] or math.inf
        qa = -math.inf if a["quality_score"] is None else a["quality_score"]
        qb = -math.inf if b["quality_score"] is None else b["quality_score"]
        return sa >= sb and ma <= mb and qa >= qb and (sa > sb or ma < mb or qa > qb)

    for r in rows:
        r["pareto"] = not any(dominates(o, r) for o in rows if o is not r)
    return rows


def result_dict(records: Sequence[TrialRecord], step: Step, settings: Settings, elapsed_s: float | None = None
                ) -> dict[str, Any]:
    """Everything ``tune.json`` holds (NaN as null, so it is strict JSON)."""
    return _clean({
        "settings": {"workload": settings.workload.label, "objective": settings.objective,
                     "memory_limit_bytes": settings.memory_limit, "quality": settings.quality.label,
                     "cap": settings.cap, "budget_s": settings.budget_s, "seed": settings.seed,
                     "world_size": settings.world_size, "candidates": [s.label for s in settings.singles]},
        "done": step.done, "stop": step.stop, "recommended": step.recommended, "runner_up": step.runner_up,
        "smallest_peak": list(step.smallest_peak) if step.smallest_peak else None,
        "comparisons": comparisons(records, step, settings),
        "outcomes": [dataclasses.asdict(o) for o in step.outcomes.values()],
        "not_tried": [{"set": s, "why": w} for s, w in step.not_tried],
        "trace": step.trace, "stages": step.stages,
        "frontier": frontier(records, step, settings),
        "trial_time_s": round(step.spent_s, 1), "trials": len([r for r in records if r.added_by == ADDED_BY]),
        "elapsed_s": round(elapsed_s, 1) if elapsed_s is not None else None,
    })


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def write_json(out_dir: Path, result: dict[str, Any]) -> Path:
    """``tune.json``: the result (``result_dict``), whole or not at all. tune.md and its figure are rendered from the
    same dict by ``bench.report.tune``."""
    path = out_dir / "tune.json"
    write_atomic(path, json.dumps(result, indent=2, default=str))
    return path
