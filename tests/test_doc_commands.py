"""Every command in README.md and docs/*.md runs as written: the shell blocks' commands, and the inline
``python -m bench ...`` spans that name no placeholder.

A command that would run a sweep or a search is parsed by the CLI's own parser and, for ``sweep``, resolved into its
validated config (``sweep_config_from_args``: workloads, techniques and options, presets, repeats) without running
anything; the cheap ones run (``bench list``) or are checked where they point (``scripts/``, ``pytest`` paths, tox
environments, pyproject extras). A shell command this file does not know fails, so a new kind of command in the docs
gets a check here.
"""

from __future__ import annotations

import configparser
import contextlib
import functools
import io
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from bench.cli import build_parser, sweep_config_from_args
from bench.core.files import REPO_DIR

DOCS = [REPO_DIR / "README.md", *sorted((REPO_DIR / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
INLINE = re.compile(r"`((?:\.venv/bin/)?python -m bench [^`]+)`")
# Upper-case words stand for what the reader fills in (DIR, FILE.toml, NAME): such an inline span is a synopsis.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{1,}\b|\.\.\.|[<>{}|\[]")  # [--peaks]: an optional part
# Files a command names that a reader writes, not this repository, each with its reason.
READERS_FILES = {"my_model.py": "docs/models.md's command for the reader's own model file",
                 "my_technique.py": "docs/plugins.md's command for the reader's own technique file"}
# Commands that run only after another has made what they need, each with its reason.
AFTER_ANOTHER = {".tox/bench/bin/pytest-benchmark": "tox -e bench creates it (docs/overhead.md runs that first)"}


def _commands() -> list[tuple[str, str]]:
    """(where, command) for every command of every shell block (continuations joined, comments dropped, ``&&``
    chains split) and every inline bench command without a placeholder."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        name = str(doc.relative_to(REPO_DIR))
        for block in SHELL_BLOCK.finditer(text):
            for line in block.group(1).replace("\\\n", " ").splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line).strip()
                found += [(name, part.strip()) for part in line.split("&&") if part.strip()]
        for span in INLINE.finditer(text):
            if not PLACEHOLDER.search(span.group(1).removeprefix(".venv/bin/python -m bench")):
                found.append((f"{name} (inline)", span.group(1)))
    return found


COMMANDS = _commands()


def _bench(argv: list[str]) -> None:
    """Parse a bench command as the CLI would, and resolve a sweep's settings; nothing runs. A bare command name
    (prose naming ``python -m bench export``) must be a command: its --help works."""
    if argv == ["list"]:  # cheap: it runs
        assert _bench_list() == 0
        return
    if len(argv) == 1 and not argv[0].startswith("-"):
        argv = [argv[0], "--help"]
    if "--help" in argv or "-h" in argv:
        with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as done:
            build_parser().parse_args(argv)
        assert done.value.code == 0, f"{argv} is not a command with --help"
        return
    args = build_parser().parse_args(argv)
    if args.command == "sweep":
        files = [f.rpartition("=")[2].partition(":")[0] for f in (args.model or []) + (args.technique or [])]
        if not any(f in READERS_FILES for f in files):
            sweep_config_from_args(args, None)


@functools.cache
def _bench_list() -> int:
    proc = subprocess.run([sys.executable, "-m", "bench", "list"], cwd=REPO_DIR, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "workloads" in proc.stdout.lower(), proc.stdout[:200]
    return proc.returncode


def _tox_envs() -> set[str]:
    ini = configparser.ConfigParser()
    ini.read(REPO_DIR / "tox.ini")
    return {s.removeprefix("testenv:") for s in ini.sections() if s.startswith("testenv:")} | {"tests"}


def check(command: str) -> None:
    """Run or check one command; raise AssertionError (or the parser's SystemExit) when it would not work."""
    words = shlex.split(command)
    if words[0] == "sudo":
        words = words[1:]
    if words[:3] in (["python", "-m", "bench"], [".venv/bin/python", "-m", "bench"]):
        _bench(words[3:])
    elif words[:3] == [".venv/bin/python", "-m", "pytest"] or words[:2] == ["pytest", "-q"]:
        paths = [w for w in words[3:] if not w.startswith("-") and "/" in w]
        assert all((REPO_DIR / p.split("::")[0]).exists() for p in paths), paths
    elif words[0] == "bash" and words[1].startswith("scripts/"):
        script = REPO_DIR / words[1]
        assert script.is_file(), words[1]
        for verb in words[2:]:  # an option or a verb the script must handle
            assert verb in script.read_text(), f"{words[1]} does not handle {verb}"
    elif words[0] in (".venv/bin/python", "python") and words[1].startswith("scripts/"):
        proc = subprocess.run([sys.executable, words[1], "--help"], cwd=REPO_DIR, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        options = {w.split("=")[0] for w in words[2:] if w.startswith("-")}
        assert all(o in proc.stdout for o in options), (options, proc.stdout)
    elif words[:2] == ["tox", "-e"]:
        assert words[2] in _tox_envs(), words[2]
    elif words[:3] == ["pip", "install", "-e"]:
        extras = re.fullmatch(r"\.\[(.*)\]", words[3]).group(1).split(",")
        declared = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert set(extras) <= set(declared), extras
    elif words[0] in AFTER_ANOTHER:
        pass
    else:
        raise AssertionError(f"no check for {command!r}: add one to tests/test_doc_commands.py")


def test_the_docs_have_commands_and_the_readme_has_its_two():
    assert len(COMMANDS) > 30
    readme = [c for w, c in COMMANDS if w == "README.md"]
    assert "bash scripts/setup.sh --test" in readme and ".venv/bin/python -m pytest -q -n auto" in readme
    assert ".venv/bin/python -m bench sweep" in readme


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w}: {c[:60]}" for w, c in COMMANDS])
def test_each_command_in_the_docs_runs_as_written(where, command):
    try:
        check(command)
    except SystemExit as exc:  # argparse's exit on a bad option
        pytest.fail(f"{where}: {command!r} does not parse (exit {exc.code})")


def test_a_command_that_does_not_run_is_caught():
    with pytest.raises(SystemExit):
        check("python -m bench sweep --repeats -1 --bogus")
    with pytest.raises(Exception, match="unknown technique"):
        check("python -m bench sweep --techniques bf17")
    with pytest.raises(AssertionError):
        check("bash scripts/setup.sh --tests")  # the option is --test
    with pytest.raises(AssertionError, match="no check for"):
        check("curl https://example.com | sh")
