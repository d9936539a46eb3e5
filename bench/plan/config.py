"""Typed sweep configuration: technique and workload specs, budgets, presets, TOML loading and validation.

Every config is a dataclass validated at construction; an unknown key or value raises ``ConfigError`` with a
message that names what is valid. The CLI turns a ``ConfigError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

import techniques
from bench import workloads
from bench.analyze import cost
from bench.core.errors import ConfigError
from bench.core.text import shown
from bench.measure import cuda_caps
from bench.plan import plugins
from bench.records.results import MODES
from techniques.base import OptionError

# ---- techniques ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TechniqueSpec:
    """One technique with the options the user set, e.g. ``grad_accum:steps=4``."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> TechniqueSpec:
        name, *pairs = [p.strip() for p in text.strip().split(":")]
        options = []
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ConfigError(f"bad option {shown(pair)} in {shown(text)}: write options as name:key=value[:key=value]")
            options.append((key.strip(), value.strip()))
        spec = cls(name, tuple(sorted(options)))
        spec.resolve()  # validates name and options now, not in the child process
        return spec

    def resolve(self) -> techniques.Technique:
        """The technique instance this spec describes."""
        try:
            cls = techniques.get(self.name)
            return cls(cls.parse_options(dict(self.options)))
        except OptionError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def label(self) -> str:
        return ":".join([self.name, *(f"{k}={v}" for k, v in self.options)])


@dataclass(frozen=True)
class TechniqueSet:
    """Techniques applied together in one trial; the empty set is the baseline."""

    specs: tuple[TechniqueSpec, ...] = ()

    @classmethod
    def parse(cls, text: str) -> TechniqueSet:
        parts = [p for p in text.split("+") if p.strip()]
        if not parts:
            raise ConfigError(f"empty technique set in {shown(text)}")
        specs = [TechniqueSpec.parse(p) for p in parts]
        if any(s.name == "baseline" for s in specs):
            if len(specs) > 1:
                raise ConfigError(f"{shown(text)}: baseline is the empty set and cannot be combined with other techniques")
            return cls(())
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"{shown(text)} names a technique twice")
        return cls(tuple(specs))

    @property
    def label(self) -> str:
        return "+".join(s.label for s in self.specs) or "baseline"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)


def parse_technique_sets(text: str | list[str]) -> list[TechniqueSet]:
    """``"bf16,grad_accum:steps=4,bf16+compile"`` -> three sets. ``,`` separates sets, ``+`` joins a combination."""
    items = text.split(",") if isinstance(text, str) else list(text)
    sets = [TechniqueSet.parse(item) for item in items if item.strip()]
    if not sets:
        raise ConfigError("no technique sets given")
    return _dedupe(sets)


# ---- workloads ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload at a size preset, e.g. ``gpt:tiny``."""

    name: str
    size: str = "tiny"

    @classmethod
    def parse(cls, text: str, default_size: str = "tiny") -> WorkloadSpec:
        name, _, size = text.strip().partition(":")
        try:
            wl = workloads.get(name)
            if not size and wl.size_required:
                raise ConfigError(f"workload {shown(name)} needs a size ({wl.summary}: build's size parameter has no "
                                  f"default); write {name}:SIZE")
            spec = cls(name, size or wl.default_size or default_size)
            wl.size_params(spec.size)
        except workloads.WorkloadError as exc:
            raise ConfigError(str(exc)) from None
        return spec

    @property
    def label(self) -> str:
        return f"{self.name}:{self.size}"


def parse_workloads(text: str | list[str], default_size: str = "tiny") -> list[WorkloadSpec]:
    items = text.split(",") if isinstance(text, str) else list(text)
    specs = [WorkloadSpec.parse(item, default_size) for item in items if item.strip()]
    if not specs:
        raise ConfigError("no workloads given")
    return _dedupe(specs)


