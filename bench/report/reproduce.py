"""A report's "Reproduce" line, and the words of ``python -m bench reproduce DIR``'s answers.

The Reproduce line of a sweep (a directory with its sweep.toml) is ``python -m bench reproduce DIR``: it reruns the
recorded configuration into a new directory and compares the new run with the recorded one (``reproduce_answer``
words the result of each configuration). Its second line is the command that makes the sweep again without
comparing (``rerun_command``), which ``reproduce`` runs.

env.json records the command as it was typed. Three things in it can stop meaning what they meant then:

- ``--out`` may name a temporary directory (``--out /tmp/quick-auto8``): the line names the report's own directory.
- a setting left to the preset follows the preset's value of today, not of the day the sweep ran (the quick preset's
  ``repeats`` became ``auto`` after ``reports/example-cpu`` was made with 3 fixed repeats): a sweep's line loads the
  settings it resolved and recorded, ``--config DIR/sweep.toml``, so every setting the command did not give is
  pinned too. A ``--config`` the command named (often a temporary file) is replaced by that recorded one. A sweep
  of ``--model`` or ``--technique`` files records them by their absolute paths on the machine that ran it, so its
  line keeps its own flags and pins the repeats design alone (``--repeats 3``).
- ``--resume`` and ``--extend`` continued a sweep that exists; to make it again they are dropped.

The flags the command gave are kept as typed: they are what its author chose, and they equal the recorded settings
(``tests/test_docs.py`` checks that each committed report's line resolves to its recorded sweep.toml).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from bench.analyze import stats
from bench.analyze.compare import EnvDifference, MetricComparison
from bench.core import words
from bench.core.files import REPO_DIR
from bench.core.text import shown
from bench.core.words import say
from bench.records import reader
from bench.records.reader import InputError

DROPPED = ("--resume", "--extend")  # flags without a value that continue a sweep rather than make one
REPLACED = ("--out", "--config")  # flags with a value that the line rewrites


def shown_path(path: Path, root: Path = REPO_DIR) -> str:
    """``path`` relative to the repository when it lies inside it (``reports/example-cpu``), else as given."""
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


RERUN = "# or, to rerun without comparing: "  # the Reproduce line's second line starts so


def command(recorded: str | None, directory: Path, settings: dict[str, Any] | None = None,
            root: Path = REPO_DIR) -> str | None:
    """The Reproduce line of the sweep in ``directory``: ``python -m bench reproduce DIR`` (rerun into a new
    directory and compare), then, as a second line, ``rerun_command``'s line that makes it again without comparing.
    ``recorded`` is env.json's command; ``settings`` is the sweep.toml the sweep wrote (None: there is none, so
    nothing to rerun it from: the recorded line alone, as ``rerun_command`` gives it)."""
    rerun = rerun_command(recorded, directory, settings, root)
    if settings is None:
        return rerun
    line = shlex.join(["python", "-m", "bench", "reproduce", shown_path(directory, root)])
    return line if rerun is None else f"{line}\n{RERUN}{rerun}"


def rerun_command(recorded: str | None, directory: Path, settings: dict[str, Any] | None = None,
                  root: Path = REPO_DIR) -> str | None:
    """The line that makes the sweep in ``directory`` again, from the ``recorded`` command (env.json's); None when
    nothing was recorded. ``settings`` is the sweep.toml the sweep wrote (None: there is none to pin with)."""
    if not recorded:
        return None
    try:
        words = shlex.split(recorded)
    except ValueError:  # not a command line we can take apart: shown as it was recorded
        return recorded
    if words[:3] != ["python", "-m", "bench"] or len(words) < 4 or words[3] not in ("sweep", "tune"):
        return recorded
    kept, skip = [], False
    for word in words[4:]:
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in REPLACED and (name != "--config" or words[3] == "sweep"):
            skip = "=" not in word
            continue
        if word in DROPPED:
            continue
        kept.append(word)
    here = shown_path(directory, root)
    if words[3] == "sweep" and settings is not None:
        kept += _pinned(kept, settings, f"{here}/sweep.toml")
    return shlex.join([*words[:4], *kept, "--out", here])


def _pinned(given: list[str], settings: dict[str, Any], toml: str) -> list[str]:
    """The flags that pin what ``given`` left to the preset: the recorded sweep.toml; or, where it names a model or
    technique file by the path it had on the machine that ran it (not portable), the repeats design alone."""
    if not (settings.get("models") or settings.get("technique_plugins")):
        return ["--config", toml]
    if any(w.split("=", 1)[0] == "--repeats" for w in given) or "repeats" not in settings:
        return []
    cap = settings.get("max_repeats") or 0
    return ["--repeats", str(settings["repeats"]), *(["--max-repeats", str(cap)] if cap else [])]


# ---- python -m bench reproduce DIR --------------------------------------------------------------------------------


def rerun_words(directory: Path) -> list[str]:
    """The command that makes the sweep in ``directory`` again, as words after ``python -m bench`` (``sweep ...`` or
    ``tune ...``, ending in ``--out DIR``): its recorded command (env.json) as ``rerun_command`` pins it, or, for a
    sweep not made by the command line (``bench.sweep`` from Python), its recorded settings (``sweep --config
    DIR/sweep.toml``). ``InputError`` (one line) when ``directory`` holds no sweep to rerun."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory} is not a directory (give a sweep directory: one that holds sweep.toml and "
                         "results.jsonl, e.g. reports/example-cpu)")
    if not (directory / "sweep.toml").is_file():
        raise InputError(f"{directory} holds no sweep.toml, so no recorded configuration to rerun (give a sweep "
                         "directory, e.g. reports/example-cpu)")
    source = reader.read_source(directory)  # no results.jsonl, or a record of the wrong shape: one line
    if source.settings is None:
        raise InputError(f"{directory / 'sweep.toml'} cannot be read (not TOML): restore it")
    line = rerun_command(source.env.get("command"), directory, source.settings)
    words = shlex.split(line) if line else []
    if words[:3] == ["python", "-m", "bench"] and words[3:4] in (["sweep"], ["tune"]):
        return words[3:]
    if (directory / "tune.toml").is_file():
        raise InputError(f"{directory} holds a search that `bench tune` did not record as a command "
                         f"({shown(line or 'no command')}); rerun it with python -m bench tune")
    return ["sweep", "--config", f"{shown_path(directory)}/sweep.toml", "--out", shown_path(directory)]


