"""`bench compare BASE_DIR NEW_DIR`: a regression gate that does not cry wolf on a noisy machine.

Trials of the two sweep directories are matched by configuration (workload and size, technique set with its
options, world size), and within a configuration by (seed, repeat), the same trial of each side: in `sweep --ab`
the two runs of a trial made back to back. Which trials count and how they pair is the report's rule
(``bench.analyze.pairs``). For each configuration three quantities are compared as NEW / BASE ratios through the
statistics engine (``bench.analyze.stats``, the same one the report uses): a paired t interval on the log-ratios of
matched trials, a Welch interval when the trials do not match:

- throughput (``speed.samples_per_s``; windows that stayed contended are left out): faster / slower / equivalent
  (the whole interval within the threshold) / inconclusive;
- peak memory (the tensor-level or CUDA allocator peak ``memory.peak_bytes`` when every trial on both sides has
  it, else peak RSS when every trial has that, and the table says which): more / less / ...;
- final metric (``quality.final``, the metric at the full sample budget; its direction comes from the record):
  better / worse / ... It is compared only when both sides trained the same samples, and runs cut by the safety cap
  are left out.

A change counts only when the whole 95% interval lies beyond ``threshold`` (default 5%), equivalence only when it
lies wholly inside, and there is no verdict with fewer than 3 matched trials (``bench.analyze.stats.verdict``). When the
sweeps' sweep.toml say they were sequential designs (``--repeats auto``: pairs added while a verdict was open), the
throughput and memory intervals are the design's repeated confidence intervals (``bench.analyze.sequential``), which keep
their coverage over every look. Across configurations an overall verdict compares the geometric mean
of the per-configuration ratios (as pyperf summarises a suite), so a uniform slowdown too small to call in each
configuration alone still trips the gate. The spread of each side (IQR / median of the per-trial values) is
reported as the measured noise.

Mismatched environments (device, torch and CUDA versions, CPU, thread counts; from each directory's env.json) and
sweep settings (sweep.toml) are stated at the top, since a difference there can explain any verdict below.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.analyze import pairs, stats
from bench.analyze.stats import NOISY_IQR_OVER_MEDIAN, Estimate, relative_iqr
from bench.core.errors import ConfigError
from bench.records import reader
from bench.records.frame import design_cap, records_frame
from bench.records.results import TrialRecord

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = stats.THRESHOLDS["speed"]
FAIL_ON = ("slower", "more-memory", "worse-metric", "failed")
FAIL_ON_ALIASES = {"regression": FAIL_ON}

# env.json (bench.measure.env.fingerprint + the runner's device/peak_flops/command), by top-level key. A difference in an
# "environment" key can explain any verdict and is stated at the top; "code" is expected in an A/B comparison.
_ENV_KEYS = {
    "device", "torch", "torch_cuda", "cudnn", "python", "cpu_model", "cpu_capability", "cpu_logical",
    "cpu_physical", "cpu_affinity", "torch_threads", "memory_total_bytes", "cpu_flags", "gpu", "packages",
    "hostname", "platform",
}
_CODE_KEYS = {"git"}
_IGNORED_KEYS = {"timestamp_utc", "command"}
_PEAK_TOLERANCE = 0.10  # calibrated peak FLOP/s are measurements: only a larger gap is worth a line


class CompareError(ConfigError):
    """A directory to compare is missing or holds no records (exit code 2 through the CLI)."""


@dataclass(frozen=True)
class ConfigKey:
    """What makes two trials comparable: the same workload and size, technique set (with options), world size."""

    workload: str  # "gpt:tiny"
    techniques: str  # "bf16+grad_accum:steps=4" or "baseline"
    world_size: int = 1

    @property
    def label(self) -> str:
        world = f" (np{self.world_size})" if self.world_size > 1 else ""
        return f"{self.workload} {self.techniques}{world}"

    @classmethod
    def of(cls, record: TrialRecord) -> ConfigKey:
        return cls(f"{record.workload.get('name')}:{record.workload.get('size')}", record.technique_label,
                   record.world_size)


@dataclass
class MetricComparison:
    """One quantity of one configuration, NEW against BASE."""

    quantity: str  # "throughput" | "peak memory" | "final metric"
    unit: str  # "samples/s", "bytes, tensor peak", "val_loss, lower is better", ...
    base: dict[Any, float]  # ("", seed, repeat) -> value: the same trial of each side pairs (bench.analyze.pairs)
    new: dict[Any, float]
    estimate: Estimate | None  # NEW / BASE; None when not measured on both sides
    verdict: str  # faster / slower / more / less / ... / equivalent / inconclusive / no verdict / not comparable
    why: str | None  # what stood in the way of a verdict
    regression: bool  # the verdict is the bad direction
    noise: float | None  # the larger IQR / median of the two sides (None with fewer than 2 values)
    needed: int | None = None  # an inconclusive verdict: about how many pairs would decide it (bench.analyze.stats.verdict)

    @property
    def base_median(self) -> float | None:
        return statistics.median(self.base.values()) if self.base else None

    @property
    def new_median(self) -> float | None:
        return statistics.median(self.new.values()) if self.new else None


@dataclass
class ConfigComparison:
    key: ConfigKey
    n_base: int  # ok trials / all trials on each side
    n_base_total: int
    n_new: int
    n_new_total: int
    throughput: MetricComparison
    memory: MetricComparison
    metric: MetricComparison
    notes: list[str] = field(default_factory=list)
    new_failed: bool = False  # some NEW trials failed (not skipped) where BASE had ok trials

    @property
    def quantities(self) -> tuple[MetricComparison, MetricComparison, MetricComparison]:
        return self.throughput, self.memory, self.metric

    def regressions(self) -> set[str]:
        """The --fail-on categories this configuration trips."""
        out = set()
        if self.throughput.regression:
            out.add("slower")
        if self.memory.regression:
            out.add("more-memory")
        if self.metric.regression:
            out.add("worse-metric")
        if self.new_failed:
            out.add("failed")
        return out


@dataclass
class Overall:
    """One quantity across every configuration: the geometric mean of the per-configuration ratios."""

    quantity: str
    estimate: Estimate
    verdict: str
    why: str | None
    regression: bool


@dataclass
class EnvDifference:
    key: str  # flattened env.json key, e.g. "torch" or "gpu.name"
    base: Any
    new: Any
    kind: str  # "environment" (can explain any verdict) | "code" (expected in an A/B) | "measured" | "other"


@dataclass
class Comparison:
    base_dir: Path | None
    new_dir: Path | None
    threshold: float
    rows: list[ConfigComparison]
    only_base: list[ConfigKey] = field(default_factory=list)
    only_new: list[ConfigKey] = field(default_factory=list)
    env: list[EnvDifference] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)  # sweep.toml differences, as lines
    overall: list[Overall] = field(default_factory=list)
    input_notes: list[str] = field(default_factory=list)  # what was wrong with the input (duplicated trial ids)
    max_looks: int | None = None  # a sequential design's cap (sweep.toml): ratios are repeated intervals
    peak_moves: list[str] = field(default_factory=list)  # calibrated peaks that moved more than the noise

    @property
    def environment_mismatch(self) -> list[EnvDifference]:
        return [d for d in self.env if d.kind == "environment"]

    def failing(self, fail_on: Iterable[str]) -> list[tuple[ConfigKey, set[str]]]:
        """Configurations that trip any of the ``fail_on`` categories, with the categories they trip."""
        wanted = set(fail_on)
        out = []
        for row in self.rows:
            hit = row.regressions() & wanted
            if hit:
                out.append((row.key, hit))
        overall = {_OVERALL_CATEGORY[o.quantity] for o in self.overall if o.regression} & wanted
        if overall:
            out.append((ConfigKey("all configurations", "overall (geometric mean)"), overall))
        return out

    def noise_floor(self) -> float | None:
        """The largest per-side throughput spread (IQR / median) over all configurations: the measured noise."""
        values = [r.throughput.noise for r in self.rows if r.throughput.noise is not None]
        return max(values) if values else None


# ---- inputs -------------------------------------------------------------------------------------------------


def parse_threshold(text: str | float) -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05. Values of 1 and more without a % sign are read as percent (``5`` -> 0.05)."""
    if isinstance(text, int | float):
        value = float(text)
    else:
        raw = text.strip()
        try:
            value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ConfigError(f"--threshold wants a fraction or a percentage like 5% or 0.05, got '{text}'") from None
        if not raw.endswith("%") and value >= 1:
            value /= 100
    if not 0 <= value < 1 or math.isnan(value):
        raise ConfigError(f"--threshold must be between 0% and 100%, got '{text}'")
    return value


