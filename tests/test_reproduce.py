"""A report's "Reproduce" line is the command that makes its sweep again (bench.report.reproduce): the report's own
directory, not the temporary --out it ran with, and the design it recorded, not the preset's design of today."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from bench.cli import build_parser, sweep_config_from_args
from bench.core.files import REPO_DIR
from bench.dev.docs_tables import named_examples
from bench.plan.config import RECORDED_KEYS
from bench.records import reader
from bench.report import reproduce

# Every committed report (the examples the docs name: never a folder a user's sweep left in the working tree); the
# sides of an A/B run are compared, not reported (scripts/rerender_examples.py).
REPORTS = sorted(p.parent for d in named_examples() for p in d.glob("**/report.md"))


def test_a_temporary_out_becomes_the_reports_own_directory(tmp_path):
    line = reproduce.rerun_command("python -m bench sweep --workloads mlp --out /tmp/quick-auto8", tmp_path)
    assert line == f"python -m bench sweep --workloads mlp --out {tmp_path}"
    inside = REPO_DIR / "reports" / "example-cpu"
    assert reproduce.rerun_command("python -m bench sweep --out=/tmp/x", inside) == \
        "python -m bench sweep --out reports/example-cpu"


def test_a_sweep_is_pinned_to_its_recorded_settings_and_a_temporary_config_replaced():
    d = REPO_DIR / "reports" / "example-cpu"
    line = reproduce.rerun_command("python -m bench sweep --config /tmp/bneck.toml --resume --out /tmp/x", d, {"repeats": 3})
    assert line == "python -m bench sweep --config reports/example-cpu/sweep.toml --out reports/example-cpu"


def test_a_sweep_of_model_files_pins_its_repeats_design_only(tmp_path):
    # sweep.toml records a model by the absolute path it had on the machine that ran it: not portable.
    settings = {"models": ["lstm=/elsewhere/lstm.py:build"], "repeats": 3, "max_repeats": 0}
    line = reproduce.rerun_command("python -m bench sweep --model lstm.py:build --out o", tmp_path, settings)
    assert line == f"python -m bench sweep --model lstm.py:build --repeats 3 --out {tmp_path}"
    sequential = {**settings, "max_repeats": 8}
    assert "--repeats 3 --max-repeats 8" in reproduce.rerun_command("python -m bench sweep --model m.py:b", tmp_path,
                                                                    sequential)
    given = reproduce.rerun_command("python -m bench sweep --model m.py:b --repeats 5", tmp_path, settings)
    assert given.count("--repeats") == 1


def test_other_commands_and_unparsable_lines_are_shown_as_recorded(tmp_path):
    assert reproduce.rerun_command("python -m bench tune --workloads gpt:tiny --config c.toml --out /tmp/t", tmp_path) == \
        f"python -m bench tune --workloads gpt:tiny --config c.toml --out {tmp_path}"
    assert reproduce.rerun_command("torchrun train.py", tmp_path) == "torchrun train.py"
    assert reproduce.rerun_command("python -m bench sweep 'unclosed", tmp_path) == "python -m bench sweep 'unclosed"
    assert reproduce.rerun_command(None, tmp_path) is None


def _line(d: Path, rerun: bool = False) -> str:
    source = reader.load([d]).sources[0]
    made = reproduce.rerun_command if rerun else reproduce.command
    return made(source.env.get("command"), source.path, source.settings)


@pytest.mark.parametrize("d", REPORTS, ids=lambda d: str(d.relative_to(REPO_DIR)))
def test_each_committed_report_shows_the_line_that_remakes_it(d):
    block = re.search(r"Reproduce:\n\n```\n(.*?)\n```", (d / "report.md").read_text(), re.S)
    assert block, f"{d}/report.md has no Reproduce block"
    # `python -m bench reproduce DIR` (for a sweep; a tune search's line reruns it), then the line that re-renders
    shown = block.group(1)
    assert shown.startswith(_line(d) + "\n"), f"re-render it: python scripts/rerender_examples.py ({d})"


def test_a_sweeps_reproduce_line_reruns_and_compares_then_says_how_to_rerun_alone(tmp_path):
    recorded = "python -m bench sweep --workloads mlp --out /tmp/quick-auto8"
    line = reproduce.command(recorded, tmp_path, {"repeats": 3})
    assert line.splitlines() == [f"python -m bench reproduce {tmp_path}",
                                 f"# or, to rerun without comparing: python -m bench sweep --workloads mlp --config "
                                 f"{tmp_path}/sweep.toml --out {tmp_path}"]
    assert reproduce.command(recorded, tmp_path) == reproduce.rerun_command(recorded, tmp_path)  # no sweep.toml


def _made_by_sweep(d: Path) -> bool:
    """A sweep's directory (a tune's keeps its own settings in tune.toml, read back by ``tune --resume``)."""
    command = json.loads((d / "env.json").read_text()).get("command") or ""
    return (d / "sweep.toml").is_file() and command.startswith("python -m bench sweep")


@pytest.mark.parametrize("d", [d for d in REPORTS if _made_by_sweep(d)], ids=lambda d: str(d.relative_to(REPO_DIR)))
def test_each_committed_sweeps_line_resolves_to_the_settings_it_recorded(d):
    words = shlex.split(_line(d, rerun=True))[3:]
    cfg = sweep_config_from_args(build_parser().parse_args(words), None)
    recorded = {k: v for k, v in tomllib.loads((d / "sweep.toml").read_text()).items() if k not in RECORDED_KEYS}
    resolved = tomllib.loads(cfg.to_toml())
    assert resolved.get("max_repeats", 0) == recorded.get("max_repeats", 0), "the repeats design differs"
    for key, value in recorded.items():  # keys added to the harness since the sweep ran take their defaults
        if key == "budget":
            assert {k: resolved["budget"][k] for k in value} == value
        elif key == "models":  # recorded by absolute path on the machine that ran it: the names must agree
            assert [m.partition("=")[0] for m in resolved[key]] == [m.partition("=")[0] for m in value]
        else:
            assert resolved.get(key) == value, key