def reproduce_answer(throughput: MetricComparison, threshold: float) -> tuple[str, str]:
    """One configuration of ``bench reproduce``: its answer and what it rests on, from the comparison of the new
    run's throughput (NEW) with the committed run's (BASE) through the one verdict engine.

    - ``reproduced``: the ratio new / committed is equivalent within ``threshold`` (its whole interval inside it);
    - ``differs``: faster or slower (its whole interval beyond it), with the ratio and its interval;
    - ``cannot tell``: inconclusive (and about how many pairs would decide it) or too few pairs (or not measured)."""
    est, verdict = throughput.estimate, throughput.verdict
    ratio = "-"
    if est is not None and est.value is not None:
        ratio = f"{est.value:.2f}x" + (f" [{est.lo:.2f}, {est.hi:.2f}]" if est.has_interval else "")
        ratio += f" new/committed ({est.n} {'pair' if est.paired else 'trial'}{'' if est.n == 1 else 's'})"
    if verdict == stats.EQUIVALENT:
        return say("reproduced", words.REPRODUCE), f"{ratio}: {say(verdict)} within +-{threshold:.0%}"
    if verdict in ("faster", "slower"):
        return say("differs", words.REPRODUCE), f"{ratio}: {say(verdict)}, beyond +-{threshold:.0%}"
    cannot = say("cannot tell", words.REPRODUCE)
    if verdict == stats.INCONCLUSIVE:
        more = (f"about {throughput.needed} pairs would decide it" if throughput.needed is not None else
                "the estimate sits on the threshold, so more pairs may not decide it")
        return cannot, f"{say(verdict)}: {ratio}; {more}"
    if verdict == stats.NONE:
        few = "too few pairs" if est is None or est.paired else "too few trials"
        return cannot, f"{say(verdict)}, {few} ({throughput.why}); {ratio}, an estimate"
    why = {"BASE": "the committed run", "NEW": "the new run"}
    said = (say(words.NOT_COMPARABLE) if verdict == "not comparable" else say(verdict)) + (
        f" ({throughput.why})" if throughput.why else "")
    for side, name in why.items():
        said = said.replace(side, name)
    return cannot, f"throughput {said}"


def machine_difference(mismatch: list[EnvDifference], limit: int = 4) -> str | None:
    """One line naming how the new run's machine differs from the committed run's (env.json's fingerprints:
    ``bench.analyze.compare``'s environment differences), or None when they match."""
    if not mismatch:
        return None

    def value(v: Any) -> str:
        return "(absent)" if v is None else shown(v, 40)

    named = "; ".join(f"{d.key} {value(d.base)} -> {value(d.new)}" for d in mismatch[:limit])
    more = f"; and {len(mismatch) - limit} more" if len(mismatch) > limit else ""
    return (f"machine: this run's differs from the committed run's ({named}{more}), so a difference below may be the "
            "machine's, not the code's")


def answer_lines(comparison: Any, threshold: float, width: int = 100) -> list[str]:
    """``bench reproduce``'s answers as a terminal shows them, no line longer than ``width``: one row per
    configuration (its answer, then the ratio it rests on, wrapped under it), then the answers counted."""
    import textwrap

    rows = [(row.key.label, *reproduce_answer(row.throughput, threshold)) for row in comparison.rows]
    name_w = min(max((len(r[0]) for r in rows), default=13), 34)
    out = [f"{'configuration'.ljust(name_w)}  answer       throughput new/committed [95% CI] (threshold "
           f"{threshold:.0%})"]
    counts: dict[str, int] = {}
    for label, answer, detail in rows:
        counts[answer] = counts.get(answer, 0) + 1
        name = label if len(label) <= name_w else label[: name_w - 1] + "…"
        head = f"{name.ljust(name_w)}  {answer}" + " " * max(1, 13 - len(_visible(answer)))
        body = textwrap.wrap(detail, width - len(_visible(head))) or [""]
        out.append(head + body[0])
        out += [" " * len(_visible(head)) + more for more in body[1:]]
    out.append(", ".join(f"{answer} {n}" for answer, n in sorted(counts.items())) + f" of {len(rows)} "
               "configurations")
    return out


def _visible(text: str) -> str:
    """What a terminal shows of ``text``: the brackets ``say`` writes under ``marked()`` take no column."""
    return text.replace(words.MARK_OPEN, "").replace(words.MARK_CLOSE, "")
