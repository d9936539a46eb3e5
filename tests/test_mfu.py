"""The headline MFU (bench.analyze.mfu): every set over one peak per device, comparable with torchtitan's and llm.c's
figures; the own-dtype MFU beside it. Checked on the first H200 sweep's records (reports/example-h200-first, which
predate the headline: it is computed from their achieved FLOP/s and env.json) and on hand-made CPU environments."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.analyze import mfu
from bench.analyze.analysis import analyze
from bench.records.reader import load
from bench.records.results import ResultStore
from bench.report import build, cells, markdown, summary
from tests.records import record

H200 = Path(__file__).resolve().parent.parent / "reports" / "example-h200-first"
SHEET_BF16 = 989.4e12  # NVIDIA's H200 SXM datasheet, dense bf16 (bench/measure/env.py cites it)


def _achieved(label: str) -> float:
    """The median achieved FLOP/s of a set's records, read straight from results.jsonl."""
    values = [r.speed.achieved_flops for r in ResultStore(H200 / "results.jsonl").read()
              if r.technique_label == label and r.status == "ok"]
    return statistics.median(values)


@pytest.fixture(scope="module")
def h200_configs():
    return analyze(load([H200])).configs.set_index("technique")


@pytest.fixture(scope="module")
def h200_report() -> str:
    return markdown.render(build([H200], with_figures=False)[1])


def _calibrated(dtype: str) -> float:
    return json.loads((H200 / "env.json").read_text())["peak_flops"][dtype]["flops"]


def test_h200_headline_is_against_the_dense_bf16_peak_for_every_set(h200_configs):
    for label in ("baseline", "tf32", "bf16", "bf16+compile", "bf16+fp8"):
        c = h200_configs.loc[label]
        assert (c["mfu_peak_dtype"], c["mfu_peak_device"]) == ("bfloat16", "NVIDIA H200")
        assert c["mfu_sheet_peak"] == SHEET_BF16 and c["mfu_calibrated_peak"] == _calibrated("bfloat16")
        assert c["mfu_sheet"] == pytest.approx(_achieved(label) / SHEET_BF16, rel=1e-12)
        assert c["mfu_calibrated"] == pytest.approx(_achieved(label) / _calibrated("bfloat16"), rel=1e-12)
    base, bf16 = h200_configs.loc["baseline"], h200_configs.loc["bf16"]
    # the old figure ranked fp32 first (88.8% of fp32's own peak against bf16's 23.9% of bf16's); one denominator
    # ranks them as their samples/s do
    assert base["mfu"] == pytest.approx(0.888, abs=5e-4) and bf16["mfu"] == pytest.approx(0.239, abs=5e-4)
    assert base["mfu_sheet"] == pytest.approx(0.0451, abs=5e-4) and bf16["mfu_sheet"] == pytest.approx(0.171, abs=5e-4)
    assert bf16["mfu_sheet"] / base["mfu_sheet"] == pytest.approx(bf16["sps_median"] / base["sps_median"], rel=0.05)


def test_h200_report_leads_with_mfu_against_the_bf16_datasheet_peak(h200_report):
    section = h200_report.split("- **gpt:gpt2-124m**\n")[1].split("\n\n")[0]
    first = section.splitlines()[0]
    assert first.startswith("  - MFU against the dense bfloat16 peak of one NVIDIA H200, datasheet 989.4 TFLOP/s "
                            "(estimates, medians over seeds): baseline 4.5%, bf16 17.1%, bf16+compile 20.4%, "
                            "tf32 11.7%, bf16+fp8 3.1%")
    lines = h200_report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| technique set |"))
    table = [line.split(" | ") for line in lines[start:start + 7] if line.startswith("| ")]
    header, rows = table[0], {cells[0].removeprefix("| "): cells for cells in table[1:]}  # "|---" is left out
    assert set(rows) == {"baseline", "bf16", "bf16+compile", "tf32", "bf16+fp8"}
    at, own = header.index("MFU vs device peak (achieved)"), header.index("MFU own dtype")
    assert own == at + 1  # the headline first, the own-dtype figure beside it
    assert rows["bf16"][at] == "17.1% datasheet, 23.9% calibrated (169.2 TFLOP/s)"
    assert rows["baseline"][at] == "4.5% datasheet, 6.3% calibrated (44.6 TFLOP/s)"
    assert rows["baseline"][own] == "88.8% of float32" and rows["tf32"][own] == "34.6% of tfloat32"
    assert ("MFU: achieved FLOP/s over the dense bfloat16 peak of one NVIDIA H200: datasheet 989.4 TFLOP/s, "
            "calibrated 707.3 TFLOP/s (times the GPUs a set ran on") in h200_report
    assert "FlopCounterMode" in h200_report and "6N + 12LTd" in h200_report  # the count's formula, said


