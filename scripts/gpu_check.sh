#!/usr/bin/env bash
# GPU check: one prepared run for a short GPU slot (docs/gpu.md). On a machine with an NVIDIA GPU it runs the
# GPU-marked tests, then the gpu preset's core sets (GPU_CHECK in bench/plan/config.py: gpt:gpt2-124m-b32 with tf32,
# bf16, bf16+compile and bf16+compile+fused_adamw against fp32) in speed mode at --repeats auto, so its comparisons
# reach verdicts, writes records, report and figures into reports/example-<gpu>/ (reports/example-h200/ on an
# H200), and prints where the time went. Sized for 8 minutes on one H200, so a 15-minute slot can run it twice; the
# sizing is an estimate (python -m bench.dev.gpu_plan prints it). A cap stops the sweep at the slot's end in any case,
# keeping every finished trial, and running the script again resumes there: no trial is measured twice.
#
#   bash scripts/setup.sh --test && bash scripts/gpu_check.sh      # on the GPU machine
#   PYTHON=/path/to/python bash scripts/gpu_check.sh                 # another interpreter (default: .venv/bin/python)
#   GPU_CHECK_OUT=reports/my-gpu bash scripts/gpu_check.sh           # another output directory
#   GPU_CHECK_BUDGET_S=900 bash scripts/gpu_check.sh                 # another slot (seconds; default 480)
#   GPU_CHECK_FRESH=1 bash scripts/gpu_check.sh                      # move a previous run aside instead of resuming it
#
# Exit codes: 0 all ran and passed; 3 no usable GPU (nothing was run); 124 the slot ran out (finished trials kept:
# run it again to resume); 1 GPU tests failed (the sweep still ran); otherwise the failing stage's code.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
LIMIT_MIB=${GPU_CHECK_LIMIT_MIB:-64}  # the directory comes back whole from a remote machine below this size
TESTS_CAP_S=90                        # the GPU tests' cap (bench.plan.gpu.PYTEST_S; the first H200 run took 32 s)
REPORT_S=30                           # kept back for rendering the report after a cut sweep
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3 || true)

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }
left() { echo $(( BUDGET_S - (SECONDS - START) )); }
STAGES=()
mark() { STAGES+=("--script" "$1=$(( SECONDS - STAGE_START ))"); STAGE_START=$SECONDS; }
STAGE_START=$SECONDS

# ---- fail fast without a GPU ---------------------------------------------------------------------------------
[ -n "$PY" ] || die "no Python found: run 'bash scripts/setup.sh' first (or set PYTHON=...)" 3
command -v nvidia-smi >/dev/null 2>&1 \
  || die "nvidia-smi not found: this machine has no NVIDIA driver/GPU; the GPU check needs one (nothing was run)" 3
GPUS=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null) \
  || die "nvidia-smi found no usable GPU ($(nvidia-smi -L 2>&1 | head -1)); nothing was run" 3
[ -n "$GPUS" ] || die "nvidia-smi lists no GPU; nothing was run" 3
if ! TORCH_INFO=$("$PY" -c 'import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA build: {torch.version.cuda}) cannot use the GPU")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"compute capability {torch.cuda.get_device_capability(0)}")' 2>&1); then
  die "torch.cuda.is_available() is False: ${TORCH_INFO##*$'\n'}. A CPU-only torch build? Install a CUDA build \
into this environment, e.g. $PY -m pip install --force-reinstall 'torch>=2.4' (nothing was run)" 3
fi
# reports/example-h200 on an "NVIDIA H200": the first GPU's name, lower case, without the vendor
SLUG=$(echo "${GPUS%%$'\n'*}" | cut -d, -f1 | tr '[:upper:]' '[:lower:]' | sed -e 's/^ *nvidia *//' \
       -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
OUT=${GPU_CHECK_OUT:-reports/example-${SLUG:-gpu}}
echo "gpu_check: $GPUS"
echo "gpu_check: $TORCH_INFO"
mark "checks"

# ---- 1. the GPU-marked tests (a failure is reported at the end; the sweep still runs) ----------------------------
echo "gpu_check: [1/2] pytest -m gpu (at most ${TESTS_CAP_S}s)"
TEST_LOG=$(mktemp --suffix=.txt)
trap 'rm -f "$TEST_LOG"' EXIT
timeout "$TESTS_CAP_S" "$PY" -m pytest -q -m gpu -rA -p no:cacheprovider >"$TEST_LOG" 2>&1
tests_rc=$?
tail -1 "$TEST_LOG"
case $tests_rc in
  0) ;;
  5) echo "gpu_check: no GPU-marked tests were collected"; tests_rc=0 ;;
  124) echo "gpu_check: the GPU tests ran past ${TESTS_CAP_S}s (cut)" ;;
  *) echo "gpu_check: GPU tests failed (exit $tests_rc): see $OUT/pytest-m-gpu.txt" ;;
