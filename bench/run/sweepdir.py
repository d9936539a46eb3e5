"""The sweep directory: who may write into it, and what a resumed sweep must agree with.

- A new sweep needs a new or empty ``--out``: the harness never overwrites a file it did not write.
- One sweep at a time: a lock (``flock`` on ``OUT/.trainbench.lock``) is held while trials run, so a second sweep
  started on the same directory is refused instead of writing duplicated trial ids; the kernel releases the lock
  when the holder dies, however it dies.
- ``--resume`` continues exactly the sweep that was started: the settings every trial ran under (budget, mode,
  device, threads, processes, seed) must be the stored ones, and each record carries their hash, so two
  configurations are never mixed in one report. Adding workloads, technique sets or repeats is allowed on purpose
  only (``--extend``): the sweep then becomes the union of the two plans.
- Trial processes get temporary directories named after the runner's pid; a runner killed with ``kill -9`` leaves
  its directory behind, and the next sweep removes directories whose runner is gone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psutil

from bench.core.text import shown
from bench.plan.config import ConfigError, SweepConfig, build_config, load_toml, shard_text

log = logging.getLogger(__name__)

LOCK_NAME = ".trainbench.lock"
TEMP_PREFIX = "trainbench-trial-"
PLAN_KEYS = ("workloads", "techniques", "repeats", "models", "technique_plugins")  # what --extend may grow; every
# other setting must match (users' files must be unchanged: ``sources_sha256``)


def check_new(out_dir: Path) -> None:
    """A new sweep's ``--out``: absent, or an empty directory (never a file, never someone else's files)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a directory; give a new or empty directory")
    if out_dir.is_dir():
        held = sorted(p.name for p in out_dir.iterdir() if p.name != LOCK_NAME)
        if held:
            listed = ", ".join(shown(n, 40) for n in held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
            ours = (out_dir / "sweep.toml").exists() or (out_dir / "ab.json").exists()
            hint = ("pass --resume to continue the sweep there, or give another --out" if ours
                    else "a new sweep needs a new or empty --out, so nothing of yours is overwritten")
            raise ConfigError(f"--out {out_dir} is not empty (it holds {listed}); {hint}")


def check_resumable(out_dir: Path) -> None:
    if not out_dir.exists():
        raise ConfigError(f"--resume --out {out_dir}: no such directory, so nothing to continue (check the path, or "
                          "drop --resume to start a new sweep there)")
    if not out_dir.is_dir():
        raise ConfigError(f"--resume --out {out_dir} is a file, not a sweep directory")
    if not (out_dir / "sweep.toml").exists():
        raise ConfigError(f"--resume --out {out_dir}: the directory holds no sweep (no sweep.toml)")


def make_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--out {out_dir}: cannot write there ({exc.strerror or exc})") from None


# ---- the lock -------------------------------------------------------------------------------------------------


class SweepLock:
    """``flock`` on ``OUT/.trainbench.lock`` for the life of the sweep; the holder's pid is written inside.

    The file is removed on release, so a refused or finished sweep leaves the directory as it was. Removing a lock
    file races with a process that opened it just before: that process then holds a lock on a file no longer in
    the directory, so ``acquire`` checks that the file it locked is still the one at the path, and retries if not.
    """

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK_NAME
        self._fd: int | None = None

    def check_free(self) -> None:
        """Refuse now if another sweep holds the lock (before judging the directory by its other files)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # no lock file, or --out is not a directory (said by the checks that follow)
            return
        try:
            self._try_lock(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._try_lock(fd)
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed it between our open and our lock: lock the new file
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _try_lock(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(f"another sweep (pid {holder}) is writing {self.path.parent}; wait for it to finish, "
                              "or use another --out") from None

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still holding it, so no one locks the file being removed
            os.close(self._fd)
            self._fd = None


# ---- settings a resumed sweep must keep ------------------------------------------------------------------------


def settings(cfg: SweepConfig) -> dict[str, Any]:
    """What every trial of the sweep ran under: everything but the plan's extent (and the sweep's name)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in (*PLAN_KEYS, "name", "sources_sha256", "shard")}