def test_h200_summary_names_the_undecided_faster_sets_beside_the_fastest_decided(h200_report):
    section = h200_report.split("- **gpt:gpt2-124m**\n")[1].split("\n\n")[0]
    fastest = next(line for line in section.splitlines() if "fastest" in line)
    assert fastest.startswith("  - fastest decided: tf32 at 2.59x [2.58, 2.61] faster")
    assert fastest.endswith("left out as undecided, though measured higher: bf16 (3.79x) and bf16+compile (4.46x): "
                            "no verdict (2 pairs: a verdict needs 3)")
    least = next(line for line in section.splitlines() if "least memory" in line)
    assert least.startswith("  - least memory decided: bf16+fp8 at 0.680x peak memory (tensors)")
    assert least.endswith("though measured lower: bf16 (0.679x) and bf16+compile (0.667x): no verdict (2 pairs: a "
                          "verdict needs 3)")  # 0.68x alone would print the same number for all three


def test_h200_summary_md_carries_the_headline_and_the_left_out_sets():
    rows = summary.summarize(ResultStore(H200 / "results.jsonl").read(), env=json.loads((H200 / "env.json").read_text()))
    by = {r.techniques: r for r in rows}
    assert by["bf16"].mfu == "17.1% datasheet, 23.9% calibrated (169.2 TFLOP/s)"
    assert by["baseline"].mfu_own == "88.8% of float32"
    md = summary.to_markdown(rows)
    assert "| MFU vs device peak (achieved) | MFU own dtype |" in md
    assert ("cheapest per million samples decided: tf32 (2.59x [2.58, 2.61] faster than baseline" in md
            and "measured faster: bf16 (3.79x) and bf16+compile (4.46x): no verdict" in md)
    # without env.json there is no headline, and the column says so rather than showing the own-dtype figure
    bare = summary.summarize(ResultStore(H200 / "results.jsonl").read())
    assert {r.mfu for r in bare} == {"-"} and next(r for r in bare if r.techniques == "bf16").mfu_own == "23.9% of bfloat16"


def _cpu_env(peaks: dict[str, float], by_threads: dict[str, dict[str, float]] | None = None) -> dict:
    def table(p: dict[str, float]) -> dict:
        return {d: {"flops": f, "kernel": "torch.mm", "n": 2048} for d, f in p.items()}

    env = {"device": "cpu", "peak_flops": table(peaks)}
    if by_threads:
        env["peak_flops_by_threads"] = {n: table(p) for n, p in by_threads.items()}
    return env


def _cpu_summary(env: dict, world_size: int = 1, peak: float = 100e9) -> dict[str, summary.SummaryRow]:
    # 1e9 FLOPs per step of 64 samples at 640 samples/s: 10 GFLOP/s achieved
    records = [record(label, seed=s, flops=10**9, sps=640.0, dtype=dtype, peak_flops=peak * world_size,
                      mfu=10e9 / (peak * world_size), world_size=world_size)
               for label, dtype in (("baseline", "float32"), ("bf16", "bfloat16")) for s in range(3)]
    return {r.techniques: r for r in summary.summarize(records, env=env)}


def test_cpu_headline_is_against_the_fastest_calibrated_dtype_named():
    rows = _cpu_summary(_cpu_env({"float32": 100e9, "bfloat16": 400e9, "float16": 20e9}))
    assert rows["baseline"].mfu == "2.5% calibrated (10.0 GFLOP/s)"  # 10 over bf16's 400, not fp32's 100
    assert rows["baseline"].mfu_own == "10.0% of float32"
    assert rows["baseline"].mfu_definition.startswith(
        "MFU: achieved FLOP/s over the peak of this CPU's fastest calibrated dtype (bfloat16): calibrated 400.0 "
        "GFLOP/s")
    # an AVX2-only CPU: fp32 is its fastest, and the headline is fp32's
    rows = _cpu_summary(_cpu_env({"float32": 180e9, "bfloat16": 20e9}))
    assert rows["baseline"].mfu == "5.6% calibrated (10.0 GFLOP/s)"
    assert "fastest calibrated dtype (float32)" in rows["bf16"].mfu_definition


