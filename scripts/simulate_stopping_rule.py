"""The stopping rule of ``--repeats auto`` in simulation: the error rates and pairs of each scenario, as a table.

    .venv/bin/python scripts/simulate_stopping_rule.py [--sims 2000] [--cap 20]

Each row: 2,000 simulated configurations with log-normal per-trial noise (the CV given, on both sides of a pair) and
a true ratio; pairs are added from 3 until the verdict is decided, the configuration is futile (a sweep's futility
stopping, ``bench.analyze.sequential.futile``) or the cap is reached (``bench.analyze.sequential.simulate``, the verdict rule
of ``bench.analyze.stats`` on the design's repeated interval). Beside it, the same data without futility stopping (as
``sweep --ab`` adds pairs), and read by a fixed-n t interval at every look ("stopping once significant"), the rule the
design replaces.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats as sps

from bench.analyze import sequential

SCENARIOS = [(1.0, 0.02), (1.0, 0.10), (1.0, 0.30), (1.10, 0.02), (1.10, 0.05), (1.10, 0.10), (1.20, 0.10),
             (0.50, 0.30), (0.97, 0.02)]


def naive(effect: float, cv: float, cap: int, sims: int, seed: int, threshold: float = 0.05) -> dict[str, float]:
    """A fixed-n 95% t interval read after every pair, stopping at the first decision."""
    rng = np.random.default_rng(seed)
    d = rng.normal(math.log(effect), cv * math.sqrt(2), size=(sims, cap))
    up, down = math.log(1 + threshold), math.log(1 - threshold)
    answer = np.full(sims, "inconclusive", dtype=object)
    active = np.ones(sims, dtype=bool)
    for n in range(3, cap + 1):
        mean = d[:, :n].mean(axis=1)
        half = sps.t.ppf(0.975, n - 1) * d[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        for word, hit in (("faster", mean - half > up), ("slower", mean + half < down),
                          ("equivalent", (mean - half > down) & (mean + half < up))):
            now = active & hit
            answer[now] = word
            active &= ~now
    return {w: float(np.mean(answer == w)) for w in ("faster", "slower", "equivalent")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--cap", type=int, default=20)
    args = parser.parse_args()
    print("| true ratio | CV per trial | faster | slower | equivalent | inconclusive | mean pairs | "
          "without futility stopping: faster / slower / equivalent, mean pairs | "
          "fixed t read at every look: faster / slower / equivalent |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, (effect, cv) in enumerate(SCENARIOS):
        out = sequential.simulate(effect, cv, args.cap, sims=args.sims, seed=100 + i)
        full = sequential.simulate(effect, cv, args.cap, sims=args.sims, seed=100 + i, futility=False)
        nv = naive(effect, cv, args.cap, args.sims, seed=100 + i)
        print(f"| {effect:.2f} | {cv:.0%} | {out['faster']:.1%} | {out['slower']:.1%} | {out['equivalent']:.1%} | "
              f"{out['inconclusive']:.1%} | {out['mean_pairs']:.1f} | "
              f"{full['faster']:.1%} / {full['slower']:.1%} / {full['equivalent']:.1%}, {full['mean_pairs']:.1f} | "
              f"{nv['faster']:.1%} / {nv['slower']:.1%} / {nv['equivalent']:.1%} |")


if __name__ == "__main__":
    main()
