"""`python -m bench sweep --ab REV_OR_DIR`: one sweep, two versions of the code, trials interleaved.

Comparing two sweeps run at different times mixes the change under test with whatever the machine did between
them (other jobs, thermal state, a noisy neighbour). Here every trial of the plan runs twice, once with this
checkout's code (side A) and once with the other checkout's (side B), back to back, alternating which goes first
(ABBA: neighbouring configurations swap, and each configuration swaps from one repeat to the next), so drift hits
both sides alike. That is what makes a CI regression gate stable on a shared machine.

- REV_OR_DIR is a directory holding another checkout (``.`` for an A/A run of this one) or a git revision of this
  repository, checked out with ``git worktree add --detach`` into a temporary directory that is removed at the end.
- B's trial processes start with cwd = the other checkout, so ``python -m bench.trial`` imports *its* ``bench`` and
  ``techniques`` (the interpreter and installed libraries are this one's). The plan, the trial specs and the
  orchestration are this checkout's: the other side must understand this version's ``TrialSpec``.
- OUT/a/ and OUT/b/ are ordinary sweep directories (results.jsonl, env.json, sweep.toml, summary.md); OUT/ab.json
  says which code each side ran; OUT/compare.md is ``bench compare OUT/a OUT/b`` (B judged against A).
- ``--repeats auto`` (a sequential design): after the planned trials, rounds of speed-only trials for the
  configurations whose throughput or memory verdict of B against A is still open (``sequential_round``), each trial
  on both sides back to back, ABBA from one round to the next, the closest to a decision first, within the time
  budget (``bench.run.adaptive``'s rules, read off ``bench compare``'s verdicts instead of set-vs-baseline ones). The
  final comparison reads the design from sweep.toml and gives repeated intervals.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.analyze import compare as compare_mod
from bench.core.files import REPO_DIR, write_atomic
from bench.plan.config import ISOLATIONS, ConfigError, SweepConfig
from bench.plan.planner import Trial, plan
from bench.records import reader
from bench.records.results import TrialRecord
from bench.report import compare as compare_md
from bench.report import summary as summary_mod
from bench.run import adaptive, sweepdir
from bench.run.launcher import Launch
from bench.run.runner import SweepRunner

log = logging.getLogger(__name__)

SIDES = ("a", "b")


@dataclass
class Checkout:
    """The code one side of an A/B run executes."""

    code_dir: Path
    spec: str  # what the user gave: a directory or a revision
    commit: str | None
    worktree: bool = False  # created here (a temporary git worktree): removed by ``release``

    def describe(self) -> dict[str, Any]:
        return {"code_dir": str(self.code_dir), "spec": self.spec, "commit": self.commit, "worktree": self.worktree}


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)


def _commit_of(path: Path) -> str | None:
    try:
        proc = _git(path, "rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _check_checkout(path: Path, spec: str) -> None:
    if not (path / "bench" / "trial.py").is_file():
        raise ConfigError(f"--ab {spec}: {path} holds no trainbench checkout (no bench/trial.py)")


def resolve_checkout(rev_or_dir: str, repo_dir: Path = REPO_DIR) -> Checkout:
    """A directory is used as it is; anything else must be a git revision of ``repo_dir`` and gets a worktree."""
    path = Path(rev_or_dir).expanduser()
    if path.is_dir():
        path = path.resolve()
        _check_checkout(path, rev_or_dir)
        return Checkout(path, rev_or_dir, _commit_of(path))
    try:
        proc = _git(repo_dir, "rev-parse", "--verify", "--quiet", f"{rev_or_dir}^{{commit}}")
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"--ab {rev_or_dir}: not a directory, and git is unavailable ({exc})") from None
    if proc.returncode != 0:
        raise ConfigError(f"--ab {rev_or_dir}: neither a directory nor a git revision of {repo_dir}")
    commit = proc.stdout.strip()
    root = Path(tempfile.mkdtemp(prefix="trainbench-ab-"))
    target = root / "checkout"
    added = _git(repo_dir, "worktree", "add", "--detach", str(target), commit)
    if added.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise ConfigError(f"--ab {rev_or_dir}: git worktree add failed: {added.stderr.strip()[:300]}")
    checkout = Checkout(target, rev_or_dir, commit, worktree=True)
    try:
        _check_checkout(target, rev_or_dir)
    except ConfigError:
        release(checkout, repo_dir)
        raise
    log.info("checked out %s (%s) into %s", rev_or_dir, commit, target)
    return checkout


def release(checkout: Checkout, repo_dir: Path = REPO_DIR) -> None:
    """Remove a worktree this module created (and its temporary directory); a user's directory is left alone."""
    if not checkout.worktree:
        return
    proc = _git(repo_dir, "worktree", "remove", "--force", str(checkout.code_dir))
    if proc.returncode != 0:
        log.warning("git worktree remove %s failed: %s", checkout.code_dir, proc.stderr.strip())
    shutil.rmtree(checkout.code_dir.parent, ignore_errors=True)
    _git(repo_dir, "worktree", "prune")