def parse_fail_on(text: str | Sequence[str] | None) -> set[str]:
    """``"slower,more-memory"`` -> a set of categories; ``regression`` means all of them."""
    if not text:
        return set()
    items = text.split(",") if isinstance(text, str) else list(text)
    out: set[str] = set()
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item in FAIL_ON_ALIASES:
            out.update(FAIL_ON_ALIASES[item])
        elif item in FAIL_ON:
            out.add(item)
        else:
            valid = ", ".join((*FAIL_ON, *FAIL_ON_ALIASES))
            raise ConfigError(f"--fail-on: unknown category '{item}' (valid: {valid})")
    return out


def load_sweep(sweep_dir: Path) -> tuple[reader.Source, list[str]]:
    """One sweep directory through the one reader, each trial id once; ``CompareError`` (one line: file, line, what
    is wrong) for bad input, and the reader's notes. An unreadable env.json or sweep.toml is warned about and compared
    without."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise CompareError(f"{sweep_dir} is not a directory (give two sweep directories: BASE_DIR NEW_DIR)")
    if not (sweep_dir / "results.jsonl").is_file():
        raise CompareError(f"{sweep_dir} has no results.jsonl (is it a sweep directory?)")
    try:
        sweep = reader.load([sweep_dir], strict_env=False)
    except reader.InputError as exc:
        raise CompareError(str(exc)) from None
    source = sweep.sources[0]
    if not source.records:
        raise CompareError(f"{sweep_dir / 'results.jsonl'} holds no records")
    # Continuations (bench.run.continuation) train a set's budget again and on past it: the same seed's quality run
    # a second time, so they would count as an extra repeat of every quantity compared here.
    source.records = [r for r in source.records if r.continues is None]
    return source, sweep.notes


# ---- statistics per configuration ---------------------------------------------------------------------------


def _quantity(quantity: str, unit: str, base: dict[Any, float], new: dict[Any, float], threshold: float,
              higher: str, lower: str, bad: str, log: bool = True, max_looks: int | None = None
              ) -> MetricComparison:
    """NEW against BASE through the statistics engine: a ratio (``log``) or a difference, paired by (seed, repeat).
    ``max_looks``: a sequential design's cap, so a paired ratio is its repeated interval (``bench.analyze.sequential``)."""
    noises = [n for n in (_spread(list(base.values())), _spread(list(new.values()))) if n is not None]
    noise = max(noises) if noises else None
    if not base or not new:
        side = "either side" if not base and not new else ("BASE" if not base else "NEW")
        return MetricComparison(quantity, unit, base, new, None, f"not measured on {side}", None, False, noise)
    if log and (min(base.values()) <= 0 or min(new.values()) <= 0):
        return MetricComparison(quantity, unit, base, new, None, "not comparable", "zero or negative values",
                                False, noise)
    est = stats.ratio(new, base, max_looks) if log else stats.difference(new, base)
    v = stats.verdict(est, threshold, higher, lower)
    return MetricComparison(quantity, unit, base, new, est, v.word, v.why, v.word == bad, noise, v.needed)


