"""The markdown report against golden files, its figures, escaping, the summary and `python -m bench report`.

The golden files are ``tests/fixtures/report/golden/<section>.md``, one per section of the report (and ``head.md``
for its title), rendered from the fixture sweep in ``tests/fixtures/report`` (``results.jsonl`` + ``env.json``,
written by ``make_fixture.py``). A new section brings its own golden file. When a change to the report is intended,
refresh them and review the diff:

    TRAINBENCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_report.py -k golden
    git diff tests/fixtures/report/golden/
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from bench import cli as cli_mod
from bench.records.frame import records_frame
from bench.records.reader import load
from bench.records.results import MemoryResult, ResultStore, TrialRecord
from bench.report import InputError, build, markdown, parse_formats, summary, write_report
from tests.conftest import REPO
from tests.records import calibrated, parity
from tests.records import record as make_record

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report"
GOLDEN = FIXTURE / "golden"
FIGURES = ["speedup", "memory", "pareto", "curves", "interaction"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report([FIXTURE], out_dir=out, formats=["md"])
    return out


@pytest.fixture(scope="module")
def parts() -> dict[str, str]:
    """The fixture's report, part by part as report.md holds it: its head, then each section by its anchor."""
    report = build([FIXTURE])[1]
    return {"head": "\n".join(markdown.head(report)),
            **{s.anchor: "\n".join(markdown.section(s, report.figures)) for s in report.sections}}


