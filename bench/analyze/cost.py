"""Time turned into money, and joules per sample: exact arithmetic on measured numbers, nothing estimated.

The price is per machine-hour: what the whole instance (or machine) the trial ran on costs an hour, all its GPUs
and cores together, whether the trial used one device of it or all. A trial spread over N machines (``nnodes``)
costs N machine-hours per hour. Formulas (seconds and samples as recorded; ``p`` in currency per machine-hour):

- cost of a run:                       p x machines x seconds / 3600
- cost per million samples:            p x machines / (samples_per_s x 3600) x 1e6
- cost to reach the target:            p x machines x time_to_target_with_one_off_s / 3600 (a miss: no cost)
- saved per 1,000 training hours at a speedup s over the reference:
                                       1000 x p x (1 - 1/s)   (negative: the set costs more)
- energy per sample:                   joules of the timed window / samples trained in it (steps x global batch)
- energy to reach the target:          energy per sample x samples_to_target (the steady step's energy rate over
                                       the samples the quality run needed; evaluation, one-off cost and idle time
                                       are not in it)

Saved-per-1,000-hours is increasing in s, so a speedup's interval [lo, hi] maps to [f(lo), f(hi)] endpoint by
endpoint. The example instance prices below are a starting point, not a quote: check the provider's page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.core.errors import ConfigError
from bench.core.text import shown

SECONDS_PER_HOUR = 3600.0
HOURS_SAVED_BASIS = 1000.0  # "money saved per 1,000 training hours"


@dataclass(frozen=True)
class InstancePrice:
    """An example on-demand price of one instance (USD per instance-hour, Linux, no discounts)."""

    name: str
    usd_per_hour: float
    hardware: str
    region: str
    as_of: str
    source: str


_AWS = "https://aws.amazon.com/ec2/pricing/on-demand/"
_GCP = "https://cloud.google.com/compute/vm-instance-pricing"

# On-demand list prices as listed in 2025 (this table was not fetched live: prices change, and AWS cut P4/P5
# on-demand prices by up to 45% in June 2025; check the source before quoting a cost). Override or extend it in
# the sweep's TOML: [prices] then name = USD per hour.
INSTANCES: dict[str, InstancePrice] = {p.name: p for p in (
    InstancePrice("c7i.large", 0.08925, "2 vCPU (Intel Sapphire Rapids), 4 GiB", "AWS us-east-1",
                  "as listed 2025", _AWS),
    InstancePrice("n2-standard-2", 0.097118, "2 vCPU (Intel), 8 GiB", "GCP us-central1", "as listed 2025", _GCP),
    InstancePrice("g6.xlarge", 0.8048, "1 x NVIDIA L4 24 GB, 4 vCPU", "AWS us-east-1", "as listed 2025", _AWS),
    InstancePrice("p4d.24xlarge", 32.7726, "8 x NVIDIA A100 40 GB, 96 vCPU", "AWS us-east-1",
                  "as listed early 2025, before the June 2025 P4/P5 price cut", _AWS),
    InstancePrice("p5.48xlarge", 98.32, "8 x NVIDIA H100 80 GB, 192 vCPU", "AWS us-east-1",
                  "as listed early 2025, before the June 2025 P4/P5 price cut", _AWS),
)}


@dataclass(frozen=True)
class Price:
    """A price per machine-hour and where it came from (shown beside every cost)."""

    per_hour: float
    basis: str


def check_price(value: Any, where: str) -> float:
    """A price per hour: a finite number >= 0 (a TOML string or a boolean is an error naming ``where``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a price per machine-hour, a number >= 0 such as 2.50; got {shown(value)}")
    return float(value)


def check_prices(table: Any) -> dict[str, float]:
    """The ``[prices]`` table of a config: instance name -> price per hour."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"prices must be a table of instance = price per hour, e.g. [prices] then "
                          f"\"my-box\" = 1.25; got {shown(table)}")
    for k, v in table.items():
        if isinstance(v, Mapping):  # TOML read p5.48xlarge = 1 as a nested table
            raise ConfigError(f"prices.{k} is a table: quote instance names with dots, e.g. \"p5.48xlarge\" = 55.0")
    return {str(k): check_price(v, f"prices.{k}") for k, v in table.items()}


def instance_price(name: str, prices: Mapping[str, float] | None = None) -> Price:
    """The price of a named instance: the config's ``[prices]`` first, then ``INSTANCES``. An unknown name is a
    ``ConfigError`` listing the valid ones."""
    own = dict(prices or {})
    if name in own:
        return Price(own[name], f"instance {name} at {own[name]:g}/h from the config's [prices]")
    if name in INSTANCES:
        p = INSTANCES[name]
        return Price(p.usd_per_hour, f"instance {name} ({p.hardware}) at USD {p.usd_per_hour:g}/h on-demand, "
                                     f"{p.region}, {p.as_of} ({p.source}); check the current price")
    valid = sorted({*own, *INSTANCES})
    raise ConfigError(f"unknown instance {shown(name)} (valid instances: {', '.join(valid)}; or give "
                      "--price-per-hour, or add it under [prices] in the config)")


def resolve(price_per_hour: float | None, instance: str | None, prices: Mapping[str, float] | None = None
            ) -> Price | None:
    """The price a sweep or a report uses: an explicit price per hour, else the instance's, else none."""
    if price_per_hour is not None and instance is not None:
        raise ConfigError("give a price per hour or an instance, not both")
    if price_per_hour is not None:
        value = check_price(price_per_hour, "price_per_hour")
        return Price(value, f"{value:g} per machine-hour as given")
    if instance is not None:
        return instance_price(instance, prices)
    return None


def from_settings(settings: Mapping[str, Any] | None) -> Price | None:
    """The price recorded in a sweep's ``sweep.toml`` (None when it has none)."""
    s = settings or {}
    return resolve(s.get("price_per_hour"), s.get("instance"), check_prices(s.get("prices") or {}))


# ---- arithmetic ---------------------------------------------------------------------------------------------


def run_cost(price: float, seconds: float, machines: int = 1) -> float:
    """price x machines x hours."""
    return price * machines * seconds / SECONDS_PER_HOUR


def per_million_samples(price: float, samples_per_s: float, machines: int = 1) -> float:
    """Cost of training one million samples at this throughput."""
    return price * machines / (samples_per_s * SECONDS_PER_HOUR) * 1e6


def to_target(price: float, seconds: float | None, machines: int = 1) -> float | None:
    """Cost of the training time to the target (one-off cost included); None for a miss (None or +inf)."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return run_cost(price, seconds, machines)


def saved_per_1000_hours(price: float, speedup: float, machines_ratio: float = 1.0) -> float:
    """What a speedup ``s`` saves on 1,000 machine-hours of the reference's training: the same work takes
    1000 / s hours on ``machines_ratio`` times the reference's machines (a 2-node set against a 1-node reference:
    2), so it costs 1000 x ratio / s machine-hours. Negative when the set costs more."""
    return HOURS_SAVED_BASIS * price * (1.0 - machines_ratio / speedup)


def saved_interval(price: float, speedup: float, lo: float | None, hi: float | None, machines_ratio: float = 1.0
                   ) -> tuple[float, float | None, float | None]:
    """The saving at the speedup and at its interval's endpoints (the map is increasing, so the order is kept)."""
    def at(s: float | None) -> float | None:
        return (None if s is None or not math.isfinite(s) or s <= 0
                else saved_per_1000_hours(price, s, machines_ratio))
    return saved_per_1000_hours(price, speedup, machines_ratio), at(lo), at(hi)