def _spread(values: list[float]) -> float | None:
    """IQR / median of per-trial values (``bench.analyze.stats.relative_iqr``); 0 for identical values."""
    if len(values) < 2:
        return None
    return 0.0 if max(values) == min(values) else relative_iqr(values)


# Peak memory's unit by its source (``bench.analyze.pairs.memory_source``; None: no source every trial has).
_MEMORY_UNITS = {"tensors": "bytes, tensor peak", "RSS": "bytes, peak RSS", None: "bytes"}


def _higher_is_better(records: Sequence[TrialRecord]) -> tuple[str | None, bool]:
    for r in records:
        metric = r.quality.metric if r.quality else r.workload.get("metric")
        if metric is None:
            continue
        hib = r.quality.higher_is_better if r.quality else r.workload.get("higher_is_better")
        if hib is None:
            hib = "loss" not in str(metric) and "perplexity" not in str(metric)
        return str(metric), bool(hib)
    return None, True


def compare_config(key: ConfigKey, base: Sequence[TrialRecord], new: Sequence[TrialRecord],
                   threshold: float = DEFAULT_THRESHOLD, max_looks: int | None = None) -> ConfigComparison:
    """Compare the trials of one configuration (all statuses; only ``ok`` trials give values). ``threshold`` is
    throughput's; memory and the metric use the report's (``bench.analyze.stats.THRESHOLDS``), the metric as a difference
    at equal samples, as the report compares it. ``max_looks``: the cap of the sequential design the trials came
    from (throughput and memory pairs were added while their verdicts were open, so their intervals are repeated
    ones; the metric's quality runs are the planned ones, never repeated for speed)."""
    ok_b = [r for r in base if r.status == "ok"]
    ok_n = [r for r in new if r.status == "ok"]
    # Each side is one sweep directory, framed alone: its trials are keyed ("", seed, repeat), so the same trial of
    # the two sides pairs, by the report's rule of which trials count (bench.analyze.pairs).
    fb, fn = records_frame(base, max_looks), records_frame(new, max_looks)
    speed = pairs.pair(fn, fb, pairs.THROUGHPUT)
    throughput = _quantity("throughput", "samples/s", speed.ref, speed.mine, threshold,
                           "faster", "slower", "slower", max_looks=max_looks)
    mem = pairs.pair(fn, fb, pairs.PEAK_MEMORY)
    memory = _quantity("peak memory", _MEMORY_UNITS[mem.source], mem.ref, mem.mine, stats.THRESHOLDS["memory"],
                       "more", "less", "more", max_looks=max_looks)
    name, hib = _higher_is_better([*ok_b, *ok_n])
    good, worse = "better", "worse"
    final = pairs.pair(fn, fb, pairs.FINAL_METRIC)
    metric = _quantity("final metric", f"{name}, {'higher' if hib else 'lower'} is better" if name else "-",
                       final.ref, final.mine, stats.THRESHOLDS["metric"],
                       good if hib else worse, worse if hib else good, worse, log=False)
    budgets_b = sorted({int(s) for s in pairs.quality_runs(fb)["samples_trained"]})
    budgets_n = sorted({int(s) for s in pairs.quality_runs(fn)["samples_trained"]})
    if budgets_b and budgets_n and budgets_b != budgets_n and metric.estimate is not None:
        metric.verdict, metric.regression = "not comparable", False
        metric.why = f"trained {_listing(budgets_b)} vs {_listing(budgets_n)} samples"
    notes = []
    for side, recs in (("BASE", base), ("NEW", new)):
        bad = sorted({f"{r.status}: {r.reason}" for r in recs if r.status != "ok"})
        if bad:
            notes.append(f"{side}: " + "; ".join(bad)[:300])
        contended = sum(1 for r in recs if r.status == "ok" and r.speed and r.speed.contended)
        if contended:
            notes.append(f"{side}: {contended} trial(s) timed while other processes used the CPU (left out of "
                         "throughput)")
        cut = sum(1 for r in recs if r.status == "ok" and r.quality and r.quality.cut)
        if cut:
            notes.append(f"{side}: {cut} quality run(s) cut by the safety cap (left out of the metric)")
    for q in (throughput, memory, metric):
        if q.noise is not None and q.noise > NOISY_IQR_OVER_MEDIAN:
            notes.append(f"noisy {q.quantity}: IQR/median {q.noise:.0%}")
    new_failed = bool(ok_b) and any(r.status not in ("ok", "skipped") for r in new)
    return ConfigComparison(key, len(ok_b), len(base), len(ok_n), len(new), throughput, memory, metric, notes,
                            new_failed)