def settings_hash(cfg: SweepConfig) -> str:
    text = json.dumps(settings(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``["budget.min_seconds 1.0 -> 2.0", "threads 0 -> 1"]``."""
    a, b = _flat(old), _flat(new)
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def resumed_config(out_dir: Path, cfg: SweepConfig, extend: bool) -> SweepConfig:
    """The config to continue ``out_dir`` with: ``cfg`` when it matches the stored sweep, the union with --extend.

    Refuses (one line, naming the differences) a change of settings, and a change of plan without --extend.
    """
    stored = build_config("quick", None, out_dir / "sweep.toml")
    changed = differences(settings(stored), settings(cfg))
    if changed:
        raise ConfigError(f"--resume: these settings differ from the sweep's in {out_dir} ({'; '.join(changed[:4])}"
                          f"{'; ...' if len(changed) > 4 else ''}); a report must not mix records made under two "
                          "settings: resume without changing them, or start a new --out")
    if stored.shard != cfg.shard:
        def name(shard: tuple[int, int] | None) -> str:
            return f"shard {shard_text(shard)}" if shard else "not sharded"

        raise ConfigError(f"--resume: the sweep in {out_dir} is {name(stored.shard)} and this command's is "
                          f"{name(cfg.shard)}; resume each shard with its own --shard (or none)")
    recorded = load_toml(out_dir / "sweep.toml").get("sources_sha256") or {}  # the files when the sweep started
    _check_sources(recorded, cfg.to_dict().get("sources_sha256") or {}, out_dir)
    plan_changes = differences({k: stored.to_dict().get(k) for k in PLAN_KEYS},
                               {k: cfg.to_dict().get(k) for k in PLAN_KEYS})
    if not plan_changes:
        return cfg
    if not extend:
        raise ConfigError(f"--resume: the plan differs from the sweep's in {out_dir} ({'; '.join(plan_changes)[:300]}); "
                          "pass --extend to add workloads, technique sets or repeats to it on purpose")
    sets = list(dict.fromkeys([*stored.techniques, *cfg.techniques]))
    return SweepConfig(
        **{**{k: getattr(stored, k) for k in ("name", "seed", "device", "nproc", "nnodes", "threads", "mode",
                                              "budget", "shard")},
           # the price changes no measurement: the one given now wins, else the stored one
           **({k: getattr(cfg, k) for k in ("price_per_hour", "instance", "prices")} if cfg.price is not None
              else {k: getattr(stored, k) for k in ("price_per_hour", "instance", "prices")}),
           "workloads": tuple(dict.fromkeys([*stored.workloads, *cfg.workloads])),
           "models": tuple(dict.fromkeys([*stored.models, *cfg.models])),
           "technique_plugins": tuple(dict.fromkeys([*stored.technique_plugins, *cfg.technique_plugins])),
           "techniques": tuple(sets),
           "repeats": max(stored.repeats, cfg.repeats),
           "max_repeats": stored.max_repeats, "decide_within": cfg.decide_within, "order": cfg.order,
           "isolation": cfg.isolation})


def _check_sources(stored: dict[str, str], now: dict[str, str], out_dir: Path) -> None:
    """A user's model or technique file edited since the sweep started: its records and the new ones would mix."""
    for source in sorted(set(stored) & set(now)):
        if stored[source] != now[source]:
            raise ConfigError(f"--resume: {source.rpartition(':')[0]} changed since the sweep in {out_dir} started "
                              f"(sha256 {stored[source][:12]}... then, {now[source][:12]}... now); a report must not "
                              "mix two versions of it: restore the file, or start a new --out")


def check_records(hashes: list[str], expected: str, out_dir: Path) -> None:
    """Records made under other settings (a hand-edited sweep.toml) are not continued."""
    other = [h for h in hashes if h and h != expected]
    if other:
        raise ConfigError(f"--resume: {out_dir}/results.jsonl holds {len(other)} record(s) made under other settings "
                          f"(settings hash {other[0]}, this sweep's {expected}); start a new --out")


# ---- temporary directories of trial processes -------------------------------------------------------------------


def temp_prefix() -> str:
    return f"{TEMP_PREFIX}{os.getpid()}-"


def remove_stale_temp_dirs(root: Path | None = None) -> list[Path]:
    """Remove trial directories whose runner process is gone (killed with -9, or the machine rebooted)."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in root.glob(f"{TEMP_PREFIX}*"):
        match = re.match(rf"{TEMP_PREFIX}(\d+)-", path.name)
        if match and path.is_dir() and not psutil.pid_exists(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.info("removed %d temporary trial director(ies) left by a runner that died", len(removed))
    return removed


__all__ = ["LOCK_NAME", "SweepLock", "check_new", "check_records", "check_resumable",
           "differences", "make_dir", "remove_stale_temp_dirs", "resumed_config", "settings", "settings_hash",
           "temp_prefix"]