def energy_per_sample(joules: float, samples: float) -> float:
    """Joules of the timed window over the samples trained in it."""
    return joules / samples


def energy_to_target(joules_per_sample: float, samples_to_target: float | None) -> float | None:
    """Energy per sample x the samples the quality run needed to reach the target; None for a miss."""
    if samples_to_target is None or not math.isfinite(samples_to_target):
        return None
    return joules_per_sample * samples_to_target


def money(value: float | None) -> str:
    """A cost for people: 4 significant digits below 1 (never in exponent notation: 0.00003932, not 3.932e-05,
    which reads as a large number at a glance), thousands separators above."""
    if value is None or not math.isfinite(value):
        return "-"
    a = abs(value)
    if a >= 100:
        return f"{value:,.0f}"
    if a >= 1:
        return f"{value:,.2f}"
    return str(np.format_float_positional(value, precision=4, unique=False, fractional=False, trim="-"))


def interval_text(value: float, lo: float | None, hi: float | None) -> str:
    """`` [lo, hi]`` in ``money``'s format; "" without an interval or when it shows as the value itself."""
    if lo is None or hi is None or money(lo) == money(hi) == money(value):
        return ""
    return f" [{money(lo)}, {money(hi)}]"


__all__ = ["INSTANCES", "InstancePrice", "Price", "check_price", "check_prices", "energy_per_sample",
           "energy_to_target", "from_settings", "instance_price", "interval_text", "money", "per_million_samples", "resolve",
           "run_cost", "saved_interval", "saved_per_1000_hours", "to_target"]