def _dedupe(items: list[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def _check_type(key: str, value: Any, declared: str) -> None:
    """A TOML value of the declared type (``bool``, ``int``, ``float``, ``str``); ints are accepted as floats.

    ``repeats = 2.7`` must not silently become 2, nor ``memory = 1`` become true.
    """
    names = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string"}
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(declared, True)
    if not ok:
        raise ConfigError(f"{key} must be {names[declared]}, got {shown(value)} ({type(value).__name__})")


def _names(key: str, value: Any) -> str | list[str]:
    """``workloads`` / ``techniques``: a comma list, or a TOML array of strings (a table is a mistake)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError(f"{key} must be a comma-separated string or an array of strings, e.g. {key} = "
                      f"[\"{'mlp' if key == 'workloads' else 'bf16'}\"]; got {shown(value)} ({type(value).__name__})")


# ---- budgets and the sweep ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """How long each trial measures and trains: two budgets that never mix. Steps are optimizer steps.

    The speed window (warm-up, then at least ``min_steps`` and ``min_seconds``, at most ``max_seconds``) answers
    how fast a step is. The quality run answers how fast the model learns: every set of a workload trains the same
    samples (``train_steps`` at the workload's global batch; 0 means the workload size's documented budget, the
    one its validation target was set for) and evaluates at the same sample counts.
    """

    warmup_steps: int = 3  # speed: excluded from timing (and at least the parity steps when speed runs first)
    min_steps: int = 20  # speed window: at least this many steps ...
    min_seconds: float = 1.0  # ... and at least this long,
    max_seconds: float = 20.0  # but stop once this long has passed (slow configs, e.g. fp16 on CPU)
    train_steps: int = 0  # quality run: optimizer steps at the workload's global batch (0: the size's budget)
    eval_points: int = 0  # quality run: evaluations over the budget, plus one before training (0: the size's)
    max_train_seconds: float = 240.0  # quality run: a safety cap on its training clock; a run it cuts is marked
    parity_steps: int = 8  # first optimizer steps compared with the eager fp32 reference (losses, distance)
    contention_retries: int = 2  # speed: a window in which other processes used the cores is measured again
    memory: bool = True  # run the memory passes after the speed window (clean RSS, tensor breakdown)
    timeout_s: float = 300.0  # a trial process running longer is killed and recorded as a timeout

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _check_type(f"budget.{f.name}", value, f.type)
            if isinstance(value, bool):
                continue
            if not math.isfinite(value):  # NaN passes every comparison below: a NaN timeout turned the timeout off
                raise ConfigError(f"budget.{f.name} must be a finite number, got {value}")
            if value < 0:
                raise ConfigError(f"budget.{f.name} must be >= 0, got {value}")
        if self.min_steps < 1:
            raise ConfigError("budget.min_steps must be >= 1")
        if self.timeout_s <= 0:
            raise ConfigError("budget.timeout_s must be > 0")
        if self.max_train_seconds >= self.timeout_s:
            raise ConfigError(f"budget.max_train_seconds ({self.max_train_seconds:g}) must be below budget.timeout_s "
                              f"({self.timeout_s:g}): the trial would be killed before its safety cap could mark the "
                              "quality run as cut (lower --seconds or raise --timeout)")


@dataclass(frozen=True)
class SweepConfig:
    """A whole sweep: workloads x technique sets x repeats, and the budget of each trial."""

    name: str
    workloads: tuple[WorkloadSpec, ...]
    techniques: tuple[TechniqueSet, ...]
    repeats: int = 3  # full trials per configuration (a fixed design), or the first ones of a sequential design
    # A sequential design (``--repeats auto``): after the ``repeats`` full trials, speed-only pairs are added to the
    # configurations whose speed or memory verdict is still open, up to ``max_repeats`` pairs each (0: fixed design).
    max_repeats: int = 0
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    nproc: int = 1  # processes per node for trials of data-parallel / sharding techniques
    nnodes: int = 1  # nodes taking part in those trials (see docs/distributed.md: several nodes)
    threads: int = 0  # torch intra-op threads in each trial (0: torch's default)
    mode: str = "both"  # speed (timed window, memory) | quality (quality run) | both
    budget: Budget = field(default_factory=Budget)
    models: tuple[plugins.Plugin, ...] = ()  # users' models (--model), registered as workloads
    technique_plugins: tuple[plugins.Plugin, ...] = ()  # users' technique classes (--technique)
    # Money, for the report's Cost section only (not a measurement setting: kept out of the settings hash, so a
    # resumed sweep may change it): a price per machine-hour, or an instance of bench.analyze.cost.INSTANCES / ``prices``.
    price_per_hour: float | None = None
    instance: str | None = None
    prices: tuple[tuple[str, float], ...] = ()  # [prices] name = price per hour: overrides and extends the table
    # This machine's part of a sweep split over several (``--shard i/n``): whole workloads, see ``plan.shard``.
    # Not a measurement setting either: the shards of one sweep share the settings hash, so their report merges them.
    shard: tuple[int, int] | None = None
    # The time the sequential phase may spend, in seconds, shared by all open configurations (None: half the wall
    # time the planned trials took, so a sequential sweep takes at most about 1.5x a fixed one). Like the price, it
    # changes no measurement, only how many are made: kept out of the settings hash.
    decide_within: float | None = None
    # The run order (``bench.plan.planner``): "shuffled" (each repeat's configurations in a seeded random order) or
    # "priority" (the technique sets in the order given, the baseline beside the first, each through all its repeats
    # before the next: a sweep cut short has the first comparisons complete). Changes no measurement: kept out of the
    # settings hash, so a resume may change it.
    order: str = "shuffled"
    # How trial processes start: forked from the sweep's fork server, which imported torch and the harness once
    # (``fork``), or each a fresh interpreter (``fresh``); bench.run.isolation says which trials always start fresh.
    # Not a measurement setting (docs/methodology.md, "Fork isolation": what a trial measures reads the same either
    # way), so kept out of the settings hash like the price; each record says how its trial started.
    isolation: str = field(default_factory=lambda: default_isolation())  # defined below, with ISOLATIONS

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.type in ("int", "str"):
                _check_type(f.name, getattr(self, f.name), f.type)
        if self.instance is not None:
            _check_type("instance", self.instance, "str")
        cost.resolve(self.price_per_hour, self.instance, dict(self.prices))  # an unknown instance: an error now
        if self.repeats < 1:
            raise ConfigError(repeats_error(self.repeats))
        if self.max_repeats and (self.max_repeats < self.repeats or self.repeats < MIN_SEQUENTIAL_START):
            raise ConfigError(f"max_repeats ({self.max_repeats}) must be at least repeats ({self.repeats}), and a "
                              f"sequential design starts from at least {MIN_SEQUENTIAL_START} repeats (the fewest "
                              "that give a verdict)")
        if self.max_repeats > MAX_SEQUENTIAL_REPEATS:
            raise ConfigError(f"max_repeats must be at most {MAX_SEQUENTIAL_REPEATS}, got {self.max_repeats}")
        if self.decide_within is not None and not (isinstance(self.decide_within, int | float)
                                                   and not isinstance(self.decide_within, bool)
                                                   and math.isfinite(self.decide_within) and self.decide_within >= 0):
            raise ConfigError(f"decide_within must be a number of seconds >= 0, got {shown(self.decide_within)}")
        cpus = os.cpu_count() or 1
        if not 0 <= self.threads <= cpus:
            raise ConfigError(f"threads must be between 0 (torch's default) and {cpus} (the logical CPUs here), "
                              f"got {self.threads}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be between 0 and 2**63 - 1, got {self.seed}")
        n_trials = self.repeats * len(self.workloads) * (len(set(self.techniques) | {TechniqueSet(())}))
        if n_trials > MAX_TRIALS:
            raise ConfigError(f"the plan has {n_trials:,} trials ({self.repeats:,} repeats x {len(self.workloads)} "
                              f"workload(s) x the technique sets and baseline); at most {MAX_TRIALS:,} per sweep: "
                              "lower --repeats or split the sweep")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {shown(self.mode)}")
        if self.order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(ORDERS)}; got {shown(self.order)}")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}; got {shown(self.isolation)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be one of auto, cpu, cuda; got {shown(self.device)}")
        if self.nproc < 1 or self.nnodes < 1:
            raise ConfigError(f"nproc and nnodes must be >= 1, got {self.nproc} and {self.nnodes}")
        if not self.workloads or not self.techniques:
            raise ConfigError("a sweep needs at least one workload and one technique set")
        if self.mode != "speed" and not self.budget.train_steps:
            for w in self.workloads:
                if not workloads.get(w.name).size_params(w.size).get("quality_steps"):
                    raise ConfigError(f"workload {w.label} states no quality budget (quality_steps): give --steps, "
                                      "or quality_steps in its build's result, or use --mode speed")

    @property
    def sequential(self) -> bool:
        """Whether speed-only pairs are added while verdicts are open (``--repeats auto``)."""
        return self.max_repeats > self.repeats and self.mode in ("speed", "both")

    @property
    def plugins(self) -> tuple[plugins.Plugin, ...]:
        """What every process of the sweep loads before it resolves a workload or technique name."""
        return (*self.technique_plugins, *self.models)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def price(self) -> cost.Price | None:
        """The price per machine-hour the report's Cost section uses (None: no Cost section)."""
        return cost.resolve(self.price_per_hour, self.instance, dict(self.prices))

    def _price_dict(self) -> dict[str, Any]:
        """The price settings as given (only when there are some), for sweep.toml and the report."""
        out: dict[str, Any] = {}
        if self.price_per_hour is not None:
            out["price_per_hour"] = self.price_per_hour
        if self.instance is not None:
            out["instance"] = self.instance
        if self.prices:
            out["prices"] = dict(self.prices)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workloads": [w.label for w in self.workloads],
            "techniques": [t.label for t in self.techniques],
            "repeats": self.repeats,
            **({"max_repeats": self.max_repeats} if self.max_repeats else {}),
            "seed": self.seed,
            "device": self.device,
            "nproc": self.nproc,
            "nnodes": self.nnodes,
            "threads": self.threads,
            "mode": self.mode,
            "budget": dataclasses.asdict(self.budget),
            **self._plugin_dict(),
            **({"shard": shard_text(self.shard)} if self.shard else {}),
        }

    def _plugin_dict(self) -> dict[str, Any]:
        """Users' code, only when there is some (older sweeps' settings stay as they were): the sources as given
        back to ``build_config``, and each file's sha256 so a resume notices an edited file."""
        if not self.plugins:
            return {}
        out: dict[str, Any] = {}
        if self.models:
            out["models"] = [f"{m.name}={m.source}" for m in self.models]
            blocks = {m.blocks for m in self.models} - {None}
            if blocks:
                out["blocks"] = blocks.pop()
        if self.technique_plugins:
            out["technique_plugins"] = [t.source for t in self.technique_plugins]
        out["sources_sha256"] = {p.source: plugins.digest(p.source) or "" for p in self.plugins}
        return out

    def to_toml(self) -> str:
        # The price goes into sweep.toml (the report reads it) but not into to_dict(), whose settings a resume
        # must keep: a price changes no measurement.
        extra: dict[str, Any] = {"decide_within": self.decide_within} if self.decide_within is not None else {}
        if self.order != ORDERS[0]:
            extra["order"] = self.order
        return tomli_w.dumps({**self.to_dict(), **self._price_dict(), **extra, "isolation": self.isolation})


ORDERS = ("shuffled", "priority")  # SweepConfig.order: the first is the default
MIN_SEQUENTIAL_START = 3  # bench.analyze.stats.MIN_REPEATS: a sequential design's first look
DEFAULT_MAX_REPEATS = 8  # --repeats auto: pairs per configuration at most (docs/methodology.md: why 8)
MAX_SEQUENTIAL_REPEATS = 200  # the design's levels are simulated for the cap: a larger one is a typo
MAX_TRIALS = 10_000  # a sweep of more trials is a typo (--repeats 1000000000), not a plan: refused before planning

_DEFAULT_WORKLOADS = ["mlp:tiny", "gpt:tiny", "cnn:tiny"]

PRESETS: dict[str, dict[str, Any]] = {
    # CI: every workload, a few technique sets, one repeat (so no verdicts), tiny budgets. About a minute.
    "smoke": {
        "workloads": _DEFAULT_WORKLOADS,
        "techniques": ["baseline", "bf16", "grad_accum:steps=2"],
        "repeats": 1,
        "budget": {"warmup_steps": 2, "min_steps": 5, "min_seconds": 0.2, "max_seconds": 5.0, "train_steps": 20,
                   "eval_points": 2, "parity_steps": 4, "max_train_seconds": 60.0, "timeout_s": 120.0},
    },
    # The default: the core techniques on the three tiny workloads, each trained its size's documented quality
    # budget, 3 repeats (the fewest that give a verdict), then speed-only pairs while a speed verdict is open
    # (--repeats auto). Goal: <= 15 minutes on 2 cores.
    "quick": {
        "workloads": _DEFAULT_WORKLOADS,
        "techniques": ["baseline", "bf16", "grad_accum:steps=4", "checkpointing", "compile"],
        "repeats": "auto",
        "budget": {"warmup_steps": 3, "min_steps": 15, "min_seconds": 0.5, "max_seconds": 4.0,
                   "max_train_seconds": 120.0, "timeout_s": 300.0},
    },
    # One datacenter GPU (the default where the device is CUDA; docs/gpu.md): workloads that keep it busy and the
    # sets GPU users ask about. The SDPA kernels and checkpointing run beside bf16, the precision a GPU trains in
    # (the flash kernel takes no fp32). Each size's quality budget takes about a minute in fp32 on an H200 (an
    # estimate: bench.plan.gpu); scripts/gpu_check.sh runs the core sets (GPU_CHECK) in speed mode.
    "gpu": {
        "workloads": ["gpt:gpt2-124m-b32", "llama:180m", "cnn:resnet18"],
        "techniques": ["baseline", "tf32", "bf16", "fp16", "bf16+compile", "bf16+compile+fused_adamw",
                       "bf16+fp8+compile", "bf16+sparse24", "bf16+checkpointing", "bf16+sdpa_backend:backend=flash",
                       "bf16+sdpa_backend:backend=efficient", "bf16+sdpa_backend:backend=cudnn",
                       "bf16+sdpa_backend:backend=math"],
        "repeats": "auto",
        # A GPU's step varies little from process to process (the first H200 run: tf32 2.59x [2.58, 2.61] faster
        # over 3 seeds), so a 2 s window of at least 10 steps suffices; the fp32 baseline's 0.5 s steps make 10
        # steps the longer bound there.
        "budget": {"warmup_steps": 3, "min_steps": 10, "min_seconds": 2.0, "max_seconds": 10.0,
                   "max_train_seconds": 150.0, "timeout_s": 420.0},
    },
    # A laptop: small sizes with their documented budgets. Hours on 2 CPU cores; minutes on a GPU.
    "standard": {
        "workloads": ["mlp:small", "gpt:small", "cnn:small"],
        "techniques": ["baseline", "bf16", "fp16", "grad_accum:steps=4", "checkpointing", "compile", "bf16+compile"],
        "repeats": "auto",
        "budget": {"warmup_steps": 5, "min_steps": 30, "min_seconds": 3.0, "max_seconds": 30.0,
                   "max_train_seconds": 1800.0, "timeout_s": 3600.0},
    },
}

# What scripts/gpu_check.sh measures in its 8 minutes: the gpu preset's transformer and the sets that reach its
# datasheet peak, from tf32 up to the bare loop's recipe (bf16, compile and fused AdamW), in speed mode at --repeats
# auto. bench.plan.gpu.check_plan sizes it; tests/test_gpu_check.py holds it to the time budget.
GPU_CHECK: dict[str, Any] = {
    "workloads": ["gpt:gpt2-124m-b32"],
    # In the order users ask about them, which the check runs them in (priority): bf16 against the baseline, then
    # compile, then tf32, then the bare loop's recipe; a check cut short has the first comparisons complete.
    "techniques": ["baseline", "bf16", "bf16+compile", "tf32", "bf16+compile+fused_adamw"],
    "mode": "speed",
    "order": "priority",
}

SWEEP_KEYS = ("preset", "workloads", "techniques", "repeats", "max_repeats", "decide_within", "order", "seed", "device", "nproc", "nnodes", "threads", "mode",
              "budget", "models", "blocks", "technique_plugins", "price_per_hour", "instance", "prices", "shard",
              "isolation")
ISOLATIONS = ("fork", "fresh")  # bench.run.isolation
ISOLATION_ENV = "TRAINBENCH_ISOLATION"  # the default when neither a flag nor a config names one (tests: fresh)


def default_isolation() -> str:
    """``fork``, unless ``TRAINBENCH_ISOLATION`` says otherwise (the test suite runs once with it set to fresh)."""
    return os.environ.get(ISOLATION_ENV) or "fork"
RECORDED_KEYS = ("sources_sha256",)  # written into sweep.toml by the harness; not settings a user gives


def default_preset(device: str) -> str:
    """The preset a sweep starts from when none is named: ``gpu`` where its trials run on CUDA (``--device cuda``, or
    ``auto`` on a machine whose torch sees a GPU), else ``quick``."""
    return "gpu" if device == "cuda" or (device == "auto" and cuda_caps.available()) else "quick"


def build_config(
    preset: str | None = None, overrides: dict[str, Any] | None = None, toml_path: Path | None = None
) -> SweepConfig:
    """Preset, then the TOML file, then CLI overrides (highest priority). No preset named (here or in the file):
    ``default_preset`` of the device the file or the overrides give."""
    layers: list[dict[str, Any]] = []
    file_data: dict[str, Any] = {}
    if toml_path is not None:
        file_data = load_toml(toml_path)
        preset = file_data.pop("preset", None) or preset
    if preset is None:
        preset = default_preset((overrides or {}).get("device") or file_data.get("device") or "auto")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"unknown preset {shown(preset)} (valid presets: {', '.join(PRESETS)})")
    layers = [PRESETS[preset], file_data, {k: v for k, v in (overrides or {}).items() if v is not None}]
    merged: dict[str, Any] = {"name": preset}
    budget: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "budget":
                if not isinstance(value, dict):
                    raise ConfigError(f"budget must be a table of budget keys, e.g. [budget] then min_seconds = 1.0; "
                                      f"got {shown(value)} ({type(value).__name__})")
                budget.update(value)
            elif key in ("models", "technique_plugins") and merged.get(key):
                merged[key] = [*_sources(key, merged), *_sources(key, layer)]  # additive: --model beside a config's
            elif key in ("price_per_hour", "instance"):  # one setting: a later layer's either replaces both
                if "price_per_hour" in layer and "instance" in layer:
                    raise ConfigError("give price_per_hour or instance, not both (the instance's price is looked "
                                      "up in [prices] and the built-in table)")
                merged.pop("price_per_hour", None)
                merged.pop("instance", None)
                merged[key] = value
            elif key == "prices":
                merged[key] = {**merged.get(key, {}), **cost.check_prices(value)}
            else:
                merged[key] = value
    if file_data.get("name"):
        merged["name"] = file_data["name"]
    technique_plugins, models = _load_plugins(merged)
    if models:  # a model adds itself to the workloads, which are only the models unless workloads were given
        given = "workloads" in file_data or (overrides or {}).get("workloads") is not None
        raw = _names("workloads", merged["workloads"]) if given else []
        labels = [x for x in (raw.split(",") if isinstance(raw, str) else raw) if x.strip()]
        named = {x.strip().partition(":")[0] for x in labels}
        labels += [m.name for m in models if m.name not in named]
        merged["workloads"] = labels
    _check_gpu_sizes_have_a_gpu(preset, merged)
    valid_budget = {f.name for f in dataclasses.fields(Budget)}
    unknown = set(budget) - valid_budget
    if unknown:
        raise ConfigError(f"unknown budget key(s) {', '.join(shown(k) for k in sorted(unknown))} "
                          f"(valid: {', '.join(sorted(valid_budget))})")
    return SweepConfig(
        name=merged["name"],
        workloads=tuple(parse_workloads(_names("workloads", merged["workloads"]))),
        techniques=tuple(parse_technique_sets(_names("techniques", merged["techniques"]))),
        **_repeats(merged.get("repeats", 3), merged.get("max_repeats")),
        decide_within=merged.get("decide_within"),
        order=merged.get("order", ORDERS[0]),
        seed=merged.get("seed", 0),
        device=merged.get("device", "auto"),
        nproc=merged.get("nproc", 1),
        nnodes=merged.get("nnodes", 1),
        threads=merged.get("threads", 0),
        mode=merged.get("mode", "both"),
        budget=Budget(**budget),
        models=models,
        technique_plugins=technique_plugins,
        price_per_hour=(cost.check_price(merged["price_per_hour"], "price_per_hour")
                        if merged.get("price_per_hour") is not None else None),
        instance=merged.get("instance"),
        prices=tuple(sorted(merged.get("prices", {}).items())),
        shard=parse_shard(merged["shard"]) if merged.get("shard") is not None else None,
        isolation=merged["isolation"] if "isolation" in merged else default_isolation(),
    )


