#!/usr/bin/env bash
# GPU check: one prepared run for a short GPU slot (docs/gpu.md). On a machine with an NVIDIA GPU it checks the
# interpreter and the packages, runs the GPU-marked tests, then the gpu preset's core sets (GPU_CHECK in
# bench/plan/config.py: gpt:gpt2-124m-b32 with bf16, bf16+compile, tf32 and bf16+compile+fused_adamw against fp32,
# in that order, each complete before the next) in speed mode at --repeats auto, writes records, report and figures
# into reports/example-<gpu>/ (reports/example-h200/ on an H200), and prints where the time went. The plan is priced
# from measured stage costs with a 20% margin (python -m bench.dev.gpu_plan prints it) and says which sets the slot
# will complete; a cap stops the sweep at the slot's end in any case, keeping every finished trial, the report
# of what finished says what was cut, and running the script again resumes there: no trial is measured twice.
#
#   bash scripts/gpu_check.sh                          # on the GPU machine
#   bash scripts/gpu_check.sh --wheels wheels          # first install the wheels it lacks from wheels/ (no network;
#                                                      # bash scripts/gpu_wheels.sh downloads them elsewhere)
#   bash scripts/gpu_check.sh --rehearse               # the same pipeline on the CPU, stage by stage (CI runs it)
#   bash scripts/gpu_check.sh --checks-only            # only the checks (interpreter, wheels, packages, GPU): seconds
#   PYTHON=/path/to/python bash scripts/gpu_check.sh   # another interpreter (default: .venv/bin/python, else the
#                                                      # first python3 or python on PATH that imports torch)
#   GPU_CHECK_OUT=reports/my-gpu bash scripts/gpu_check.sh   # another output directory
#   GPU_CHECK_BUDGET_S=900 bash scripts/gpu_check.sh   # another slot (seconds; default 480, the rehearsal's 180)
#   GPU_CHECK_FRESH=1 bash scripts/gpu_check.sh        # move a previous run aside instead of resuming it
#
# The rehearsal (--rehearse) needs no GPU: the checks (the GPU's own skipped), the GPU tests (each skips without a
# GPU: this proves they collect) and the GPU path's CPU tests, the plan and its budget, the sweep of the same sets on
# the smallest workload (mlp:tiny) cut on purpose by the cap inside its second group, the report of what finished,
# the time split and the size limit, then the resume, checked to measure no trial twice; into
# runs/gpu-check-rehearsal/ (replaced each time). About 3 minutes on 2 cores.
#
# Exit codes: 0 all ran and passed; 2 bad arguments, or a previous run made with other settings; 3 this machine
# cannot run the check (no usable GPU, no interpreter with torch, a required package missing; nothing was run);
# 124 the slot ran out (finished trials kept: run it again to resume); 1 GPU tests failed (the sweep still ran);
# otherwise the failing stage's code.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }
REHEARSE=""
WHEELS=""
CHECKS_ONLY=""
while [ $# -gt 0 ]; do
  case $1 in
    --rehearse) REHEARSE=1 ;;
    --checks-only) CHECKS_ONLY=1 ;;
    --wheels) [ $# -ge 2 ] || die "--wheels needs a directory of wheels (bash scripts/gpu_wheels.sh makes one)" 2
              WHEELS=$2; shift ;;
    --wheels=*) WHEELS=${1#--wheels=} ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (valid: --rehearse, --wheels DIR, --checks-only, --help)" 2 ;;
  esac
  shift
done
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || die "--wheels $WHEELS: no such directory (bash scripts/gpu_wheels.sh makes one)" 2

BUDGET_S=${GPU_CHECK_BUDGET_S:-$([ -n "$REHEARSE" ] && echo 180 || echo 480)}
LIMIT_MIB=${GPU_CHECK_LIMIT_MIB:-$([ -n "$REHEARSE" ] && echo 2 || echo 64)}  # the rehearsal's: small enough to move its caches
TESTS_CAP_S=90   # the GPU tests' cap (the first H200 run's took 32 s)
CPU_TESTS_CAP_S=240  # the rehearsal's CPU tests of the GPU path: about 40 s on 2 idle cores, far more on busy ones
SITE=${GPU_CHECK_SITE:-.gpu-site}  # where --wheels installs (git-ignored): no root, nothing of the interpreter's changed
left() { echo $(( BUDGET_S - (SECONDS - START) )); }
STAGES=()
STAGE_START=$SECONDS
mark() { STAGES+=("--script" "$1=$(( SECONDS - STAGE_START ))"); STAGE_START=$SECONDS; }

# ---- the interpreter: one that imports torch ----------------------------------------------------------------------
find_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
  local candidate path
  for candidate in .venv/bin/python python3 python; do
    path=$(command -v "$candidate" 2>/dev/null) || continue
    "$path" -c 'import torch' >/dev/null 2>&1 && { echo "$path"; return; }
  done
}
PY=$(find_python)
[ -n "$PY" ] || die "no Python that imports torch: not .venv/bin/python, python3 nor python on PATH; run 'bash \
scripts/setup.sh' or set PYTHON=/path/to/python (nothing was run)" 3

