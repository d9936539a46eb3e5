"""Energy and cost: ``bench.analyze.cost``'s arithmetic against hand-computed values, the instance table, the price settings
(CLI, TOML, sweep.toml), the report's Energy and Cost sections, the summary's cost line, and how a multi-process
trial's energy is combined from its ranks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from bench.analyze import cost
from bench.cli import main
from bench.core.errors import ConfigError
from bench.plan.config import build_config
from bench.records.results import EnergyResult, ResultStore
from bench.report import build, html, markdown, summary
from bench.run.sweepdir import settings_hash
from bench.trial import combine_energy
from tests.records import record

NO_RAPL = "no RAPL powercap counters readable on this machine (/sys/class/powercap)"

# ---- arithmetic -------------------------------------------------------------------------------------------------


def test_run_cost_and_cost_to_target_are_price_times_hours():
    assert cost.run_cost(2.5, 7200) == 5.0
    assert cost.run_cost(2.5, 7200, machines=2) == 10.0
    assert cost.to_target(2.5, 1800) == 1.25
    assert cost.to_target(2.5, None) is None and cost.to_target(2.5, math.inf) is None  # a miss costs nothing


def test_cost_per_million_samples():
    # 2.50 an hour at 1,000 samples/s: 3.6 million samples an hour, so 2.50 / 3.6 per million
    assert cost.per_million_samples(2.5, 1000) == pytest.approx(2.5 / 3.6, rel=1e-15)
    assert cost.per_million_samples(3.6, 1e6) == pytest.approx(1e-3, rel=1e-15)
    assert cost.per_million_samples(3.6, 1000, machines=4) == pytest.approx(4.0, rel=1e-15)


def test_saved_per_1000_hours():
    assert cost.saved_per_1000_hours(2.5, 2.0) == 1250.0  # 1000 h of work in 500 h
    assert cost.saved_per_1000_hours(2.5, 1.0) == 0.0
    assert cost.saved_per_1000_hours(2.5, 0.8) == pytest.approx(-625.0)  # 1250 h: an extra cost
    assert cost.saved_per_1000_hours(98.32, 1.25) == pytest.approx(19_664.0)


def test_the_speedup_interval_maps_endpoint_by_endpoint():
    saved, lo, hi = cost.saved_interval(2.5, 2.0, 1.25, 4.0)
    assert (saved, lo, hi) == pytest.approx((1250.0, 500.0, 1875.0))
    speedups = [0.5, 0.9, 1.0, 1.1, 3.0]
    savings = [cost.saved_per_1000_hours(2.5, s) for s in speedups]
    assert savings == sorted(savings)  # increasing: the interval's order is kept
    assert cost.saved_interval(2.5, 1.1, None, None) == (pytest.approx(2500 * (1 - 1 / 1.1)), None, None)


def test_energy_per_sample_and_to_target():
    assert cost.energy_per_sample(64.0, 1280) == 0.05
    assert cost.energy_to_target(0.05, 640) == 32.0
    assert cost.energy_to_target(0.05, None) is None and cost.energy_to_target(0.05, math.inf) is None


# ---- prices -----------------------------------------------------------------------------------------------------


def test_instance_table_lookup_and_overrides():
    p5 = cost.instance_price("p5.48xlarge")
    assert p5.per_hour == 98.32 and "8 x NVIDIA H100" in p5.basis and "check the current price" in p5.basis
    assert cost.instance_price("c7i.large").per_hour == 0.08925
    for entry in cost.INSTANCES.values():
        assert entry.source.startswith("https://") and "2025" in entry.as_of and entry.usd_per_hour > 0
    assert cost.instance_price("p5.48xlarge", {"p5.48xlarge": 55.0}).per_hour == 55.0  # the config's [prices] wins
    assert cost.instance_price("my-box", {"my-box": 1.25}).per_hour == 1.25


def test_unknown_instance_lists_the_valid_names():
    with pytest.raises(ConfigError) as exc:
        cost.instance_price("p9.huge", {"my-box": 1.0})
    assert "unknown instance 'p9.huge' (valid instances: c7i.large, g6.xlarge, my-box, n2-standard-2, " \
           "p4d.24xlarge, p5.48xlarge;" in str(exc.value)
    with pytest.raises(ConfigError, match="not both"):
        cost.resolve(2.5, "c7i.large")
    for bad in (-1.0, math.nan, math.inf, "2.5", True):
        with pytest.raises(ConfigError, match="price per machine-hour"):
            cost.check_price(bad, "price_per_hour")


def _config(root: Path, text: str) -> Path:
    path = root / "sweep.toml"
    path.write_text('workloads = "mlp"\ntechniques = "baseline"\n' + text)
    return path


def test_toml_price_instance_and_prices_table(tmp_path):
    plain = build_config("smoke", {"workloads": "mlp", "techniques": "baseline"})
    assert plain.price is None and "price" not in plain.to_toml()
    cfg = build_config("smoke", None, _config(tmp_path, 'instance = "my-box"\n[prices]\nmy-box = 1.25\n'
                                                        '"p5.48xlarge" = 55.0\n'))
    assert cfg.price.per_hour == 1.25 and "config's [prices]" in cfg.price.basis
    assert settings_hash(cfg) == settings_hash(plain)  # a price changes no measurement: a resume may change it
    again = build_config("smoke", None, _write(tmp_path / "again.toml", cfg.to_toml()))  # sweep.toml round trip
    assert again.price == cfg.price and again.prices == cfg.prices
    assert build_config("smoke", None, _config(tmp_path, 'instance = "p5.48xlarge"\n[prices]\n"p5.48xlarge" = 55\n')
                        ).price.per_hour == 55.0
    with pytest.raises(ConfigError, match="quote instance names with dots"):
        build_config("smoke", None, _config(tmp_path, '[prices]\np5.48xlarge = 55.0\n'))
    flag = build_config("smoke", {"price_per_hour": 3.0}, _config(tmp_path, 'instance = "c7i.large"\n'))
    assert flag.price.per_hour == 3.0 and flag.instance is None  # the flag replaces the file's instance
    assert build_config("smoke", None, _config(tmp_path, "price_per_hour = 2\n")).price.per_hour == 2.0
    with pytest.raises(ConfigError, match="not both"):
        build_config("smoke", None, _config(tmp_path, 'price_per_hour = 2.5\ninstance = "c7i.large"\n'))
    with pytest.raises(ConfigError, match="unknown instance 'nope'"):
        build_config("smoke", None, _config(tmp_path, 'instance = "nope"\n'))
    with pytest.raises(ConfigError, match="prices.my-box must be a price"):
        build_config("smoke", None, _config(tmp_path, '[prices]\nmy-box = "cheap"\n'))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_unknown_instance_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    sweep = _sweep(tmp_path / "s", _records())
    for argv in (["report", str(sweep), "--instance", "p9.huge"],
                 ["sweep", "--preset", "smoke", "--workloads", "mlp", "--techniques", "baseline", "--instance",
                  "p9.huge", "--out", str(tmp_path / "new")]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "unknown instance 'p9.huge' (valid instances: c7i.large, g6.xlarge, n2-standard-2, p4d.24xlarge, " \
               "p5.48xlarge;" in err
    assert not (tmp_path / "new").exists() and not (sweep / "report.md").exists()
    with pytest.raises(SystemExit) as exc:  # both at once: argparse says they exclude each other
        main(["report", str(sweep), "--instance", "c7i.large", "--price-per-hour", "1"])
    assert exc.value.code == 2
    assert main(["report", str(sweep), "--price-per-hour", "-1"]) == 2
    assert "price per machine-hour" in capsys.readouterr().err


# ---- the report and the summary ---------------------------------------------------------------------------------


def _records(energy: bool = True, baseline_sps: float = 100.0, bf16_sps: tuple[float, ...] = (200.0,) * 3):
    """baseline at 100 samples/s, bf16 at 200 (a paired speedup of exactly 2): 20 steps of 64 = 1,280 samples in
    each window; 64 J (baseline) and 32 J (bf16) measured, or none with the reason; 640 samples and 360 s
    (baseline) or 180 s (bf16) to the target; a quality run of 1,800 s."""
    out = []
    for seed in range(3):
        for label, sps, joules in (("baseline", baseline_sps, 64.0), ("bf16", bf16_sps[seed], 32.0)):
            r = record(label, seed, sps=sps, final=0.9, target=0.8, ttt=360.0 if label == "baseline" else 180.0,
                       stt=640, one_off=0.0, train_time=1800.0)
            r.energy = (EnergyResult(joules=joules, source="rapl:package-0") if energy
                        else EnergyResult(joules=None, source=None, reason=NO_RAPL))
            out.append(r)
    return out


def _sweep(path: Path, records: list, toml: str | None = None) -> Path:
    path.mkdir(parents=True)
    store = ResultStore(path / "results.jsonl")
    for r in records:
        store.append(r)
    if toml is not None:
        (path / "sweep.toml").write_text(toml)
    return path


def _report(dirs: list[Path], **kwargs) -> str:
    return markdown.render(build(dirs, with_figures=False, **kwargs)[1])


def test_report_cost_section_with_a_price(tmp_path):
    text = _report([_sweep(tmp_path / "s", _records())], price=cost.resolve(2.5, None))
    section = text[text.index("## Cost"):text.index("## Claims check")]
    assert "price: 2.5 per machine-hour as given" in section
    assert "| mlp:tiny | baseline | 1 | 6.94 | 0.25 | 1.25 | reference |" in section  # 2.5 / 0.36; 360 s; 1,800 s
    assert "| mlp:tiny | bf16 | 1 | 3.47 | 0.125 | 1.25 | 1,250 saved |" in section  # 1000 x 2.5 x (1 - 1/2)


def test_html_report_has_the_energy_and_cost_sections(tmp_path):
    report = build([_sweep(tmp_path / "s", _records())], with_figures=False, price=cost.resolve(2.5, None))[1]
    page = html.render(report)
    assert '<section id="energy">' in page and '<section id="cost">' in page and '<a href="#cost">Cost</a>' in page
    assert "1,250 saved" in page


def test_report_cost_section_from_sweep_toml_and_without_a_price(tmp_path):
    with_price = _sweep(tmp_path / "priced", _records(), toml='instance = "c7i.large"\n')
    text = _report([with_price])
    assert "## Cost" in text and "instance c7i.large (2 vCPU" in text and "as listed 2025" in text
    assert "## Cost" not in _report([_sweep(tmp_path / "plain", _records())])


def test_report_cost_interval_and_no_significant_saving(tmp_path):
    # bf16 1.02x-1.05x faster: inside the 5% threshold, so no saving is claimed, yet the interval is shown
    records = _records(bf16_sps=(102.0, 105.0, 103.0))
    text = _report([_sweep(tmp_path / "s", records)], price=cost.resolve(10.0, None))
    row = next(line for line in text.splitlines() if line.startswith("| mlp:tiny | bf16 | 1 |"))
    assert "no saving shown: the speedup is inconclusive (" in row
    lo, hi = (float(v.replace(",", "")) for v in row.split("[")[1].split("]")[0].split(", "))
    saved = float(row.split("no saving shown: the speedup is inconclusive (")[1].split(" [")[0])
    assert lo < saved < hi  # the interval's endpoints, mapped through 1000 x 10 x (1 - 1/s)
    s = (102 * 105 * 103 / 100**3) ** (1 / 3)  # the geometric mean of the paired ratios
    assert saved == pytest.approx(10_000 * (1 - 1 / s), abs=0.5)


def test_report_energy_per_sample_and_to_target(tmp_path):
    text = _report([_sweep(tmp_path / "s", _records())])
    section = text[text.index("## Energy"):text.index("## Claims check")]
    assert "| mlp:tiny | baseline | 50 mJ/sample (n=3) | 32 J | rapl:package-0 |" in section  # 64 J / 1,280; x 640
    assert "| mlp:tiny | bf16 | 25 mJ/sample (n=3) | 16 J | rapl:package-0 |" in section
    assert "energy: unavailable" not in section


def test_report_energy_unavailable_says_why(tmp_path):
    text = _report([_sweep(tmp_path / "s", _records(energy=False))])
    section = text[text.index("## Energy"):text.index("## Claims check")]
    assert f"energy: unavailable ({NO_RAPL})\n" in section  # once, with the recorded reason, no estimate
    assert section.count("energy: unavailable") == 1 and "mJ" not in section and "| workload |" not in section
    # some sets measured, others not: the unavailable line names them
    mixed = _records()
    for r in mixed[1::2]:
        r.energy = EnergyResult(joules=None, source=None, reason="pynvml is not installed")
    text = _report([_sweep(tmp_path / "mixed", mixed)])
    assert "energy: unavailable (pynvml is not installed) for mlp:tiny bf16" in text
    # no energy section in any record (quality-only sweeps): no Energy section
    bare = [dataclasses.replace(r, energy=None) for r in _records()]
    assert "## Energy" not in _report([_sweep(tmp_path / "bare", bare)])


def test_summary_names_the_cheapest_set_only_when_significant():
    rows = summary.summarize(_records())
    lines = summary.cost_lines(rows, 2.5)
    assert lines == ["mlp:tiny: cheapest per million samples: bf16 (2.00x faster than baseline: 0.50x its cost per "
                     "sample at any price; at 2.5 per machine-hour 3.47 against 6.94 per million samples, 1,250 "
                     "saved per 1,000 training hours)"]
    assert summary.cost_lines(rows) == ["mlp:tiny: cheapest per million samples: bf16 (2.00x faster than baseline: "
                                        "0.50x its cost per sample at any price)"]
    assert "- mlp:tiny: cheapest per million samples: bf16" in summary.to_markdown(rows)
    within = summary.summarize(_records(bf16_sps=(102.0, 105.0, 103.0)))
    assert summary.cost_lines(within, 2.5) == ["mlp:tiny: no saving shown (no set's speedup over baseline "
                                               "cleared the 5% threshold with 95% confidence)"]


# ---- a multi-process trial's energy -------------------------------------------------------------------------------


def _reading(joules: float | None, source: str | None = "nvml:H100", reason: str | None = None) -> dict:
    return {"joules": joules, "source": source, "reason": reason}


def test_energy_of_every_gpu_is_summed_and_a_cpu_host_is_read_once():
    gpus = [(_reading(100.0), True), (_reading(120.0), False), (_reading(80.0), False), (_reading(100.0), False)]
    total = combine_energy(gpus, cuda=True)
    assert total.joules == 400.0 and total.source == "nvml:H100 (sum over 4 GPUs)" and total.reason is None
    host = [(_reading(50.0, "rapl:package-0"), True), (_reading(50.2, "rapl:package-0"), False)]
    once = combine_energy(host, cuda=False)
    assert once.joules == 50.0 and once.source == "rapl:package-0 (read once for the 2 ranks of one host)"
    nodes = [(_reading(50.0, "rapl:package-0"), True), (_reading(50.2, "rapl:package-0"), False),
             (_reading(70.0, "rapl:package-0"), True), (_reading(70.1, "rapl:package-0"), False)]
    assert combine_energy(nodes, cuda=False).joules == 120.0
    missing = combine_energy([(_reading(100.0), True), (_reading(None, None, "pynvml is not installed"), False)],
                             cuda=True)
    assert missing.joules is None and missing.reason == "pynvml is not installed"  # no partial total


def test_a_faster_set_on_more_machines_can_cost_more():
    # 1.8x on 2 machines: 1,000 h of the reference's work take 2 x 1000 / 1.8 = 1,111 machine-hours
    assert cost.saved_per_1000_hours(1.0, 1.8, machines_ratio=2.0) == pytest.approx(1000 * (1 - 2 / 1.8))
    saved, lo, hi = cost.saved_interval(1.0, 1.8, 1.6, 2.1, machines_ratio=2.0)
    assert lo < saved < 0 < hi