@dataclass
class AbProgress:
    done: int
    total: int
    side: str  # "a" | "b"
    trial: Trial
    record: TrialRecord | None  # None: already recorded (resume)


@dataclass
class AbResult:
    out_dir: Path
    records: dict[str, list[TrialRecord]]
    comparison: compare_mod.Comparison
    markdown: str


def side_configs(cfg: SweepConfig, other: Checkout, isolation_b: str | None) -> tuple[SweepConfig, SweepConfig]:
    """Each side's settings: ``cfg`` for both, except how their trials start (``bench.run.isolation``). Against
    another checkout both sides start fresh (its trials cannot fork from this checkout's server, and only the code
    may differ between the sides); ``isolation_b`` (``--ab . --ab-isolation fresh``) makes the isolation the one
    difference instead, to compare the two ways of starting a trial on this checkout."""
    other_code = other.code_dir.resolve() != REPO_DIR.resolve()
    if isolation_b is not None and other_code:
        raise ConfigError(f"--ab-isolation compares how trials start on this checkout: use it with --ab . (the "
                          f"trials of {other.spec} start fresh, since the fork server imports this checkout's code)")
    if isolation_b is not None and isolation_b not in ISOLATIONS:
        raise ConfigError(f"--ab-isolation must be one of {', '.join(ISOLATIONS)}; got {isolation_b!r}")
    cfg_a = dataclasses.replace(cfg, isolation="fresh") if other_code else cfg
    return cfg_a, dataclasses.replace(cfg_a, isolation=isolation_b) if isolation_b else cfg_a


