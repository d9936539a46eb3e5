"""How to read this report: what each measurement is and how a verdict is made."""

from __future__ import annotations

from bench.analyze import stats
from bench.analyze.analysis import EXACT_CURVE_RTOL, Analysis
from bench.core import words
from bench.records.results import PARITY_HARMLESS, PARITY_K_TOL, PARITY_TOLERANCES
from bench.report.cells import say
from bench.report.document import Bullets, Section
from bench.report.sections import Context

ORDER = 150


def build(ctx: Context) -> Section:
    return Section("How to read this report", "method", "How to read", [Bullets.of(_method(ctx.analysis))])


def _method(analysis: Analysis) -> list[str]:
    th = analysis.thresholds
    return [
        "Two measurements that never share a budget. Speed: a timed window after warm-up, device sync only at its "
        "edges. Quality: every set of a workload trains the same samples from the same initial weights and "
        "batches, evaluated (untimed) at the same sample counts. The first step's cost beyond a steady step "
        "(compilation) is a one-off, kept out of both and shown on its own.",
        f"Comparisons against '{analysis.baseline}' pair the trials of the same seed (same weights and batches, "
        f"run in the same repeat round; the order of the sets within a round is shuffled). Ratios are geometric "
        f"means with a {stats.CONFIDENCE:.0%} Student-t interval on the per-seed log-ratios (a percentile "
        "bootstrap over 3 seeds cannot reach beyond the extreme pair and covered the truth in 67% of simulated "
        f"cases); a sequential sweep (--repeats auto) adds speed-only pairs while a verdict is open and reads "
        "every look with a repeated confidence interval, which keeps its 95% over all looks up to the cap. The "
        f"answers: {say('faster')} or {say('slower')} ({say('less')} or {say('more')} memory, {say('sooner')} or "
        f"{say('later')} to the target, {say('better')} or {say('worse')} quality) when the whole interval lies "
        f"beyond the threshold ({th.speed:.0%} for speed, {th.memory:.0%} for memory, {th.time_to_target:.0%} for "
        f"time-to-target, the workload's equivalence margin for the metric); {say(stats.EQUIVALENT)} when it lies "
        f"wholly inside; {say(stats.INCONCLUSIVE)} otherwise (with about how many pairs would decide it); "
        f"{say(stats.NONE)} below {stats.MIN_REPEATS} pairs. The quality answers of this report are corrected for "
        "their number (Holm's step-down procedure).",
        "Samples/s: per trial, samples over the wall time of the timed window; the table shows the median over "
        "repeats and its IQR. MFU (Chowdhery et al. 2022, PaLM, appendix B): achieved FLOP/s = model FLOPs per "
        "step x steps / the window's wall time (the clock of samples/s), the FLOPs counted by torch's "
        "FlopCounterMode on the eager fp32 reference step (matmuls, convolutions and, on GPUs, attention; not "
        "nanoGPT's 6N + 12LTd per token formula). The headline divides it "
        "by one peak for every set, the device's dense bfloat16 peak (datasheet and calibrated; a CPU's fastest "
        "calibrated dtype), as torchtitan and llm.c quote MFU; 'own dtype' "
        "divides by the calibrated peak of the set's own compute dtype, at the trial's thread count.",
        "Peak memory: the tensor-level peak from a tracked step (params, grads, optimizer state, activations, "
        "other temporaries) where it exists, with the process's peak RSS over the timed window beside it; "
        "torch.compile hides tensors from the tracker, so compiled sets have RSS only and their ratio says (RSS).",
        f"Quality at equal samples, by kind: an exact set must reproduce the reference's eval curve seed by seed "
        f"(every evaluation within {EXACT_CURVE_RTOL:.0%} of the range the reference's metric covered) and then "
        f"reads '{say(words.SAME)}'; a "
        "numeric or algorithmic set shows the metric at the full budget, mean ± std over seeds, and its paired "
        "difference, and its metric at the reference's training clock of the same seed: a set whose run took "
        "less time is trained on past its budget to that clock (a continuation; docs/methodology.md), or the cell "
        "says why it could not be.",
        "Time to target: the training clock (evaluation and one-off excluded) at the first evaluation that "
        "reached the workload size's validation target, median over seeds with a miss counted as never (as "
        "AlgoPerf scores it), with the miss rate and the samples it took; the ratio to the reference is given "
        "when neither side missed.",
        "Parity: the first optimizer steps against the eager fp32 reference (its own process, same seed and "
        "batches): losses, and the distance the parameters moved from their initial values (a 10% learning-rate "
        "change moves it by 10%). Both tolerances are calibrated per reference: "
        f"{PARITY_K_TOL:g} x the drift of the same steps from initial weights jittered by a harmless amount ("
        + "; ".join(f"{kind} sets: {name}" for kind, (name, _) in PARITY_HARMLESS.items()) + "), never below "
        "the fixed tolerances (loss, distance: "
        + "; ".join(f"{kind} {loss:.0e}, {dist:.0e}" for kind, (loss, dist) in PARITY_TOLERANCES.items()) + "). "
        "The reference also trains with the learning rate x 1.1: a check that this bug does not exceed has no "
        f"power. The answer is {say('mismatch', words.PARITY)} when a check with power is exceeded, "
        f"{say('ok', words.PARITY)} when every check with power passes, and {say('inconclusive', words.PARITY)} "
        "otherwise. Records written before the calibration were judged with the fixed tolerances alone, and say so.",
        f"Noise: a warning when IQR/median of per-trial samples/s exceeds {stats.NOISY_IQR_OVER_MEDIAN:.0%}, or "
        "when other processes used more than 10% of the CPU during a timed window.",
    ]