esac
mark "GPU tests"

# ---- 2. the core sets, sized to what is left -------------------------------------------------------------------
RESUME=()
if [ -e "$OUT/sweep.toml" ]; then
  if [ -n "${GPU_CHECK_FRESH:-}" ]; then  # never overwrite results silently: keep the previous run beside it
    PREV="$OUT.prev-$(date -u +%Y%m%d-%H%M%S)"
    mv "$OUT" "$PREV" && echo "gpu_check: moved the previous $OUT to $PREV"
  else
    RESUME=(--resume)
    "$PY" -m bench.dev.gpu_check restore "$OUT"
    echo "gpu_check: resuming the run in $OUT (its finished trials are kept; GPU_CHECK_FRESH=1 starts anew)"
  fi
fi
PLAN=$("$PY" -m bench.dev.gpu_plan --left-s "$(( $(left) ))") || echo "gpu_check: the estimate says the planned trials \
do not fit the $(left)s left; the cap keeps what finishes, and running the script again resumes"
eval "$PLAN"
[ -n "${CHECK_WORKLOADS:-}" ] || die "could not plan the sweep: python -m bench.dev.gpu_plan failed (its lines above)" 1
SWEEP_S=$(( $(left) - REPORT_S ))
[ "$SWEEP_S" -gt 60 ] || die "too little time left for the sweep (${SWEEP_S}s)" 124
echo "gpu_check: [2/2] sweep -> $OUT (at most ${SWEEP_S}s; sequential phase ${CHECK_DECIDE_WITHIN}s)"
# SIGINT at the cap: the sweep stops like Ctrl-C, keeping every finished trial.
timeout -k 30 -s INT "$SWEEP_S" "$PY" -m bench sweep --preset gpu --device cuda --workloads "$CHECK_WORKLOADS" \
  --techniques "$CHECK_TECHNIQUES" --mode "$CHECK_MODE" --repeats auto --decide-within "$CHECK_DECIDE_WITHIN" \
  --out "$OUT" ${RESUME[@]+"${RESUME[@]}"}
sweep_rc=$?
mark "sweep"
if [ $sweep_rc -ne 0 ] && [ -e "$OUT/results.jsonl" ]; then  # cut or failed: the report of what finished
  timeout "$(( $(left) > 20 ? $(left) : 20 ))" "$PY" -m bench report "$OUT" >/dev/null \
    && echo "gpu_check: report of the finished trials in $OUT/"
fi
[ -d "$OUT" ] && cp "$TEST_LOG" "$OUT/pytest-m-gpu.txt"
mark "report"

# ---- where the time went; the directory kept small enough to come back whole ------------------------------------
if [ -d "$OUT" ]; then
  "$PY" -m bench.dev.gpu_check times "$OUT" ${STAGES[@]+"${STAGES[@]}"} | tee "$OUT/gpu-check.txt"
  "$PY" -m bench.dev.gpu_check keep "$OUT" --limit-mib "$LIMIT_MIB"
fi
case $sweep_rc in
  0) ;;
  124) die "the slot's ${BUDGET_S}s ran out during the sweep: finished trials are in $OUT; run the script again to \
resume" 124 ;;
  2) if [ ${#RESUME[@]} -gt 0 ]; then
       die "the sweep refused to resume $OUT (exit 2, its line above): if the previous run there was made with \
other settings, GPU_CHECK_FRESH=1 moves it aside and starts anew" 2
     fi
     die "the sweep refused its input (exit 2, its line above)" 2 ;;
  *) die "the sweep exited $sweep_rc (finished trials are in $OUT/results.jsonl; run the script again to resume)" \
       "$sweep_rc" ;;
esac
[ $tests_rc -eq 0 ] || die "GPU tests failed or were cut (exit $tests_rc): see $OUT/pytest-m-gpu.txt" 1
echo "gpu_check: done in $(( SECONDS - START ))s; report in $OUT/"