class AbRunner:
    """Runs the plan of ``cfg`` on two checkouts, alternating per trial, into OUT/a and OUT/b."""

    def __init__(
        self, cfg: SweepConfig, out_dir: Path, device: torch.device, other: Checkout, resume: bool = False,
        command: str = "", threshold: float = compare_mod.DEFAULT_THRESHOLD, extend: bool = False,
        launch: Launch | None = None, isolation_b: str | None = None,
    ) -> None:
        if cfg.plugins and not (other.code_dir / "bench" / "plugins.py").is_file():
            raise ConfigError(f"--ab {other.spec}: that checkout predates --model and --technique, so its trial code "
                              "cannot load them; compare against a revision that has bench/plan/plugins.py")
        cfg_a, cfg_b = side_configs(cfg, other, isolation_b)
        self.cfg = cfg_a
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.other = other
        self.threshold = threshold
        self.runners = {
            "a": SweepRunner(cfg_a, self.out_dir / "a", device, resume=resume, command=command, code_dir=REPO_DIR,
                             extend=extend, launch=launch),
            "b": SweepRunner(cfg_b, self.out_dir / "b", device, resume=resume, command=command, extend=extend,
                             code_dir=other.code_dir, launch=launch),
        }
        self.device = device
        self.command = command

    def claim(self) -> None:
        """OUT, then each side's directory (checks and locks, see ``SweepRunner.claim``)."""
        self._claim_root()
        for runner in self.runners.values():
            runner.claim()

    @property
    def recorder(self) -> bool:
        """Node 0 of a multi-node A/B run (or the only node): it records, summarises and compares."""
        return self.runners["a"].recorder

    def run(self, on_progress: Callable[[AbProgress], None] | None = None) -> AbResult | None:
        """The comparison; None on the other nodes of a multi-node run (node 0 records and compares)."""
        if not all(r.claimed for r in self.runners.values()):
            self.claim()
        try:
            mine = Checkout(REPO_DIR, ".", _commit_of(REPO_DIR))
            if self.recorder:
                write_atomic(self.out_dir / "ab.json", json.dumps(
                    {"a": {**mine.describe(), "isolation": self.runners["a"].cfg.isolation},
                     "b": {**self.other.describe(), "isolation": self.runners["b"].cfg.isolation},
                     "command": self.command,
                     "threshold": self.threshold,
                     "order": "per trial, alternating which side goes first (ABBA, balanced per configuration)"},
                    indent=2) + "\n")
            envs = {side: runner.prepare() for side, runner in self.runners.items()}
            self.cfg = self.runners["a"].cfg  # a resumed --extend run continues the union of the plans
            trials = plan(self.cfg, self.device)
            done = self._agree_on_done(trials)
            for side, runner in self.runners.items():  # each side's references come from its own code
                runner.launcher.start_server([t for t in trials if t.trial_id not in done[side]])
                runner.launcher.prepare_references([t for t in trials if t.trial_id not in done[side]])
            total, count = 2 * len(trials), 0
            for trial, sides in abba_order(trials):
                for side in sides:
                    count = self._run_one(side, trial, envs, trial.trial_id in done[side], count, total,
                                          on_progress)
            if self.cfg.sequential and self.recorder:
                self._sequential_phase(envs, config_index(trials), count, total, on_progress)
        finally:
            for runner in self.runners.values():
                runner.close()
        return self.finish() if self.recorder else None

    def _run_one(self, side: str, trial: Trial, envs: dict[str, dict], done: bool, count: int, total: int,
                 on_progress: Callable[[AbProgress], None] | None) -> int:
        """One side of one trial (unless ``done``): the runner's own per-trial path (one child process, timeout,
        soft failure), one trial at a time so the two sides interleave. Returns the new count."""
        runner = self.runners[side]
        record = None
        if not done:
            record = runner.launcher.run(trial, envs[side])
            if runner.recorder:  # node 0 of a multi-node sweep
                runner.store.append(record)
        if on_progress:
            on_progress(AbProgress(count + 1, total, side, trial, record))
        return count + 1

    def _records(self) -> dict[str, list[TrialRecord]]:
        return {side: runner.store.read() for side, runner in self.runners.items()}

    def _sequential_phase(self, envs: dict[str, dict], index: dict[tuple[str, str], int], count: int, total: int,
                          on_progress: Callable[[AbProgress], None] | None) -> None:
        """``--repeats auto``: rounds of speed-only trials, each on both sides back to back, while B's verdicts
        against A are open; first the other side of a trial an interrupted run recorded on one side only."""
        if self.runners["a"].launch.nnodes > 1:
            log.warning("--repeats auto adds no speed-only pairs to a multi-node A/B run (its nodes would have to "
                        "agree on every round): the planned %d repeats are the design", self.cfg.repeats)
            return
        records = self._records()
        for trial, side in half_done(self.cfg, records):
            total += 1
            count = self._run_one(side, trial, envs, False, count, total, on_progress)
        records = self._records()
        budget = adaptive.budget_s(self.cfg, records["a"] + records["b"])
        while True:
            spent = adaptive.spent_s(records["a"] + records["b"])
            trials = sequential_round(self.cfg, records, budget - spent, self.threshold)
            if not trials:
                break
            total += 2 * len(trials)
            for trial, sides in abba_order(trials, index):
                for side in sides:
                    count = self._run_one(side, trial, envs, False, count, total, on_progress)
            records = self._records()

    def _agree_on_done(self, trials: list[Trial]) -> dict[str, set[str]]:
        """Each side's finished trials, the same on every node of a multi-node sweep (node 0's record)."""
        keyed = [dataclasses.replace(t, trial_id=f"{side}/{t.trial_id}") for side in SIDES for t in trials]
        done = {f"{side}/{i}" for side, r in self.runners.items() for i in r.store.done_trial_ids()}
        agreed = self.runners["a"].agree_on_done(keyed, done)
        return {side: {k.partition("/")[2] for k in agreed if k.startswith(f"{side}/")} for side in SIDES}

    def _claim_root(self) -> None:
        """OUT itself: new or empty for a new run (it gets a/, b/, ab.json, compare.md); an A/B run's to resume
        (one that stopped before writing ab.json is resumed from its sides' sweep.toml)."""
        if not self.recorder:  # another node of a multi-node run, which may share node 0's directory
            pass
        elif self.resume:
            if not (self.out_dir / "a" / "sweep.toml").exists():
                raise ConfigError(f"--resume --out {self.out_dir}: no A/B run there to continue (no a/sweep.toml)")
        else:
            sweepdir.check_new(self.out_dir)
        sweepdir.make_dir(self.out_dir)

    def finish(self) -> AbResult:
        """Summaries of both sides and the comparison of B against A (OUT/compare.md)."""
        records = {side: runner.store.read() for side, runner in self.runners.items()}
        for side in records:
            write_atomic(self.out_dir / side / "summary.md", summary_mod.markdown_of(
                self.out_dir / side, title=f"Sweep '{self.cfg.name}' side {side.upper()} summary"))
        comparison = compare_mod.compare_dirs(self.out_dir / "a", self.out_dir / "b", self.threshold)
        title = f"A/B: {self.other.spec} (B) against this checkout (A)"
        md = compare_md.to_markdown(comparison, title=title)
        write_atomic(self.out_dir / "compare.md", md)
        return AbResult(self.out_dir, records, comparison, md)


