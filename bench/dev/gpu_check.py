"""What ``scripts/gpu_check.sh`` says and keeps at its end: where a sweep's time went, read from its records, what a
cap cut, whether a resume measured anything twice, and the sweep directory kept under a size, so the whole report
comes back from a remote machine.

    python -m bench.dev.gpu_check times OUT [--script NAME=SECONDS ...] [--json FILE]
    python -m bench.dev.gpu_check cut OUT
    python -m bench.dev.gpu_check resumed OUT --first FIRST.jsonl
    python -m bench.dev.gpu_check keep OUT --limit-mib 64
    python -m bench.dev.gpu_check restore OUT

What a cap cut: the planned trials of the sweep (its sweep.toml, in its run order) that have no record; ``cut``
prints them by set and adds a section saying so to the report of what finished (report.md), so the report never
reads as the whole plan. A resume measured nothing twice when every trial id appears once and the records of the cut
pass (``--first``: a copy of its results.jsonl) open the file unchanged.

Where the time went: each record's ``stages`` (seconds per stage of the trial, where the harness records them)
summed over the sweep; for records without them, each trial's wall time split into its timed window, its quality
run's training clock, compile's (and other) one-off cost and the rest (process start, imports, build, data, parity,
the passes). Either way, the trials' wall time by technique set.

Keeping the size: the files a report is read from stay (``KEPT``); anything else under the directory (caches a
sweep keeps beside its references, traces) moves, largest first, into the sibling ``OUT.overflow`` until the
directory is under the limit, and ``restore`` moves it back before a resumed run, so no cached work is lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.core.errors import ConfigError
from bench.plan.config import SweepConfig, build_config
from bench.plan.planner import run_order, trial_id, world_size_for
from bench.records import reader
from bench.records.results import TrialRecord

KEPT = frozenset({"results.jsonl", "env.json", "sweep.toml", "summary.md", "report.md", "report.html", "figures",
                  "references", "pytest-m-gpu.txt", "gpu-check.txt", ".trainbench.lock"})
OVERFLOW = ".overflow"  # the sibling directory's suffix


def _stages(rec: TrialRecord) -> dict[str, float] | None:
    """A record's stage times (a mapping, or a dataclass of seconds), or None where it has none."""
    found: Any = getattr(rec, "stages", None)
    if dataclasses.is_dataclass(found) and not isinstance(found, type):
        found = dataclasses.asdict(found)
    if not isinstance(found, Mapping):
        return None
    return {str(k): float(v) for k, v in found.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _split(rec: TrialRecord) -> dict[str, float]:
    """A record's wall time in the parts every record has (no ``stages``)."""
    wall = rec.wall_s or 0.0
    parts = {
        "timed window": rec.speed.window_s if rec.speed else 0.0,
        "quality run (training clock)": rec.quality.train_time_s if rec.quality else 0.0,
        "one-off (first step beyond a steady one: compilation)": (rec.build.one_off_s or 0.0) if rec.build else 0.0,
    }
    parts = {k: v or 0.0 for k, v in parts.items()}
    parts["the rest (start, imports, build, data, parity, passes)"] = max(wall - sum(parts.values()), 0.0)
    return parts


def time_lines(records: Sequence[TrialRecord], script: Mapping[str, float] | None = None) -> list[str]:
    """Where the time went, as lines: the script's own stages (``script``), the trials' time by stage (their
    ``stages``, else the parts ``_split`` finds) and by technique set."""
    lines = []
    if script:
        total = sum(script.values())
        lines.append("gpu_check: " + ", ".join(f"{k} {v:.0f} s" for k, v in script.items()) + f"; {total:.0f} s in all")
    trials = [r for r in records if r.wall_s]
    if not trials:
        return [*lines, "no trial finished: nothing to split"]
    wall = sum(r.wall_s or 0.0 for r in trials)
    by_stage: dict[str, float] = defaultdict(float)
    recorded = 0
    for rec in trials:
        stages = _stages(rec)
        recorded += stages is not None
        for name, seconds in (stages if stages is not None else _split(rec)).items():
            by_stage[name] += seconds
    source = ("stage times recorded by every trial" if recorded == len(trials) else
              f"stage times of {recorded} trial(s), the others split from their records" if recorded else
              "split from the records, which hold no stage times")
    lines.append(f"{len(trials)} trials, {wall:.0f} s of trial wall time ({source}):")
    for name, seconds in sorted(((k, v) for k, v in by_stage.items() if v > 0), key=lambda kv: -kv[1]):
        lines.append(f"  {name}: {seconds:.0f} s ({seconds / wall:.0%})")
    by_set: dict[str, list[float]] = defaultdict(list)
    for rec in trials:
        by_set[rec.technique_label].append(rec.wall_s or 0.0)
    lines.append("by set (trials, wall time): " + "; ".join(
        f"{label} {len(v)}, {sum(v):.0f} s" for label, v in sorted(by_set.items(), key=lambda kv: -sum(kv[1]))))
    return lines


def planned_ids_of(cfg: SweepConfig) -> list[str]:
    """The planned trials of a sweep, in run order."""
    return [trial_id(w, t, cfg.seed + r, r, world_size_for(t, cfg.world_size)) for r, w, t in run_order(cfg)]


def planned_ids(out: Path) -> list[str]:
    """The planned trials of the sweep in ``out`` (its sweep.toml), in run order."""
    return planned_ids_of(build_config(None, None, out / "sweep.toml"))


def cut_lines(out: Path) -> list[str]:
    """What the cap cut: the planned trials without a record, by set (empty when none)."""
    done = {r.trial_id for r in reader.read_records(out / "results.jsonl")} if (out / "results.jsonl").exists() else set()
    planned = planned_ids(out)
    missing = [i for i in planned if i not in done]
    if not missing:
        return []
    by_set: dict[str, list[str]] = defaultdict(list)
    for i in planned:
        by_set[i.split("/")[1]].append(i)
    sets = [f"{label} {sum(i not in done for i in ids)} of {len(ids)}" for label, ids in by_set.items()
            if any(i not in done for i in ids)]
    return [f"cut by the cap: {len(missing)} of the {len(planned)} planned trials did not run ({'; '.join(sets)}); "
            "running the script again resumes them, and no finished trial is measured again",
            "  not run: " + ", ".join(missing)]


CUT_HEADING = "## Cut by the time cap (scripts/gpu_check.sh)"


def note_cut(out: Path) -> list[str]:
    """``cut_lines``, also written at the end of the report of what finished (report.md; replaced, not added twice)."""
    lines = cut_lines(out)
    report = out / "report.md"
    if lines and report.exists():
        text = report.read_text().split("\n" + CUT_HEADING)[0].rstrip("\n")
        body = "\n".join([CUT_HEADING, "", "The tables above hold only the trials that finished before the slot's "
                          "cap stopped the sweep. " + lines[0][0].upper() + lines[0][1:] + ".", "",
                          "N" + lines[1].strip()[1:] + "."])
        report.write_text(f"{text}\n\n{body}\n")
    return lines


def resumed(out: Path, first: Path) -> tuple[bool, list[str]]:
    """Whether the resume in ``out`` measured nothing twice (every trial id once; the cut pass's records, ``first``,
    open the file unchanged), and lines saying so."""
    def complete(path: Path) -> list[str]:  # a line cut mid-write by the cap is repaired away by the resume
        out_lines = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                json.loads(line)
            except ValueError:
                continue
            out_lines.append(line)
        return out_lines

    before, now = complete(first), complete(out / "results.jsonl")
    twice = [i for i, n in Counter(json.loads(line)["trial_id"] for line in now).items() if n > 1]
    kept = now[:len(before)] == before
    lines = []
    if twice:
        lines.append(f"resume: measured twice: {', '.join(twice)}")
    if not kept:
        lines.append(f"resume: the {len(before)} records of the cut pass do not open results.jsonl unchanged")
    left = cut_lines(out)
    if not twice and kept:
        lines.append(f"resume: the {len(before)} trials of the cut pass kept as they were, {len(now) - len(before)} "
                     "measured after it, none twice" + ("; every planned trial recorded" if not left else ""))
    return not twice and kept, lines + left


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def keep_under(out: Path, limit_bytes: int) -> list[str]:
    """Move what a report is not read from out of ``out``, largest first, until it holds at most ``limit_bytes``;
    what was moved and, if the kept files alone exceed the limit, that they do."""
    total = _size(out)
    if total <= limit_bytes:
        return []
    overflow = out.with_name(out.name + OVERFLOW)
    movable = sorted((p for p in out.iterdir() if p.name not in KEPT), key=_size, reverse=True)
    lines = []
    for path in movable:
        if total <= limit_bytes:
            break
        size = _size(path)
        overflow.mkdir(exist_ok=True)
        target = overflow / path.name
        if target.exists():  # an older copy: the newer one wins
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        shutil.move(str(path), str(target))
        total -= size
        lines.append(f"moved {path.name} ({size / 2**20:.1f} MiB) to {overflow}")
    if total > limit_bytes:
        lines.append(f"{out} still holds {total / 2**20:.1f} MiB, over the {limit_bytes / 2**20:.0f} MiB limit, in "
                     "files a report is read from")
    return lines


def restore(out: Path) -> list[str]:
    """Move back what ``keep_under`` moved (before a resumed run reads its caches)."""
    overflow = out.with_name(out.name + OVERFLOW)
    if not overflow.is_dir():
        return []
    lines = []
    for path in sorted(overflow.iterdir()):
        if not (out / path.name).exists():
            shutil.move(str(path), str(out / path.name))
            lines.append(f"moved {path.name} back into {out}")
    if not any(overflow.iterdir()):
        overflow.rmdir()
    return lines


def _script_stages(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, seconds = item.rpartition("=")
        try:
            out[name] = float(seconds)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise SystemExit(f"--script takes NAME=SECONDS, got {item!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dev.gpu_check", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    times = sub.add_parser("times", help="where the time went")
    times.add_argument("out", type=Path)
    times.add_argument("--script", action="append", default=[], metavar="NAME=SECONDS",
                       help="a stage of the script itself, in order")
    times.add_argument("--json", type=Path, help="also write the script's stages here (the next plan reads them)")
    cut = sub.add_parser("cut", help="what the cap cut (also noted in report.md)")
    cut.add_argument("out", type=Path)
    again = sub.add_parser("resumed", help="whether a resume measured any trial twice")
    again.add_argument("out", type=Path)
    again.add_argument("--first", type=Path, required=True, help="a copy of results.jsonl after the cut pass")
    keep = sub.add_parser("keep", help="keep the directory under a size")
    keep.add_argument("out", type=Path)
    keep.add_argument("--limit-mib", type=float, default=64.0)
    back = sub.add_parser("restore", help="move back what keep moved")
    back.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    code = 0
    if args.command == "times":
        path = args.out / "results.jsonl"
        records = reader.read_records(path) if path.exists() else []
        script = _script_stages(args.script)
        lines = time_lines(records, script)
        if (args.out / "sweep.toml").exists():  # and what the cap cut, if anything (gpu-check.txt keeps it)
            try:
                lines += cut_lines(args.out)
            except (ConfigError, ValueError) as exc:  # a sweep.toml this checkout cannot read: no plan to compare
                lines.append(f"what was cut is unknown: {exc}")
        if args.json is not None:
            args.json.write_text(json.dumps({"script": script}, indent=1) + "\n")
    elif args.command == "cut":
        lines = note_cut(args.out) or ["nothing was cut: every planned trial has a record"]
    elif args.command == "resumed":
        ok, lines = resumed(args.out, args.first)
        code = 0 if ok else 1
    elif args.command == "keep":
        lines = keep_under(args.out, int(args.limit_mib * 2**20))
    else:
        lines = restore(args.out)
    for line in lines:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