# ---- the GPU (not asked in a rehearsal) -----------------------------------------------------------------------------
if [ -n "$REHEARSE" ]; then
  DEVICE=cpu
  OUT=${GPU_CHECK_OUT:-runs/gpu-check-rehearsal}
  [ -n "${GPU_CHECK_OUT:-}" ] || rm -rf "$OUT" "$OUT.overflow"  # the rehearsal's own directory: made anew each time
  echo "gpu_check: rehearsal on the CPU: no GPU asked for (nvidia-smi and torch.cuda not checked); output in $OUT"
else
  DEVICE=cuda
  command -v nvidia-smi >/dev/null 2>&1 \
    || die "nvidia-smi not found: this machine has no NVIDIA driver/GPU; the GPU check needs one (nothing was run)" 3
  GPUS=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null) \
    || die "nvidia-smi found no usable GPU ($(nvidia-smi -L 2>&1 | head -1)); nothing was run" 3
  [ -n "$GPUS" ] || die "nvidia-smi lists no GPU; nothing was run" 3
  # asked in a process of its own, which exits: the sweep's process never holds a CUDA context (bench.measure.cuda_caps)
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
fi
echo "gpu_check: interpreter $PY ($("$PY" -c 'import platform, sys; print(platform.python_version())' 2>&1))"