def _listing(values: list[Any]) -> str:
    return "/".join(f"{v:,}" for v in values) if len(values) <= 3 else f"{values[0]:,}..{values[-1]:,}"


_OVERALL_CATEGORY = {"throughput": "slower", "peak memory": "more-memory", "final metric": "worse-metric"}
SEQUENTIAL_OVERALL = (", fixed-n t on each configuration's final pairs, read once at the end (the sequential "
                      "design's stopping rule looks at each configuration, not at the overall)")


def overall_verdicts(rows: Sequence[ConfigComparison], threshold: float, max_looks: int | None = None
                     ) -> list[Overall]:
    """Throughput and peak memory across configurations: the geometric mean of NEW / BASE with a stratified
    interval (metrics of different workloads have different units and directions, so they get no overall).

    In a sequential design (``max_looks``) the overall is still read once, at the end, from every configuration's
    final pairs: the stopping rule looked at each configuration's verdict, never at the overall one, so its interval
    is the fixed-n stratified one, and its method text says so."""
    out = []
    for index, (quantity, th, higher, lower, bad) in enumerate((
            ("throughput", threshold, "faster", "slower", "slower"),
            ("peak memory", stats.THRESHOLDS["memory"], "more", "less", "more"))):
        pairs = [(r.quantities[index].new, r.quantities[index].base) for r in rows
                 if r.quantities[index].estimate is not None]
        if len(pairs) < 2:
            continue
        est = stats.overall(pairs)
        if max_looks is not None and est.has_interval:
            est = dataclasses.replace(est, method=est.method + SEQUENTIAL_OVERALL)
        v = stats.verdict(est, th, higher, lower, min_repeats=2)
        out.append(Overall(quantity, est, v.word, v.why, v.word == bad))
    return out


