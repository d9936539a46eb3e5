#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, run the GPU-marked tests and a GPU sweep of bf16, fp16, compile,
# checkpointing, tf32 and fused_adamw on gpt:gpt2-124m and cnn:small, and write the report to reports/example-gpu/.
# Meant to finish in under 8 minutes (one repeat per configuration, short budgets; each stage has a time cap).
#
#   bash scripts/setup.sh --test && bash scripts/gpu_check.sh      # on the GPU machine
#   PYTHON=/path/to/python bash scripts/gpu_check.sh                 # another interpreter (default: .venv/bin/python)
#   GPU_CHECK_OUT=reports/my-gpu bash scripts/gpu_check.sh           # another output directory
#
# Exit codes: 0 all ran; 3 no usable GPU (nothing was run); otherwise the failing stage's code.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET_S=${GPU_CHECK_BUDGET_S:-470}   # whole script, seconds; a stage gets what is left (8 min minus a margin)
OUT=${GPU_CHECK_OUT:-reports/example-gpu}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3 || true)

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }
left() { echo $(( BUDGET_S - (SECONDS - START) )); }

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
echo "gpu_check: $GPUS"
echo "gpu_check: $TORCH_INFO"

# ---- 1. the GPU-marked tests -----------------------------------------------------------------------------------
echo "gpu_check: [1/2] pytest -m gpu"
timeout 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider
rc=$?
case $rc in
  0) ;;
  5) echo "gpu_check: no GPU-marked tests were collected" ;;
  124) die "the GPU tests ran past 150 s" 124 ;;
  *) die "GPU tests failed (exit $rc)" "$rc" ;;
esac

# ---- 2. the GPU sweep ------------------------------------------------------------------------------------------
if [ -e "$OUT/results.jsonl" ]; then  # never overwrite results silently: keep the previous run beside it
  PREV="$OUT.prev-$(date -u +%Y%m%d-%H%M%S)"
  mv "$OUT" "$PREV" && echo "gpu_check: moved the previous $OUT to $PREV"
fi
CONFIG=$(mktemp --suffix=.toml)
trap 'rm -f "$CONFIG"' EXIT
cat > "$CONFIG" <<'TOML'
name = "example-gpu"
workloads = ["gpt:gpt2-124m", "cnn:small"]
techniques = ["baseline", "bf16", "fp16", "compile", "checkpointing", "tf32", "fused_adamw"]
repeats = 1
device = "cuda"
mode = "both"
[budget]
warmup_steps = 3      # the speed window's warm-up (the quality run before it paid compile's one-off cost)
min_steps = 10
min_seconds = 1.0
max_seconds = 5.0
train_steps = 40      # a short quality run: a sanity check of the curve at equal samples, not a converged model
max_train_seconds = 15.0
eval_points = 2
parity_steps = 4
memory = true
timeout_s = 150.0
TOML
SWEEP_S=$(( $(left) - 10 ))
[ "$SWEEP_S" -gt 60 ] || die "too little time left for the sweep (${SWEEP_S}s)" 124
echo "gpu_check: [2/2] sweep -> $OUT (at most ${SWEEP_S}s)"
# SIGINT on overrun: the sweep stops like Ctrl-C, keeping every finished trial (resume with --resume --out).
timeout -s INT "$SWEEP_S" "$PY" -m bench sweep --config "$CONFIG" --out "$OUT"
rc=$?
[ $rc -eq 0 ] || die "the sweep exited $rc (finished trials are in $OUT/results.jsonl; continue with: \
$PY -m bench sweep --resume --out $OUT)" "$rc"
echo "gpu_check: done in $(( SECONDS - START ))s; report in $OUT/"