def _check_gpu_sizes_have_a_gpu(preset: str, merged: dict[str, Any]) -> None:
    """The gpu preset's own workloads on a CPU would take hours a trial: refused with what to run instead. Its sets on
    workloads the user names (``--workloads gpt:tiny``) run anywhere, the CUDA-only ones skipped with their reasons."""
    device = merged.get("device", "auto")
    on_cpu = device == "cpu" or (device == "auto" and not cuda_caps.available())
    if preset == "gpu" and on_cpu and merged.get("workloads") == PRESETS["gpu"]["workloads"]:
        raise ConfigError(f"the gpu preset's workloads ({', '.join(PRESETS['gpu']['workloads'])}) are sized for a "
                          "datacenter GPU and this sweep runs on the CPU, where each of their trials would take "
                          "hours; use --device cuda on a GPU machine (also when a batch executor "
                          "sends the trials to one), --preset quick here, or name small workloads, e.g. --preset gpu "
                          "--workloads gpt:tiny")


def _repeats(repeats: Any, max_repeats: Any) -> dict[str, Any]:
    """``repeats = "auto"`` (a sequential design from 3 repeats up to ``max_repeats``, default ``DEFAULT_MAX_REPEATS``) or a whole number
    (a fixed design, unless ``max_repeats`` is given too: then sequential from that many)."""
    if max_repeats is not None:
        _check_type("max_repeats", max_repeats, "int")
    if repeats == "auto":
        return {"repeats": MIN_SEQUENTIAL_START, "max_repeats": max_repeats or DEFAULT_MAX_REPEATS}
    if isinstance(repeats, str) and re.fullmatch(r"[+-]?\d+", repeats.strip()):
        repeats = int(repeats)  # "-1" too, so that it is refused as 0 is, with the same words
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(repeats_error(repeats))
    return {"repeats": repeats, "max_repeats": max_repeats or 0}