def compare_records(base: Sequence[TrialRecord], new: Sequence[TrialRecord], threshold: float = DEFAULT_THRESHOLD,
                    max_looks: int | None = None) -> tuple[list[ConfigComparison], list[ConfigKey], list[ConfigKey]]:
    """(rows for configurations on both sides, keys only in BASE, keys only in NEW), in BASE's order.
    ``max_looks``: the cap of a sequential design (``compare_config``)."""
    groups_b: dict[ConfigKey, list[TrialRecord]] = defaultdict(list)
    groups_n: dict[ConfigKey, list[TrialRecord]] = defaultdict(list)
    for r in base:
        groups_b[ConfigKey.of(r)].append(r)
    for r in new:
        groups_n[ConfigKey.of(r)].append(r)
    rows = [compare_config(k, groups_b[k], groups_n[k], threshold, max_looks) for k in groups_b if k in groups_n]
    return rows, [k for k in groups_b if k not in groups_n], [k for k in groups_n if k not in groups_b]


# ---- environment and settings -------------------------------------------------------------------------------


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def env_differences(base: dict[str, Any], new: dict[str, Any]) -> list[EnvDifference]:
    """Differences between two env.json documents, classified. Calibrated peak FLOP/s are measurements: only
    their ``flops`` figure counts, and only when it differs by more than 10%."""
    fb, fn = _flatten(base), _flatten(new)
    out = []
    for key in sorted(set(fb) | set(fn)):
        a, b = fb.get(key), fn.get(key)
        parts = key.split(".")
        top = parts[0]
        if a == b or top in _IGNORED_KEYS:
            continue
        if top in ("peak_flops", "peak_flops_by_threads", "peak_flops_by_device"):
            if parts[-1] != "flops":
                continue
            if isinstance(a, int | float) and isinstance(b, int | float) and a > 0 and abs(b / a - 1) <= _PEAK_TOLERANCE:
                continue
            kind = "measured"  # a calibration: differs with contention too, so it informs rather than warns
        elif top in _CODE_KEYS:
            kind = "code"
        elif top in _ENV_KEYS:
            kind = "environment"
        else:
            kind = "other"
        out.append(EnvDifference(key, a, b, kind))
    return out


