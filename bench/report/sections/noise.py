"""Noise warnings: contended windows, windows measured again, spread above the warning threshold, cut quality
runs."""

from __future__ import annotations

from bench.analyze import stats
from bench.report.document import Bullets, Section
from bench.report.sections import Context

ORDER = 130


def build(ctx: Context) -> Section:
    return Section("Noise warnings", "noise", "Noise", [Bullets.of(_noise(ctx))])


def _noise(ctx: Context) -> list[str]:
    analysis = ctx.analysis
    out = []
    frame = analysis.frame
    ok = frame[frame["status"] == "ok"]
    n_cont = int(sum(bool(c) for c in ok["contended"]))
    if n_cont:
        out.append(f"{n_cont} of {len(ok)} timed windows shared the CPU with other processes (more than 10% of the "
                   "cores busy with foreign work) even after being measured again: they are left out of the speed "
                   "numbers and verdicts.")
    retried = int(sum(len(r) for r in ok["contention_retries"]))
    if retried:
        out.append(f"{retried} timed window(s) were measured again because other processes used the cores "
                   "(budget.contention_retries); only the last window of each trial counts.")
    for c in analysis.configs.itertuples():
        where = ctx.where(c.workload, c.machine)
        why = []
        if c.noisy:
            why.append(f"IQR/median of samples/s over repeats is {c.sps_rel_iqr:.0%} (warning above "
                       f"{stats.NOISY_IQR_OVER_MEDIAN:.0%})")
        if c.n_contended:
            why.append(f"{c.n_contended} of {c.n_ok} timed windows were contended (left out of its speed numbers)")
        if why:
            out.append(f"{c.technique} on {where}: {'; '.join(why)}.")
        if c.n_cut:
            out.append(f"{c.technique} on {where}: the safety cap (max_train_seconds) cut {c.n_cut} of its quality "
                       "runs; they are left out of every quality comparison.")
    if not out:
        out.append("None: every configuration's spread is below the warning threshold and no timed window was "
                   "contended.")
    return out