def test_markdown_report_matches_the_golden_files(parts):
    if os.environ.get("TRAINBENCH_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        for stale in set(GOLDEN.glob("*.md")) - {GOLDEN / f"{name}.md" for name in parts}:
            stale.unlink()
        for name, text in parts.items():
            (GOLDEN / f"{name}.md").write_text(text, encoding="utf-8")
        pytest.skip(f"golden files rewritten: {GOLDEN}")
    expected = {p.stem: p.read_text(encoding="utf-8") for p in GOLDEN.glob("*.md")}
    assert sorted(parts) == sorted(expected), (
        "a section without its golden file, or a golden file without its section: refresh them with "
        "TRAINBENCH_UPDATE_GOLDEN=1 (see this module's docstring)")
    for name, text in parts.items():
        if text != expected[name]:
            diff = "".join(difflib.unified_diff(expected[name].splitlines(True), text.splitlines(True), "expected",
                                                "rendered"))
            pytest.fail(f"section {name} differs from its golden file (if intended, refresh it with "
                        "TRAINBENCH_UPDATE_GOLDEN=1, see this module's docstring):\n" + diff[:6000])


def test_the_golden_parts_make_the_whole_report(parts, rendered):
    text = (rendered / "report.md").read_text(encoding="utf-8")
    assert text == "\n".join(parts.values()).rstrip("\n") + "\n"


def _markdown(dirs: list[Path], **kwargs) -> str:
    """The markdown report without rendering figures (fast; figure links are left out)."""
    return markdown.render(build(dirs, with_figures=False, **kwargs)[1])


def test_markdown_report_is_deterministic():
    assert _markdown([FIXTURE]) == _markdown([FIXTURE])


def test_every_linked_figure_is_written_as_png(rendered):
    text = (rendered / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", text)
    assert links == [f"figures/{name}.png" for name in FIGURES]
    for link in links:
        data = (rendered / link).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000


def test_report_says_what_the_fixture_holds(rendered):
    text = (rendered / "report.md").read_text()
    # the headline numbers, the failed and the skipped trial, the noise warning and the claims check
    assert "fastest: bf16 at 1.90x [1.74, 2.08] faster" in text  # paired t over the three seeds' ratios
    assert "same quality at equal samples (exact): grad_accum:steps=4\n" in text
    assert "| gpt:tiny | bf16+grad_accum:steps=4 | 2 | failed | RuntimeError: simulated failure" in text
    assert "| mlp:tiny | checkpointing | 0 | skipped | checkpointing: workload 'mlp' exposes no model.blocks" in text
    assert "bf16 on gpt:tiny: 1 of 3 timed windows were contended (left out of its speed numbers)" in text
    # two seeds left after the gpt failure and bf16's contended window: an estimate, no verdict
    assert "| 1.24x | 1.20x | 0.98 [0.33, 2.90] | no verdict (2 repeats: a verdict needs 3) |" in text
    assert "| 1.33x | 1.30x | 0.98 [0.91, 1.06] | consistent with multiplying |" in text
    assert "| bf16 | mlp:tiny | speedup 1.5-2x on NVIDIA V100/A100" in text and "inconclusive (the estimate lies inside the claimed range" in text
    assert "python -m bench sweep --workloads mlp,gpt" in text


def _hostile_copy(tmp_path: Path) -> Path:
    """The fixture sweep with a workload and a technique set named like an attack on the renderers."""
    out = tmp_path / "hostile"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    for r in ResultStore(FIXTURE / "results.jsonl").read():
        d = r.to_dict()
        if d["workload"]["name"] == "mlp":
            d["workload"]["name"] = "<script>alert(1)</script>"
        if d["technique_label"] == "bf16":
            d["technique_label"] = "bf16|<b>x</b>*y*[l](javascript:alert(2))"
        store.append(TrialRecord.from_dict(d))
    return out


def test_markdown_escapes_names_from_records(tmp_path):
    text = _markdown([_hostile_copy(tmp_path)])
    assert "<script>" not in text and "<b>" not in text and "](javascript" not in text
    assert "### &lt;script>alert(1)&lt;/script>:tiny" in text
    row = next(line for line in text.splitlines() if line.startswith("| bf16\\|"))
    assert row.startswith("| bf16\\|&lt;b>x&lt;/b>\\*y\\*[l]\\(javascript:alert(2)) |")
    assert len(re.findall(r"(?<!\\)\|", row)) == 15  # 14 columns: the name's '|' does not add a cell
    assert markdown.escape("a\nb  c") == "a b c"


def test_summary_rows_come_from_the_analysis():
    rows = summary.summarize(ResultStore(FIXTURE / "results.jsonl").read())
    by = {(r.workload, r.techniques): r for r in rows}
    bf = by[("mlp:tiny", "bf16")]
    assert (bf.n_ok, bf.n_total, bf.samples_per_s, bf.speedup) == (3, 3, 1900.0, "1.90x [1.74, 2.08] faster")
    assert (bf.memory_ratio, bf.parity, bf.quality) == ("0.76x less", "ok", "+0.0033 [-0.0346, +0.0413] inconclusive")
    assert by[("mlp:tiny", "grad_accum:steps=4")].quality == "same (curves identical)"
    assert by[("mlp:tiny", "baseline")].speedup == "reference"
    assert by[("mlp:tiny", "checkpointing")].note.startswith("skipped: checkpointing: workload 'mlp'")
    assert by[("gpt:tiny", "bf16")].note == ("1 timed window(s) shared the CPU with other processes (left out of the "
                                             "speed numbers); no verdict: 2 pairs: a verdict needs 3; 1 contended "
                                             "quality run left out (its seed 1 25% of the cores used by other "
                                             "processes): a clock shared with other work is not this machine's")
    combo = by[("gpt:tiny", "bf16+grad_accum:steps=4")]
    assert combo.speedup == "1.20x [1.15, 1.26] (no verdict: 2 pairs: a verdict needs 3)"
    assert "no verdict: 2 pairs: a verdict needs 3" in combo.note
    md = summary.to_markdown(rows)
    assert "| mlp:tiny | bf16 | 3/3 | 1,900 | 1.90x [1.74, 2.08] faster |" in md
    assert summary.summarize([]) == []


def test_formats_are_validated():
    assert parse_formats("md, HTML") == ("md", "html")
    with pytest.raises(InputError, match=r"unknown report format 'pdf' \(valid formats: md, html\)"):
        parse_formats("md,pdf")


def test_cli_report_rerenders_and_rejects_bad_input(tmp_path, capsys):
    # In-process (bench.cli.main): the same code path as `python -m bench report`, without a second torch import.
    assert cli_mod.main(["report", str(FIXTURE), "--out", str(tmp_path), "--format", "html"]) == 0
    assert (tmp_path / "report.html").exists() and not (tmp_path / "report.md").exists()
    assert f"report: {tmp_path / 'report.html'}" in capsys.readouterr().out
    assert cli_mod.main(["report", str(FIXTURE), "--baseline", "fp32", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: reference technique set 'fp32' is not in these records (sets here: baseline, bf16, "
        "grad_accum:steps=4, bf16+grad_accum:steps=4, checkpointing)")
    assert cli_mod.main(["report", str(tmp_path / "nowhere")]) == 2
    assert "has no results.jsonl" in capsys.readouterr().err
    assert cli_mod.main(["report", str(FIXTURE), "--format", "pdf"]) == 2
    assert capsys.readouterr().err.strip() == "error: unknown report format 'pdf' (valid formats: md, html)"


def test_merging_two_machines_keeps_them_apart(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(FIXTURE / "results.jsonl", other / "results.jsonl")
    env = json.loads((FIXTURE / "env.json").read_text())
    env.update(hostname="laptop", cpu_model="Other CPU")
    (other / "env.json").write_text(json.dumps(env))
    text = _markdown([FIXTURE, other])
    assert "ran on 2 different machines or software stacks. Their numbers are kept apart" in text
    assert "### machine 1" in text and "### machine 2" in text
    assert "### mlp:tiny (machine 1)" in text and "### mlp:tiny (machine 2)" in text
    machine2 = text.split("- **mlp:tiny (machine 2)**\n")[1].split("\n- **")[0]
    assert machine2.startswith("  - MFU against the peak of this CPU's fastest calibrated dtype (bfloat16)")
    assert "\n  - fastest: bf16 at 1.90x [1.74, 2.08] faster" in machine2
    with pytest.raises(InputError, match="several sweep directories need an output directory"):
        write_report([FIXTURE, other])


def _rank(rss: int, at_rest: int, peak: int, state: dict) -> dict:
    return {"peak_rss_bytes": rss, "clean_rss": {"at_rest_bytes": at_rest, "peak_bytes": peak}, "model_state": state}


def test_sharded_trials_get_a_table_beside_the_zero_formula(tmp_path):
    out = tmp_path / "dist"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    n = 1_000_000  # parameters: ZeRO-3 with 2 ranks holds 16/2 bytes each
    formula = {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n, "total": 8 * n}
    for seed in (0, 1):
        for label, world in (("baseline", 1), ("zero3", 2)):
            ranks = [_rank(500 * 2**20, 400 * 2**20, 450 * 2**20,
                           {"params": 2 * n, "grads": 2 * n, "optimizer": 4 * n, "optimizer_scalars": 8})] * world
            memory = MemoryResult(peak_bytes=None, peak_source="", peak_reserved_bytes=None,
                                  peak_rss_bytes=600 * 2**20,
                                  clean_rss={"at_rest_bytes": 420 * 2**20, "peak_bytes": 520 * 2**20})
            if world > 1:
                memory = dataclasses.replace(memory, per_rank=ranks, model_state_bytes=8 * n, zero_stage=3,
                                             zero_formula_bytes=formula)
            store.append(make_record(label, seed, workload="mlp", size="large", n_params=n, world_size=world,
                                     sps=300.0 / world, step=0.5 * world, memory=memory, final=0.5,
                                     sweep_id="d"))
    text = _markdown([out])
    section = text.split("## Data-parallel and sharded trials", 1)[1].split("## Claims check", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| mlp:large")]
    assert rows[0].split(" | ")[1:6] == ["baseline", "1", "300", "300", "500.0 ms"]
    assert rows[0].split(" | ")[7] == "420 MiB / 520 MiB"  # one process: its own clean RSS pass
    assert rows[1].split(" | ")[1:11] == ["zero3", "2", "150", "75.0", "1.00 s", "500 MiB / 500 MiB",
                                          "400 MiB / 450 MiB", "7.6 MiB", "7.6 MiB (ZeRO-3)", "1.000"]
    assert "expect no speedup there" in section
    # The claims check reads the same bytes: ZeRO-3 on 2 ranks holds half of a full replica's 16 bytes/param.
    claim = next(line for line in text.splitlines() if line.startswith("| zero3 | mlp:large | model state"))
    assert "| 0.50x | within the claim |" in claim
    # The memory figure draws the largest rank's model state for the sharded set, and says so.
    figures = build([out])[1].figures
    assert "Hatched bars: multi-process sets" in figures["memory"].caption
    # No multi-process trial, no section.
    assert "## Data-parallel" not in _markdown([FIXTURE])


# ---- input: duplicated trials, bad records and bad output paths -----------------------------------------------


def _with_duplicates(tmp_path: Path, lines: list[int]) -> Path:
    """A copy of the fixture sweep whose ``lines`` (0-based) are written again at the end, 10x faster: counted
    twice, they would change the numbers (as two sweeps writing into one directory once did)."""
    out = tmp_path / "dup"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    text = (FIXTURE / "results.jsonl").read_text().splitlines()
    again = []
    for i in lines:
        d = json.loads(text[i])
        d["speed"]["samples_per_s"] *= 10
        again.append(json.dumps(d))
    (out / "results.jsonl").write_text("\n".join(text + again) + "\n")
    return out


def test_duplicated_trial_ids_are_counted_once_and_said(tmp_path):
    dup = _with_duplicates(tmp_path, [0, 1, 1, 2])  # three trial ids, one of them written three times
    note = (f"{dup / 'results.jsonl'} holds 3 duplicated trial ids (a second sweep wrote into the same "
            "directory?); each was counted once, the first record kept")
    text = _markdown([dup])
    assert f"\n> **Input:** {markdown.escape(note)}\n\n" in text
    kept = text.replace(f"> **Input:** {markdown.escape(note)}\n\n", "").replace(f"--out {dup}", "--out FIXTURE")
    assert kept == _markdown([FIXTURE]).replace("--out tests/fixtures/report", "--out FIXTURE")  # the first kept
    # A trial id is unique within a directory: two directories may both hold it (two machines, two A/B sides) ...
    sweep = load([FIXTURE, dup])
    assert [len(s.records) for s in sweep.sources] == [25, 25] and sweep.notes == [note]
    # ... but the same directory given twice is one sweep.
    sweep = load([FIXTURE, FIXTURE / ".." / "report"])
    assert [len(s.records) for s in sweep.sources] == [25]
    assert sweep.notes == [f"{FIXTURE / '..' / 'report'} was given twice; its trials were counted once"]


def test_reports_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    # every file goes through bench.core.files.write_atomic: a temporary file beside it, then os.replace
    replaced = []
    real = os.replace
    monkeypatch.setattr("bench.core.files.os.replace", lambda src, dst: (replaced.append(Path(dst).name), real(src, dst)))
    write_report([FIXTURE], out_dir=tmp_path)
    assert sorted(replaced) == sorted(["report.md", "report.html", *(f"{name}.png" for name in FIGURES)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figures", "report.html", "report.md"]  # no temporaries
    replaced.clear()
    assert cli_mod.main(["compare", str(FIXTURE), str(FIXTURE), "--out", str(tmp_path / "cmp.md")]) == 0
    assert replaced == ["cmp.md"]


_GOOD = (FIXTURE / "results.jsonl").read_text().splitlines()


def _bad(mutate) -> str:
    d = json.loads(_GOOD[1])
    mutate(d)
    return json.dumps(d)


# A second line of the wrong shape, and what the message about it says after "PATH:2" (bench.records.results words it; the
# test holds only what must be there, and that anything echoed from the line is cut short).
BAD_LINES = {
    "a JSON array": ("[1, 2]", "a record is a JSON object, got list"),
    "a field of the wrong type": (_bad(lambda d: d.update(workload="mlp")), "record.workload must be an object"),
    "a number given as text": (_bad(lambda d: d["speed"].update(samples_per_s="fast" * 500)),
                               "record.speed.samples_per_s must be a number"),
    "a curve point given as text": (_bad(lambda d: d["quality"]["curve"][1].__setitem__(4, "0.5")),
                                    "record.quality.curve[1][4] must be a number"),
    "a curve row too short": (_bad(lambda d: d["quality"]["curve"].__setitem__(1, [])),
                              "quality.curve[1] holds 0 values, but curve_columns names 5"),
    "a missing field": (_bad(lambda d: d.pop("trial_id")), "record is missing the field 'trial_id'"),
    "an unknown schema": (_bad(lambda d: d.update(schema_version="9" * 5000)), "is not supported"),
    "a corrupt middle line": ('{"sweep_id": "s", "trial', "is not valid JSON"),
    "a huge value": (_bad(lambda d: d.update(status="x\n" * 5000)), "status must be one of"),
}
PROC = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
BAD_OUTPUTS = [  # argv, the message after "error: "
    pytest.param(["report", "{sweep}", "--out", "{file}"],
                 "cannot write the report into {file}: {file} is a file, not a directory (--out DIR)",
                 id="report --out a regular file"),
    pytest.param(["report", "{sweep}", "--out", "{file}/sub"],
                 "cannot write the report into {file}/sub: {file} is a file, not a directory (--out DIR)",
                 id="report --out under a regular file"),
    pytest.param(["report", "{sweep}", "--out", "/proc/x", "--format", "md"],
                 "cannot write the report into /proc/x: No such file or directory", id="report --out /proc/x",
                 marks=PROC),
    pytest.param(["compare", "{sweep}", "{sweep}", "--out", "{file}/cmp.md"],
                 "cannot write {file}/cmp.md: {file} is a file, not a directory", id="compare --out under a file"),
    pytest.param(["compare", "{sweep}", "{sweep}", "--out", "/proc/x"],
                 "cannot write /proc/x: No such file or directory", id="compare --out /proc/x", marks=PROC),
    pytest.param(["compare", "{sweep}", "{sweep}", "--out", "{dir}"], "cannot write {dir}: Is a directory",
                 id="compare --out a directory"),
]
BAD_INPUTS = [
    *(pytest.param(["report", "{sweep}"], message, bad, id=f"report {name}") for name, (bad, message) in
      BAD_LINES.items()),
    *(pytest.param(["compare", "{base}", "{sweep}"], message, bad, id=f"compare {name}") for name, (bad, message) in
      BAD_LINES.items()),
    *(pytest.param(*p.values, None, id=p.id, marks=p.marks) for p in BAD_OUTPUTS),
]


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("argv", "expected", "bad_line"), BAD_INPUTS)
def test_bad_input_gets_one_line_and_exit_code_2(tmp_path, capsys, argv, expected, bad_line):
    paths = {"sweep": tmp_path / "sweep", "base": tmp_path / "base", "file": tmp_path / "file.txt",
             "dir": tmp_path / "dir"}
    shutil.copytree(FIXTURE, paths["sweep"])  # the report's default output directory is the sweep's own
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "compare" / "base", paths["base"])
    paths["file"].write_text("not a directory\n")
    paths["dir"].mkdir()
    if bad_line is not None:
        lines = [_GOOD[0], bad_line, *_GOOD[2:]]
        (paths["sweep"] / "results.jsonl").write_text("\n".join(lines) + "\n")
    before = _hashes(tmp_path)
    assert cli_mod.main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and err.endswith("\n")
    if bad_line is None:
        assert err == f"error: {expected.format(**paths)}\n"
    else:  # the file and the line, what is wrong, and no more than ~80 characters of the line's content
        where = f"error: {paths['sweep']}/results.jsonl:2"
        assert err.startswith(where) and expected in err and len(err) - len(where) < 250, err
    assert _hashes(tmp_path) == before  # nothing written, nothing changed


@pytest.mark.parametrize("command", ["report", "compare"])
def test_a_bug_in_the_analysis_shows_its_traceback(tmp_path, monkeypatch, command):
    # Bad input stops in the reader; past it, a KeyError is a bug of ours and must reach the caller as itself (not
    # as a user's "bad input", which would hide it behind one line and exit code 2).
    from bench.analyze import compare as compare_mod
    from bench.report import analysis_mod

    def planted(*args, **kwargs):
        raise KeyError("planted")

    monkeypatch.setattr(analysis_mod, "analyze", planted)
    monkeypatch.setattr(compare_mod, "compare_records", planted)
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep)
    argv = ["report", str(sweep)] if command == "report" else ["compare", str(sweep), str(sweep)]
    with pytest.raises(KeyError, match="planted"):
        cli_mod.main(argv)
    with pytest.raises(KeyError, match="planted"):
        build([sweep]) if command == "report" else compare_mod.compare_dirs(sweep, sweep)


def test_a_summary_without_speed_says_why():
    from bench.analyze import analysis
    from bench.report.sections.summary import _speed_points
    from tests.records import record

    def points(**kw):
        records = [record(label, seed=i, **kw) for label in ("baseline", "bf16") for i in range(3)]
        configs = analysis.configurations(records_frame(records), "baseline")
        return _speed_points(None, configs, configs[~configs["is_reference"].astype(bool)])

    assert points(contended=True) == [
        "speed not reported: every timed window here stayed contended (other processes used the cores; see the "
        "status column): measure again on an idle machine"]
    assert points(mode="quality", sps=None) == ["speed and memory not measured here (quality runs only: --mode quality)"]
    assert points(status="skipped", reason="needs CUDA") == [
        "nothing measured here: no trial of this workload finished ok (the status column says why)"]


def test_a_ratio_beside_one_but_not_clear_of_the_threshold_says_which_side_it_is_on():
    from bench.analyze import stats
    from bench.report.cells import ratio_cell

    assert ratio_cell(1.28, 1.02, 1.60, stats.INCONCLUSIVE).text == \
        "1.28x [1.02, 1.60] inconclusive (the whole interval above 1, not clear of the threshold)"
    assert ratio_cell(0.97, 0.96, 0.98, stats.EQUIVALENT).text == "0.97x [0.96, 0.98] equivalent"
    assert ratio_cell(1.01, 0.90, 1.10, stats.INCONCLUSIVE).text == "1.01x [0.90, 1.10] inconclusive"
    assert ratio_cell(1.30, 1.10, 1.50, "faster").text == "1.30x [1.10, 1.50] faster"


def _parity_cell(text: str, label: str) -> str:
    row = next(line for line in text.splitlines() if line.startswith(f"| {label} | "))
    return row.split(" | ")[-2]  # parity is the column before status


def test_the_parity_cell_says_the_answer_its_checks_and_how_the_tolerances_were_set(tmp_path):
    out = tmp_path / "parity"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    cases = {"bf16": calibrated(loss=0.1, harmless=0.03),  # beyond the old 5e-2, within 5 x 3e-2
             "tf32": calibrated(loss=0.3, harmless=0.08, bug=(0.3, 0.01)),  # the bug stays within both
             "fp16": calibrated(loss=0.2, harmless=0.01),
             "compile": parity("exact", loss=2e-3, tol=(1e-3, 1e-3))}  # a record written before calibration
    for seed in range(3):
        store.append(make_record(seed=seed, final=0.8))
        for label, result in cases.items():
            store.append(make_record(label, seed, final=0.8, parity_result=result))
    text = _markdown([out])
    assert _parity_cell(text, "bf16") == ("ok (loss 1.0e-01 ≤ 1.5e-01; distance 0.0e+00 ≤ 2.0e-02; tolerances 5 x a "
                                          "harmless jitter's drift (loss 3.0e-02), at least 5e-02, 2e-02)")
    assert _parity_cell(text, "tf32").startswith("no power (loss 3.0e-01 ≤ 4.0e-01 (a 10% LR bug: 3.0e-01, no "
                                                 "power); distance 0.0e+00 ≤ 4.0e-02 (a 10% LR bug: 1.0e-02, no power)")
    assert _parity_cell(text, "tf32").endswith("the check cannot tell a 10% learning-rate bug from harmless drift here")
    assert _parity_cell(text, "fp16").startswith("mismatch (loss 2.0e-01 > 5.0e-02;")
    assert _parity_cell(text, "compile") == ("mismatch (loss 2.0e-03 > 1.0e-03; distance 0.0e+00 ≤ 1.0e-03; fixed "
                                             "tolerances, not calibrated)")
    summary_rows = {r.techniques: r.parity for r in summary.summarize(store.read())}
    assert summary_rows == {"baseline": "-", "bf16": "ok", "tf32": "no power", "fp16": "mismatch",
                            "compile": "mismatch"}


def test_the_h200_records_say_their_parity_used_the_fixed_tolerances():
    text = _markdown([REPO / "reports" / "example-h200-first"])
    cells = [_parity_cell(text, label) for label in ("bf16", "tf32", "bf16+fp8")]
    assert all(cell.endswith("fixed tolerances, not calibrated)") for cell in cells)
    assert cells[0].startswith("mismatch in 1 of 2 trials (loss 6.5e-02 > 5.0e-02;")  # seed 1, in the spike
    assert cells[1].startswith("ok (loss 2.0e-02 ≤ 5.0e-02;")


def test_where_the_sweeps_time_went_adds_up_the_trials_stages(tmp_path):
    out = tmp_path / "timed"
    out.mkdir()
    shutil.copy(FIXTURE / "env.json", out / "env.json")
    store = ResultStore(out / "results.jsonl")
    stages = {"start": 0.2, "imports": 1.5, "build": 0.3, "quality_train": 1.0, "evaluation": 0.2, "window": 0.5,
              "phases": 0.1, "teardown": 0.1, "unaccounted": 0.1}  # 4.0 s, 1.5 s of it measured
    for seed in (0, 1):
        for label, one_off, cache in (("baseline", 0.0, None), ("compile", 10.0, "cold" if seed == 0 else "warm")):
            rec = make_record(label, seed, final=0.5, sweep_id="t", one_off=one_off)
            rec.stages = {**stages, "one_off": one_off} if one_off else dict(stages)
            rec.wall_s = round(sum(rec.stages.values()), 6)
            rec.caches = {"inductor": cache} if cache else None
            store.append(rec)
    text = _markdown([out])
    section = text.split("## Where the sweep's time went", 1)[1].split("\n## ", 1)[0]
    assert "4 trials took 36.0 s: 6.00 s (17%) in measured steps, 30.0 s of fixed cost, 7.50 s per trial." in section
    assert "TorchInductor caches: 1 trial(s) compiled from an empty cache (cold), 1 loaded" in section
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:4] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    assert rows["imports"] == ["6.00 s", "16.7%", "1.50 s"]
    assert rows["window (measured)"] == ["2.00 s", "5.6%", "0.50 s"]
    assert rows["one_off"] == ["20.0 s", "55.6%", "5.00 s"]
    assert list(rows)[:3] == ["start", "imports", "build"]  # the stages in the order a trial meets them
    # the summary's line reads the same totals; a sweep without stage times (the fixture) has no such section
    from bench.analyze import time_spent

    line = time_spent.summary_line(time_spent.of_records(store.read()))
    assert line.startswith("Where the time went: 4 trials took 36 s, 17% of it in measured steps")
    assert "## Where the sweep's time went" not in _markdown([FIXTURE])