# ---- the wheels it lacks, installed without a network -----------------------------------------------------------
[ -z "$WHEELS" ] || mkdir -p "$SITE" || die "cannot make $SITE" 3
if [ -d "$SITE" ]; then  # what it installed before counts; the trials, its children, see it too
  SITE=$(cd "$SITE" && pwd)
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "$WHEELS" ]; then
  missing=()
  for wheel in "$WHEELS"/*.whl; do
    [ -e "$wheel" ] || continue
    dist=$(basename "$wheel" | cut -d- -f1)
    "$PY" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$dist" >/dev/null 2>&1 || missing+=("$wheel")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --find-links "$WHEELS" \
        --target "$SITE" --upgrade "${missing[@]}" || die "installing the wheels of $WHEELS into $SITE failed" 3
    else  # no pip: a pure-Python wheel is a zip of what site-packages holds
      for wheel in "${missing[@]}"; do "$PY" -m zipfile -e "$wheel" "$SITE" || die "unpacking $wheel failed" 3; done
    fi
    echo "gpu_check: installed from $WHEELS into $SITE: $(for w in "${missing[@]}"; do basename "$w" | cut -d- -f1-2; done | paste -sd' ')"
  else
    echo "gpu_check: every wheel of $WHEELS is installed already"
  fi
fi

# ---- the packages it needs, one line each, and how to bring them ------------------------------------------------
"$PY" - "$WHEELS" <<'EOF' || die "a package the check needs is missing (its line above; nothing was run)" 3
import importlib.metadata as md
import importlib.util
import sys

wheels = sys.argv[1] or "wheels"
bring = f"bash scripts/gpu_wheels.sh (where there is a network), carry wheels/, then gpu_check.sh --wheels {wheels}"
# (import name, distribution, needed?, what for, how to bring it)
PACKAGES = [
    ("torch", "torch", True, "everything", "the GPU machine's own CUDA build"),
    ("numpy", "numpy", True, "everything", "pip install numpy"),
    ("pandas", "pandas", True, "the analysis", "pip install pandas"),
    ("scipy", "scipy", True, "the statistics", "pip install scipy"),
    ("matplotlib", "matplotlib", True, "the figures", "pip install matplotlib"),
    ("psutil", "psutil", True, "memory and contention", "pip install psutil"),
    ("rich", "rich", True, "the terminal", "pip install rich"),
    ("jinja2", "jinja2", True, "report.html", "pip install jinja2"),
    ("tomli_w", "tomli-w", True, "sweep.toml", bring),
    ("pytest", "pytest", True, "the GPU tests", "pip install pytest"),
    ("pytest_timeout", "pytest-timeout", False, "a per-test timeout (pytest warns and runs on without it)", bring),
    ("pytest_benchmark", "pytest-benchmark", False, "the benchmarks (skipped without it)", bring),
    ("torchao", "torchao", False, "fp8 and sparse24 (not among the check's sets)", bring),
    ("pynvml", "nvidia-ml-py", False, "NVML energy; device capabilities without a child process", bring),
]
failed = False
for module, dist, needed, why, how in PACKAGES:
    if importlib.util.find_spec(module) is not None:
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            version = "installed"
        print(f"gpu_check: package {dist}: {version}")
    else:
        failed |= needed
        print(f"gpu_check: package {dist}: {'MISSING, needed' if needed else 'missing, optional'} for {why}: {how}")
sys.exit(1 if failed else 0)
EOF
mark "checks"
[ -z "$CHECKS_ONLY" ] || { echo "gpu_check: the checks passed (--checks-only: nothing else was run)"; exit 0; }

# ---- 1. the GPU-marked tests (a failure is reported at the end; the sweep still runs) ----------------------------
TEST_LOG=$(mktemp --suffix=.txt)
PASS1=$(mktemp --suffix=.jsonl)
CFG=$(mktemp --suffix=.toml)
trap 'rm -f "$TEST_LOG" "$PASS1" "$CFG"' EXIT
# the files that hold GPU-marked tests (collecting the others only to deselect them takes seconds)
GPU_FILES=$(grep -lE 'mark\.gpu\b' tests/*.py tests/*/*.py 2>/dev/null | sort)
echo "gpu_check: [1/3] pytest -m gpu over $(echo $GPU_FILES | wc -w) files (at most ${TESTS_CAP_S}s)"
timeout "$TESTS_CAP_S" "$PY" -m pytest -q -m gpu -rA -p no:cacheprovider $GPU_FILES >"$TEST_LOG" 2>&1
tests_rc=$?
tail -n 1 "$TEST_LOG" | sed '$a\'
case $tests_rc in
  0) ;;
  5) echo "gpu_check: no GPU-marked tests were collected"; tests_rc=0 ;;
  124) echo "gpu_check: the GPU tests ran past ${TESTS_CAP_S}s (cut)" ;;
  *) echo "gpu_check: GPU tests failed (exit $tests_rc): see $OUT/pytest-m-gpu.txt" ;;
esac
if [ -n "$REHEARSE" ] && [ $tests_rc -eq 0 ]; then  # the GPU path's own tests that run on a CPU
  echo "gpu_check: rehearsal: the GPU path's CPU tests (fail-safe passes, no CUDA in the sweep's process, the plan)"
  timeout "$CPU_TESTS_CAP_S" "$PY" -m pytest -q -p no:cacheprovider tests/test_gpu_failsafe.py \
    tests/test_no_cuda_in_parent.py tests/test_gpu_plan.py >>"$TEST_LOG" 2>&1
  tests_rc=$?
  tail -n 1 "$TEST_LOG" | sed '$a\'
fi
mark "GPU tests"