def settings_differences(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    fb, fn = _flatten(base), _flatten(new)
    return [f"{k}: {fb.get(k, '(unset)')} vs {fn.get(k, '(unset)')}" for k in sorted(set(fb) | set(fn))
            if k != "name" and fb.get(k) != fn.get(k)]


def compare_dirs(base_dir: Path, new_dir: Path, threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Compare two sweep directories (results.jsonl, env.json, sweep.toml)."""
    base_dir, new_dir = Path(base_dir), Path(new_dir)
    (base_src, base_notes), (new_src, new_notes) = load_sweep(base_dir), load_sweep(new_dir)
    notes = [*base_notes, *new_notes]
    base, new = base_src.records, new_src.records
    settings_b, settings_n = base_src.settings or {}, new_src.settings or {}
    cap = design_cap_of(settings_b, settings_n)
    # Bad input stops in the reader (load_sweep: one line); an exception past it is a bug, shown with its traceback.
    rows, only_b, only_n = compare_records(base, new, threshold, cap)
    env = env_differences(base_src.env, new_src.env)
    settings = settings_differences(settings_b, settings_n)
    comp = Comparison(base_dir, new_dir, threshold, rows, only_b, only_n, env, settings,
                      overall_verdicts(rows, threshold, cap), notes, cap)
    comp.peak_moves = peak_moves(base_src.env, new_src.env, comp.noise_floor(), threshold)
    return comp


def peak_moves(base: dict[str, Any], new: dict[str, Any], noise: float | None, threshold: float) -> list[str]:
    """Each dtype whose calibrated matmul peak (env.json's ``peak_flops``, measured at the start of each sweep)
    moved between the two sweeps by more than the noise of the throughputs compared (their largest spread, or the
    threshold when there is no spread to read): MFU is then not comparable between them, and the machine itself
    may explain a throughput change of that size."""
    floor = noise if noise is not None else threshold
    out = []
    for dtype in sorted(set(base.get("peak_flops") or {}) & set(new.get("peak_flops") or {})):
        a, b = ((env["peak_flops"][dtype] or {}).get("flops") for env in (base, new))
        if not (isinstance(a, int | float) and isinstance(b, int | float)) or a <= 0 or b <= 0:
            continue
        moved = b / a - 1
        if abs(moved) > floor:
            out.append(f"the calibrated {dtype} matmul peak moved from {a / 1e9:,.0f} to {b / 1e9:,.0f} GFLOP/s "
                       f"({moved:+.1%}) between the two sweeps, more than the {floor:.1%} noise of the throughputs "
                       "compared: MFU is not comparable between them, and the machine itself may explain a "
                       "throughput change of that size")
    return out


def design_cap_of(*settings: dict[str, Any]) -> int | None:
    """The sequential design's cap that applies to a comparison: the larger one when the two sweeps' differ (the
    wider interval), a sequential side's when only one was (its pairs were added by looking), None when both were
    fixed designs (``bench.records.frame.design_cap``)."""
    caps = [c for c in (design_cap(s) for s in settings) if c is not None]
    return max(caps) if caps else None