def repeats_error(value: Any) -> str:
    """One message for every bad ``repeats`` (0, -1, 2.7, "abc"): what is valid, then what was given."""
    return f"repeats must be a whole number of at least 1, or \"auto\"; got {shown(value)}"


def parse_shard(text: Any) -> tuple[int, int]:
    """``"1/3"`` -> ``(1, 3)``: this machine runs shard 1 of 3 (indices from 0)."""
    index, sep, count = str(text).partition("/")
    try:
        if not sep:
            raise ValueError
        shard = int(index), int(count)
    except ValueError:
        raise ConfigError(f"shard must be INDEX/COUNT with the index counted from 0, e.g. 0/2 and 1/2; got "
                          f"{shown(text)}") from None
    if shard[1] < 1 or not 0 <= shard[0] < shard[1]:
        raise ConfigError(f"shard {shown(text)}: the index must be 0 to {max(shard[1] - 1, 0)} of a count >= 1 "
                          "(e.g. 0/2 and 1/2)")
    return shard


def shard_text(shard: tuple[int, int]) -> str:
    return f"{shard[0]}/{shard[1]}"


def check_shard(shard: tuple[int, int], n_workloads: int) -> None:
    """A shard runs whole workloads (see ``plan.shard``): more shards than workloads would leave some empty."""
    if shard[1] > n_workloads:
        raise ConfigError(f"shard {shard_text(shard)}: the plan has {n_workloads} workload(s) and a shard runs whole "
                          f"workloads (each machine keeps a workload's baseline and all its repeats, so every "
                          f"comparison is made on one machine); use at most {n_workloads} shards")


