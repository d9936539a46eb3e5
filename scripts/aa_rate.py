#!/usr/bin/env python
"""How often the A/A gate cries wolf, and how often it catches a uniform slowdown.

Runs N A/A gates (`python -m bench sweep --ab .` with the gate's settings and `--repeats auto`) back to back, each
into its own directory under one output directory, and counts the runs whose comparison of B against A gave any
false verdict (faster, slower, more memory, less memory, better or worse, in any configuration or overall). With
``--slowdown F`` (default 0.05) it also runs N gates whose side B is a temporary copy of this checkout with a
wait of F times each training step's own time added at the end of the step (``bench/loop.py``'s
``TrainLoop.step``, patched in the copy only: the harness itself is unchanged), and counts the runs that call B
slower overall. The two kinds alternate, so the machine's drift hits both alike.

    .venv/bin/python scripts/aa_rate.py -n 10            # the issue's measurement: about 10 x 2 gates
    .venv/bin/python scripts/aa_rate.py -n 1 --sweep-args "--preset smoke --repeats auto --max-repeats 4 \\
        --workloads mlp --techniques baseline --window-seconds 0.05 --mode speed"   # a quick check of the script

Time it only on a machine nobody else is using: every gate is a timing measurement. Each run's directory stays
(the path is printed), with its log beside it; exit code 0 unless a sweep itself failed.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GATE_ARGS = "--preset smoke --repeats auto --workloads mlp,gpt --techniques baseline --window-seconds 1"
CHANGES = {"faster", "slower", "more", "less", "better", "worse"}

# The injected slowdown: at the start of TrainLoop.step the clock is read, and before the step counter moves on the
# step waits FACTOR times what it took (on CPU the step is synchronous, so that is its compute time). A busy wait,
# not time.sleep: a sleep of a fraction of a millisecond (5% of a tiny model's step) oversleeps by tens of
# microseconds, which would make the slowdown larger than asked on the smallest steps.
_STEP_DEF = "    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:\n"
_STEP_END = "        self.ctx.step += 1\n"
_CLOCK = "__import__('time').perf_counter()"


def slowed_copy(dest: Path, factor: float) -> Path:
    """A copy of this checkout's code (bench/, techniques/) whose every training step is ``factor`` slower."""
    for name in ("bench", "techniques"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    loop = dest / "bench" / "loop.py"
    text = loop.read_text()
    if text.count(_STEP_DEF) != 1 or text.count(_STEP_END) != 1:
        sys.exit("aa_rate: bench/loop.py's TrainLoop.step no longer looks as this script expects; update the patch")
    text = text.replace(_STEP_DEF, _STEP_DEF + f"        _slowdown_t0 = {_CLOCK}\n")
    wait = (f"        _slowdown_end = {_CLOCK} + {factor!r} * ({_CLOCK} - _slowdown_t0)  # aa_rate.py: injected\n"
            f"        while {_CLOCK} < _slowdown_end:\n            pass\n")
    loop.write_text(text.replace(_STEP_END, wait + _STEP_END))
    return dest

def gate(other: str, out: Path, sweep_args: list[str]) -> tuple[int, float]:
    """One `sweep --ab` run from this checkout (side A) against ``other`` (side B): its exit code and wall time."""
    cmd = [sys.executable, "-m", "bench", "sweep", "--ab", other, *sweep_args, "--out", str(out)]
    started = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    return rc, time.perf_counter() - started


def verdicts(out: Path, threshold: float) -> tuple[list[str], str]:
    """The change verdicts of the comparison of OUT/b against OUT/a ("where: verdict"), and a one-line summary."""
    sys.path.insert(0, str(REPO))
    from bench.analyze import compare

    comp = compare.compare_dirs(out / "a", out / "b", threshold)
    found = [f"{row.key.label} {q.quantity}: {q.verdict}" for row in comp.rows for q in row.quantities
             if q.verdict in CHANGES]
    found += [f"overall {o.quantity}: {o.verdict}" for o in comp.overall if o.verdict in CHANGES]
    parts = []
    for row in comp.rows:
        est = row.throughput.estimate
        ratio = f"{est.value:.3f} [{est.lo:.3f}, {est.hi:.3f}] ({est.n} pairs)" if est and est.has_interval else "-"
        why = f" ({'; '.join(row.notes)})" if est is None and row.notes else ""  # e.g. every window contended
        parts.append(f"{row.key.label} {ratio} {row.throughput.verdict}{why}")
    for o in comp.overall:
        if o.quantity == "throughput" and o.estimate.has_interval:
            parts.append(f"overall {o.estimate.value:.3f} [{o.estimate.lo:.3f}, {o.estimate.hi:.3f}] {o.verdict}")
    return found, "; ".join(parts)


def called_slower(out: Path, threshold: float) -> bool:
    """Whether the comparison calls B slower: overall, or (one configuration, so no overall) in that one."""
    sys.path.insert(0, str(REPO))
    from bench.analyze import compare

    comp = compare.compare_dirs(out / "a", out / "b", threshold)
    overall = [o for o in comp.overall if o.quantity == "throughput"]
    if overall:
        return overall[0].verdict == "slower"
    return bool(comp.rows) and all(row.throughput.verdict == "slower" for row in comp.rows)


def upper_bound(k: int, n: int) -> float:
    """The one-sided 95% Clopper-Pearson upper bound of a rate seen k times in n."""
    from scipy import stats

    return 1.0 if k == n else float(stats.beta.ppf(0.95, k + 1, n - k))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10, help="gates of each kind (default 10)")
    p.add_argument("--slowdown", type=float, default=0.05,
                   help="side B's injected slowdown per step, a fraction (default 0.05; 0: A/A runs only)")
    p.add_argument("--threshold", type=float, default=0.02,
                   help="the gate's threshold, a fraction (default 0.02): the smallest change of B that counts, "
                        "passed to the sweep (its sequential phase) and to the comparison. A slowdown as large as "
                        "the threshold sits on it and can only be called slower half the time, so the gate that is "
                        "to catch 5%% needs a threshold below 5%%")
    p.add_argument("--sweep-args", default=GATE_ARGS, help=f"the gate's sweep flags (default: {GATE_ARGS})")
    p.add_argument("--out", type=Path, help="where the runs go (default: a new temporary directory)")
    args = p.parse_args(argv)
    if args.n < 1 or not 0 <= args.slowdown < 10:
        p.error("-n must be at least 1 and --slowdown a fraction between 0 and 10")
    root = args.out or Path(tempfile.mkdtemp(prefix="trainbench-aa-rate-"))
    root.mkdir(parents=True, exist_ok=True)
    sweep_args = [*shlex.split(args.sweep_args), "--threshold", str(args.threshold)]
    kinds = [("aa", ".")]
    if args.slowdown > 0:
        kinds.append(("slow", str(slowed_copy(root / "slowed-checkout", args.slowdown))))
    print(f"aa_rate: {args.n} gate(s) of each of {', '.join(k for k, _ in kinds)} at threshold {args.threshold:.0%} "
          f"into {root}: {shlex.join(sweep_args)}", flush=True)
    counts = {kind: [0, 0] for kind, _ in kinds}  # kind -> [gates that ran, gates with the verdict counted]
    failed = 0
    for i in range(args.n):
        for kind, other in kinds:
            out = root / f"{kind}-{i}"
            rc, wall = gate(other, out, sweep_args)
            if rc != 0:
                failed += 1
                print(f"{kind} {i}: the sweep failed (exit {rc}); see {out}.log", flush=True)
                continue
            found, summary = verdicts(out, args.threshold)
            if kind == "aa":
                hit = bool(found)
                word = "FALSE VERDICT: " + ", ".join(found) if found else "no verdict of a change"
            else:
                hit = called_slower(out, args.threshold)
                word = "slower overall" if hit else "NOT called slower overall"
            counts[kind][0] += 1
            counts[kind][1] += hit
            print(f"{kind} {i} ({wall:.0f} s): {word} | {summary}", flush=True)
    ran, false = counts["aa"]
    if ran:
        print(f"A/A: {false} of {ran} gate(s) gave a false verdict (one-sided 95% upper bound of the rate: "
              f"{upper_bound(false, ran):.0%})")
    if "slow" in counts and counts["slow"][0]:
        ran, caught = counts["slow"]
        print(f"B {args.slowdown:.0%} slower per step: {caught} of {ran} gate(s) called it slower overall")
    if failed:
        print(f"{failed} sweep(s) failed: their logs are in {root}")
    return 1 if failed else 0

if __name__ == "__main__":
    raise SystemExit(main())
