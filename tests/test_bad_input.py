"""A user's mistake gets one line that says what is wrong and what is valid, exit code 2, and changes nothing.

Each case below once raised a traceback, ran something silently, or wrote into a directory it did not own. The
command runs in-process (``bench.cli.main``); every file under the test's directory is hashed before and after.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.cli import main
from bench.plan.config import build_config
from bench.run.sweepdir import SweepLock, settings_hash
from tests.records import record


def _sweep_dir(root: Path, lines: list[str] | None = None) -> Path:
    """A sweep directory as a finished smoke sweep leaves it (sweep.toml, env.json, results.jsonl)."""
    out = root / "sweep"
    out.mkdir()
    cfg = build_config("smoke", {"workloads": "mlp", "techniques": "baseline", "repeats": 1})
    (out / "sweep.toml").write_text(cfg.to_toml())
    (out / "env.json").write_text("{}\n")
    if lines is None:
        rec = record(final=0.5)
        rec.config_hash = settings_hash(cfg)
        lines = [rec.to_json()]
    (out / "results.jsonl").write_text("".join(line + "\n" for line in lines))
    return out


def _record_lines() -> list[str]:
    return [record(final=0.5, seed=s).to_json() for s in range(3)]


def _toml(root: Path, text: str) -> Path:
    path = root / "sweep.toml"
    path.write_text(text)
    return path


Case = Callable[[Path], list[str]]

CASES: dict[str, tuple[Case, str]] = {
    "toml budget a number": (lambda r: ["--config", str(_toml(r, "budget = 5"))],
                             "budget must be a table of budget keys"),
    "toml budget an array": (lambda r: ["--config", str(_toml(r, "budget = [1]"))],
                             "budget must be a table of budget keys"),
    "toml techniques of numbers": (lambda r: ["--config", str(_toml(r, "techniques = [1]"))],
                                   "techniques must be a comma-separated string or an array of strings"),
    "toml workloads a table": (lambda r: ["--config", str(_toml(r, "[workloads]\nmlp = 1"))],
                               "workloads must be a comma-separated string or an array of strings"),
    "toml repeats a fraction": (lambda r: ["--config", str(_toml(r, "repeats = 2.7"))],
                                "repeats must be a whole number of at least 1, or \"auto\"; got 2.7"),
    "toml memory a number": (lambda r: ["--config", str(_toml(r, "[budget]\nmemory = 1"))],
                             "budget.memory must be true or false, got 1 (int)"),
    "config a directory": (lambda r: ["--config", str(r)], "is a directory; give a TOML file"),
    "config a binary file": (lambda r: ["--config", str(_binary(r))], "is not a text file"),
    "out a regular file": (lambda r: ["--out", str(_file(r))], "is a file, not a directory"),
    "out under a regular file": (lambda r: ["--out", str(_file(r) / "sub")], "cannot write there"),
    "out holding other files": (lambda r: ["--out", str(_others(r))],
                                "is not empty (it holds 'notes.txt', 'report.md'); a new sweep needs a new or empty"),
    "out holding a sweep": (lambda r: ["--out", str(_sweep_dir(r))], "is not empty (it holds 'env.json', "
                            "'results.jsonl', 'sweep.toml'); pass --resume to continue the sweep there"),
    "resume a missing directory": (lambda r: ["--resume", "--out", str(r / "typo")],
                                   "no such directory, so nothing to continue"),
    "resume a directory without a sweep": (lambda r: ["--resume", "--out", str(_others(r))],
                                           "the directory holds no sweep (no sweep.toml)"),
    "resume over a corrupt middle line": (
        lambda r: ["--resume", "--out", str(_sweep_dir(r, [_record_lines()[0], "{not json", _record_lines()[1]]))],
        "results.jsonl:2 is not valid JSON"),
    "resume over an unknown schema": (
        lambda r: ["--resume", "--out", str(_sweep_dir(r, [json.dumps({"schema_version": 7})]))],
        "results.jsonl:1: record schema_version 7 is not supported"),
    "resume over a record missing fields": (
        lambda r: ["--resume", "--out", str(_sweep_dir(r, [json.dumps({"schema_version": 2, "trial_id": "x"})]))],
        "results.jsonl:1: record is missing the field"),
    "resume over a JSON array line": (
        lambda r: ["--resume", "--out", str(_sweep_dir(r, ["[1, 2]"]))], "a record is a JSON object, got list"),
    "resume with another budget": (lambda r: ["--resume", "--out", str(_sweep_dir(r)), "--window-seconds", "3"],
                                   "settings differ from the sweep's in"),
    "resume with more workloads": (lambda r: ["--resume", "--out", str(_sweep_dir(r)), "--workloads", "mlp,gpt"],
                                   "pass --extend to add workloads"),
    "extend without resume": (lambda r: ["--extend", "--out", str(r / "new")], "--extend grows a sweep that exists"),
    "a second sweep on a locked directory": (lambda r: ["--resume", "--out", str(_locked(r))],
                                             "another sweep (pid"),
    "threads beyond the machine": (lambda r: ["--threads", "100000"], "threads must be between 0"),
    "a NaN timeout": (lambda r: ["--timeout", "nan"], "budget.timeout_s must be a finite number, got nan"),
    "an infinite window": (lambda r: ["--window-seconds", "inf"], "budget.min_seconds must be a finite number"),
    "a billion repeats": (lambda r: ["--repeats", "1000000000"], "at most 10,000 per sweep"),
    "a 10,000-character name": (lambda r: ["--techniques", "x" * 10_000], "(10000 characters) (known: "),
    "a name with a newline": (lambda r: ["--workloads", "mlp\nrm -rf"], "unknown workload 'mlp\\nrm -rf'"),
}

_HELD: list[SweepLock] = []


def _binary(root: Path) -> Path:
    path = root / "model.bin"
    path.write_bytes(bytes(range(256)) * 4)
    return path


def _file(root: Path) -> Path:
    path = root / "results.txt"
    path.write_text("mine\n")
    return path


def _others(root: Path) -> Path:
    out = root / "papers"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "report.md").write_text("# my report\n")
    return out


def _locked(root: Path) -> Path:
    out = _sweep_dir(root)
    lock = SweepLock(out)
    lock.acquire()  # as a running sweep holds it (flock conflicts across open files, even in one process)
    _HELD.append(lock)
    return out


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".trainbench.lock"}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_sweep_input_is_one_line_exit_2_and_changes_nothing(name, tmp_path, capsys):
    make_args, message = CASES[name]
    args = make_args(tmp_path)
    before = _tree(tmp_path)
    try:
        rc = main(["sweep", "--preset", "smoke", *args])
    finally:
        while _HELD:
            _HELD.pop().release()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert "Traceback" not in err and len(err) < 1200
    assert _tree(tmp_path) == before  # nothing written, nothing overwritten
