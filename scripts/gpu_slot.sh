#!/usr/bin/env bash
# One call in a lent GPU slot: scripts/gpu_check.sh with the wheels carried in wheels/ (if any), its whole output in
# $OUT/gpu-check.log and its report directory copied to $OUT/report/, for a remote runner that brings back only
# what its command writes under $OUT. Sized by gpu_check.sh's own cap (8 minutes) to fit a 10-minute command.
#
#   OUT=/some/dir bash scripts/gpu_slot.sh               # on the GPU machine (carry wheels/ with the tree)
#   OUT=/some/dir bash scripts/gpu_slot.sh --rehearse    # the same on a CPU (CI runs gpu_check.sh --rehearse)
#
# A second call on the same (still warm) machine resumes the check where the first one's cap stopped it: its
# output directory, runs/gpu-slot/ (git-ignored), stays there between calls. On a fresh machine, carry runs/gpu-slot/
# back in (it came back as $OUT/report/) to resume. Exit: gpu_check.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -n "${OUT:-}" ] || { echo "gpu_slot: set OUT to the directory whose files come back" >&2; exit 2; }
mkdir -p "$OUT" || { echo "gpu_slot: cannot make OUT=$OUT" >&2; exit 2; }
args=("$@")
[ -d wheels ] && args+=(--wheels wheels)
if [[ " $* " == *" --rehearse "* ]] && [ -z "${GPU_CHECK_OUT:-}" ]; then
  dir=runs/gpu-check-rehearsal  # the rehearsal's own directory, made anew each time by gpu_check.sh
else
  export GPU_CHECK_OUT=${GPU_CHECK_OUT:-runs/gpu-slot}
  dir=$GPU_CHECK_OUT
fi
bash scripts/gpu_check.sh ${args[@]+"${args[@]}"} >"$OUT/gpu-check.log" 2>&1
rc=$?
if [ -d "$dir" ]; then  # kept under its size limit by gpu_check.sh; its caches stay behind (its .overflow)
  rm -rf "$OUT/report" && cp -r "$dir" "$OUT/report"
fi
tail -n 40 "$OUT/gpu-check.log"
echo "gpu_slot: exit $rc; the log is $OUT/gpu-check.log, the report $OUT/report/"
exit $rc