def test_cpu_ranks_are_measured_against_their_own_thread_counts_calibration():
    # torchrun ranks on a CPU run one thread each: their peak is the 1-thread table's, times the ranks; the
    # record's own-dtype peak (fp32 60 GFLOP/s per rank) says which table that was
    env = _cpu_env({"float32": 100e9, "bfloat16": 400e9},
                   {"2": {"float32": 100e9, "bfloat16": 400e9}, "1": {"float32": 60e9, "bfloat16": 250e9}})
    rows = _cpu_summary(env, world_size=2, peak=60e9)
    assert rows["baseline"].mfu == "2.0% calibrated (10.0 GFLOP/s)"  # 10 / (2 ranks x 250)
    assert mfu.calibrated_table(env, "float32", 100e9)["bfloat16"]["flops"] == 400e9
    assert mfu.calibrated_table(env, "float32", 1.0)["bfloat16"]["flops"] == 400e9  # no match: the default table


def _gpu_env(name: str, calibrated: dict[str, float]) -> dict:
    return {"device": "cuda", "gpu": {"name": name, "count": 1},
            "peak_flops": {d: {"flops": f} for d, f in calibrated.items()}}


def test_gpu_peaks_come_from_the_datasheet_table_and_the_calibration():
    p = mfu.device_peak(_gpu_env("NVIDIA H100 80GB HBM3", {"bfloat16": 700e12, "float16": 720e12}))
    assert (p.dtype, p.datasheet, p.calibrated) == ("bfloat16", 989.4e12, 700e12)  # bf16, though fp16 ran faster
    # no bf16 tensor cores: the datasheet's fastest dtype, named as such
    p = mfu.device_peak(_gpu_env("Tesla V100-SXM2-16GB", {"float32": 14e12, "float16": 100e12}))
    assert (p.dtype, p.datasheet, p.calibrated) == ("float16", 125e12, 100e12)
    assert mfu.chosen(p.dtype, p.device) == ("the peak of the Tesla V100-SXM2-16GB's fastest dense dtype (float16: "
                                             "it has no bfloat16 peak)")
    # a GPU the table does not know: calibrated bf16 only
    p = mfu.device_peak(_gpu_env("NVIDIA Future", {"bfloat16": 2e15, "float32": 1e14}))
    assert (p.dtype, p.datasheet, p.calibrated) == ("bfloat16", None, 2e15)
    assert mfu.device_peak({"device": "cpu"}) is None
    # a CPU sweep on a machine with a GPU is a CPU sweep; an env.json without "device" goes by the trials'
    cpu_run = {**_gpu_env("NVIDIA H200", {"float32": 1e11, "bfloat16": 3e11}), "device": "cpu"}
    assert (mfu.device_peak(cpu_run).dtype, mfu.device_peak(cpu_run).device) == ("bfloat16", "cpu")
    older = {k: v for k, v in _gpu_env("NVIDIA H200", {"bfloat16": 7e14}).items() if k != "device"}
    assert mfu.device_peak(older, device="cuda").datasheet == SHEET_BF16
    assert mfu.headline(1e12, p, world_size=4)["mfu_calibrated"] == pytest.approx(1e12 / (4 * 2e15))


def test_superlatives_name_only_undecided_sets_measured_beyond_the_winner():
    items = [cells.Undecided("a", 1.5, 0.9, 2.5, "inconclusive", "wide"),
             cells.Undecided("b", 1.1, None, None, "no verdict", "2 pairs: a verdict needs 3"),
             cells.Undecided("c", 1.4, None, None, "no verdict", "2 pairs: a verdict needs 3"),
             cells.Undecided("d", 1.9, 1.8, 2.0, "faster", None)]
    higher = cells.beyond_winner(items, 1.3)
    assert [u.name for u in higher] == ["a", "c"]  # b measured below the winner; d is decided
    assert cells.left_out_text(higher) == "a (1.50x [0.90, 2.50]): inconclusive; c (1.40x): no verdict (2 pairs: a verdict needs 3)"
    assert [u.name for u in cells.beyond_winner(items, 1.3, lower_wins=True)] == ["b"]
    assert cells.tie_digits(higher, 1.396) == 3 and cells.tie_digits(higher, 1.3) == 2