def config_index(trials: list[Trial]) -> dict[tuple[str, str], int]:
    """Each configuration's (workload, set) index in the order the trials first name it."""
    index: dict[tuple[str, str], int] = {}
    for trial in trials:
        index.setdefault((trial.workload.label, trial.techniques.label), len(index))
    return index


def abba_order(trials: list[Trial], index: dict[tuple[str, str], int] | None = None
               ) -> list[tuple[Trial, tuple[str, str]]]:
    """Which side runs first for each trial: ABBA, balanced per configuration.

    A configuration (workload x set) alternates from one repeat to the next, and neighbouring configurations (in
    the plan's unshuffled order) start on opposite sides, so drift in the machine's speed hits A and B alike: each
    configuration runs A first in half of its repeats (one more when the count is odd). The index comes from the
    configuration, not the trial's shuffled position, which would leave a configuration's order to chance.
    ``index``: the plan's (``config_index``), so a sequential round's speed-only trials, numbered on from the
    planned repeats, keep alternating (a configuration's next round starts on the other side).
    """
    index = dict(index) if index is not None else {}
    for trial in trials:
        index.setdefault((trial.workload.label, trial.techniques.label), len(index))
    ordered = []
    for trial in trials:
        j = index[(trial.workload.label, trial.techniques.label)]
        ordered.append((trial, SIDES if (j + trial.repeat) % 2 == 0 else SIDES[::-1]))
    return ordered


# ---- the sequential phase (``--repeats auto``) ------------------------------------------------------------------