def _load_plugins(merged: dict[str, Any]) -> tuple[tuple[plugins.Plugin, ...], tuple[plugins.Plugin, ...]]:
    """Installed plugins, then the technique classes and models the config names, registered in this process."""
    from bench.plan import user_models as user

    plugins.load_entry_points()
    blocks = merged.get("blocks")
    if blocks is not None:
        _check_type("blocks", blocks, "str")
    techs = tuple(dict.fromkeys(plugins.register_technique(t) for t in _sources("technique_plugins", merged)))
    models = tuple(dict.fromkeys(user.parse_model(m, blocks) for m in _sources("models", merged)))
    if blocks is not None and not models:
        raise ConfigError("--blocks names the blocks of a --model; there is none")
    names = [m.name for m in models]
    for name in {n for n in names if names.count(n) > 1}:
        sources = [m.source for m in models if m.name == name]
        raise ConfigError(f"two --model entries are named {shown(name)} ({sources[0]} and {sources[1]}): name them "
                          "apart with NAME=PATH.py:FUNCTION")
    device = merged.get("device", "auto")
    for m in models:  # checked where the sweep runs (a GPU machine's --device cpu: on the CPU)
        user.register_model(m, device if device in ("auto", "cpu", "cuda") else "auto")
    return techs, models


def _sources(key: str, layer: dict[str, Any]) -> list[str]:
    value = layer.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"{key} must be an array of strings such as [\"my_model.py:build\"]; got {shown(value)}")
    return value


def load_toml(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path} is a directory; give a TOML file (see docs/commands.md)") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path} is not a text file (not UTF-8); give a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML in {path}: {exc}") from None
    unknown = set(data) - set(SWEEP_KEYS) - {"name", *RECORDED_KEYS}
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(shown(k) for k in sorted(unknown))} "
                          f"(valid: {', '.join(SWEEP_KEYS + ('name',))})")
    return data