# ---- 2. the core sets: planned from measured costs, run in priority order, cut by the cap -----------------------
# One pass: the plan for what is left (done trials and cached references left out, costs from the last check on
# this machine), the sweep under the cap, the report of what finished if it was cut, where the time went, the size.
check_pass() {  # $1: "cut": cap the sweep where the plan puts the rehearsal's cut; "whole": not below 5 minutes
  local resume=() plan_rc sweep_s rc plan_left
  if [ -e "$OUT/sweep.toml" ]; then
    resume=(--resume)
    "$PY" -m bench.dev.gpu_check restore "$OUT"
    echo "gpu_check: resuming the run in $OUT (its finished trials are kept; GPU_CHECK_FRESH=1 starts anew)"
  fi
  plan_left=$(( $(left) > 0 ? $(left) : 0 ))
  [ "${1:-}" != whole ] || [ "$plan_left" -ge 330 ] || plan_left=330  # the whole pass's floor (below), reported
  PLAN=$("$PY" -m bench.dev.gpu_plan --left-s "$plan_left" --out "$OUT" --config-out "$CFG" ${REHEARSE:+--rehearse})
  plan_rc=$?
  [ $plan_rc -le 1 ] || die "could not plan the sweep: python -m bench.dev.gpu_plan failed (its lines above)" 1
  eval "$PLAN"
  [ $plan_rc -eq 0 ] || echo "gpu_check: the plan says the cap will cut the sweep (above); what finishes is kept"
  sweep_s=$(( $(left) - CHECK_REPORT_S ))
  [ "${1:-}" != cut ] || sweep_s=$CHECK_CUT_S
  [ "${1:-}" != whole ] || [ "$sweep_s" -ge 300 ] || sweep_s=300
  [ "$sweep_s" -gt 30 ] || { echo "gpu_check: too little time left for the sweep (${sweep_s}s)"; return 124; }
  echo "gpu_check: sweep -> $OUT (at most ${sweep_s}s; sequential phase ${CHECK_DECIDE_WITHIN}s)"
  # SIGINT at the cap: the sweep stops like Ctrl-C, keeping every finished trial.
  timeout -k 30 -s INT "$sweep_s" "$PY" -m bench sweep --config "$CHECK_CONFIG" --device "$DEVICE" \
    --decide-within "$CHECK_DECIDE_WITHIN" --out "$OUT" ${resume[@]+"${resume[@]}"}
  rc=$?
  if [ $rc -ne 0 ] && [ -e "$OUT/results.jsonl" ]; then  # cut or failed: the report of what finished, and the cut
    timeout "$(( $(left) > 30 ? $(left) : 30 ))" "$PY" -m bench report "$OUT" >/dev/null \
      && "$PY" -m bench.dev.gpu_check cut "$OUT" \
      && echo "gpu_check: report of the finished trials in $OUT/ (it says what was cut)"
  fi
  [ -d "$OUT" ] && cp "$TEST_LOG" "$OUT/pytest-m-gpu.txt" && chmod a+r "$OUT/pytest-m-gpu.txt"
  return $rc
}
where_it_went() {  # where the time went, and the directory kept small enough to come back whole
  [ -d "$OUT" ] || return 0
  "$PY" -m bench.dev.gpu_check times "$OUT" ${STAGES[@]+"${STAGES[@]}"} --json "$OUT/gpu-check.json" \
    | tee "$OUT/gpu-check.txt"
  "$PY" -m bench.dev.gpu_check keep "$OUT" --limit-mib "$LIMIT_MIB"
}

if [ -e "$OUT/sweep.toml" ] && [ -n "${GPU_CHECK_FRESH:-}" ]; then  # never overwrite results silently
  PREV="$OUT.prev-$(date -u +%Y%m%d-%H%M%S)"
  mv "$OUT" "$PREV" && echo "gpu_check: moved the previous $OUT to $PREV"
fi
if [ -n "$REHEARSE" ]; then
  echo "gpu_check: [2/3] rehearsal: the sweep, cut by the cap on purpose inside its second group"
  check_pass cut
  first_rc=$?
  mark "sweep, cut"
  where_it_went
  mark "report"
  [ -e "$OUT/results.jsonl" ] && cp "$OUT/results.jsonl" "$PASS1"
  echo "gpu_check: [3/3] rehearsal: the resume (first pass exit $first_rc)"
  check_pass whole  # never cut: a slower machine takes longer, and the time split says where
  sweep_rc=$?
  mark "sweep, resumed"
  "$PY" -m bench.dev.gpu_check resumed "$OUT" --first "$PASS1" || sweep_rc=1
else
  echo "gpu_check: [2/3] the sweep"
  check_pass
  sweep_rc=$?
  mark "sweep"
fi
where_it_went
mark "time split"

case $sweep_rc in
  0) ;;
  124) die "the slot's ${BUDGET_S}s ran out during the sweep: finished trials are in $OUT; run the script again to \
resume" 124 ;;
  2) die "the sweep refused its input or the previous run in $OUT (exit 2, its line above): if that run was made \
with other settings, GPU_CHECK_FRESH=1 moves it aside and starts anew" 2 ;;
  *) die "the sweep exited $sweep_rc (finished trials are in $OUT/results.jsonl; run the script again to resume)" \
       "$sweep_rc" ;;
esac
[ $tests_rc -eq 0 ] || die "GPU tests failed or were cut (exit $tests_rc): see $OUT/pytest-m-gpu.txt" 1
echo "gpu_check: done in $(( SECONDS - START ))s; report in $OUT/"