def open_configurations(cfg: SweepConfig, records: dict[str, list[TrialRecord]],
                        threshold: float = compare_mod.DEFAULT_THRESHOLD) -> list[adaptive.Open]:
    """The configurations whose throughput or memory verdict of B against A (``bench compare`` on the records so
    far, with the design's repeated intervals) is still open with fewer than ``max_repeats`` pairs, the most
    informative first. A configuration that has had ``max_repeats`` trials on a side is closed even when some
    failed, so trials that keep failing cannot keep a round going."""
    a, b = (reader.unique_trials(records[side])[0] for side in SIDES)
    rows, _, _ = compare_mod.compare_records(a, b, threshold, cfg.max_repeats)
    workloads, sets = adaptive.labelled(cfg)
    found: list[adaptive.Open] = []
    for row in rows:
        key = row.key
        if key.workload not in workloads or key.techniques not in sets:
            continue
        if adaptive.exhausted(cfg, max(row.n_base_total, row.n_new_total)):
            continue
        # never futile here: the gate's overall verdict pools every configuration's pairs
        verdicts = [(name, q.verdict, q.estimate.n if q.estimate else None, q.needed, False)
                    for name, q in (("speed", row.throughput), ("memory", row.memory))]
        cost = sum(adaptive.trial_cost(records[side], key.workload, key.techniques) for side in SIDES)
        found += adaptive.open_of(verdicts, cfg.max_repeats, workloads[key.workload], sets[key.techniques],
                                  key.world_size, cost)
    return adaptive.informative_first(found)


def sequential_round(cfg: SweepConfig, records: dict[str, list[TrialRecord]], budget_left: float,
                     threshold: float = compare_mod.DEFAULT_THRESHOLD) -> list[Trial]:
    """The next round of speed-only trials, each to run on both sides (empty: nothing open, or the budget left
    fits none). The open configurations go in order, the closest to a decision first, while their cost on both
    sides fits ``budget_left``; a workload's trials of one round share its next repeat number."""
    chosen, cost = [], 0.0
    for o in open_configurations(cfg, records, threshold):
        if cost + o.cost_s > budget_left:
            continue  # a cheaper configuration further down may still fit
        chosen.append(o)
        cost += o.cost_s
    both = records["a"] + records["b"]
    repeats = {w: adaptive.next_repeat(both, w.label) for w in {o.workload for o in chosen}}
    trials = [adaptive.speed_trial(cfg, o.workload, o.techniques, o.world_size, repeats[o.workload],
                                   len(records["a"]) + i) for i, o in enumerate(chosen)]
    if trials:
        log.info("A/B sequential round: %d speed-only trials on both sides for %s", len(trials),
                 ", ".join(f"{o.workload.label} {o.techniques.label} ({o.what}, {o.pairs} pairs)" for o in chosen))
    return trials


def half_done(cfg: SweepConfig, records: dict[str, list[TrialRecord]]) -> list[tuple[Trial, str]]:
    """Speed-only trials an interrupted run recorded on one side only, with the side that still has to run them
    (their pair is incomplete until it does)."""
    workloads, sets = adaptive.labelled(cfg)
    ids = {side: {r.trial_id for r in recs} for side, recs in records.items()}
    out = []
    for side, other in (("a", "b"), ("b", "a")):
        for r in records[side]:
            if r.added_by != adaptive.ADDED_BY or r.trial_id in ids[other]:
                continue
            if r.workload_label not in workloads or r.technique_label not in sets:
                continue
            trial = adaptive.speed_trial(cfg, workloads[r.workload_label], sets[r.technique_label], r.world_size,
                                         r.repeat, r.position)
            if trial.trial_id == r.trial_id:
                out.append((trial, other))
            else:  # a record of another design (a seed this sweep would not give): left unpaired
                log.warning("A/B resume: %s on side %s has no pair, and this sweep would not make it", r.trial_id,
                            side.upper())
    return out


__all__ = ["abba_order", "AbProgress", "AbResult", "AbRunner", "Checkout", "config_index", "half_done",
           "open_configurations", "release", "resolve_checkout", "sequential_round"]
