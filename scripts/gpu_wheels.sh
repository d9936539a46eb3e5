#!/usr/bin/env bash
# Download the few pure-Python wheels a GPU machine without a network lacks for scripts/gpu_check.sh, into wheels/
# (git-ignored; about 2 MiB, small enough to carry with the working tree). On the GPU machine,
# `bash scripts/gpu_check.sh --wheels wheels` installs those it lacks, without a network and without root.
#
#   bash scripts/gpu_wheels.sh          # into wheels/
#   bash scripts/gpu_wheels.sh DIR      # into DIR
#
# What and why (the GPU image has torch, pandas, scipy, matplotlib, rich, jinja2, pytest and transformers):
#   tomli-w           the sweep writes sweep.toml with it: without it no sweep runs
#   pytest-timeout    pyproject's per-test timeout (without it pytest warns and runs on)
#   pytest-benchmark  the benchmark tests (without it they are skipped: tests/conftest.py); and what it requires
#                     (py-cpuinfo, read from its wheel's metadata rather than guessed)
#   torchao           fp8 and sparse24 (their GPU tests and sets; the check's own sets need none of it). Its PyPI
#                     release has a py3-none-any wheel, pure Python: the float8 training path is PyTorch and
#                     torch.compile; the compiled extras of its platform wheels (MX, CUTLASS kernels) are left out.
#                     0.18.0: the version the first H200 run used with torch 2.11.
#   nvidia-ml-py      pynvml: NVML energy, and the devices' capabilities without a CUDA context in the sweep's process
# Only wheels tagged py3-none-any are accepted, so the GPU machine's Python version and platform do not matter.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-wheels}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3)
PURE=(--no-deps --only-binary=:all: --platform any --implementation py --python-version 3.12)

mkdir -p "$DIR"
"$PY" -m pip download --quiet --dest "$DIR" "${PURE[@]}" \
  "tomli-w>=1.0" "pytest-timeout>=2.2" "pytest-benchmark>=4" "torchao==0.18.0" "nvidia-ml-py>=12"
# pytest-benchmark's requirements that are not pytest itself (the GPU image has pytest), from its own metadata
needs=$("$PY" - "$DIR" <<'EOF'
import re, sys, zipfile
from pathlib import Path
for wheel in Path(sys.argv[1]).glob("pytest_benchmark-*.whl"):
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            req = line.partition("Requires-Dist:")[2].strip()
            if req and "extra ==" not in req and not re.match(r"pytest\b", req):
                print(req.split(";")[0].strip())
EOF
)
[ -z "$needs" ] || "$PY" -m pip download --quiet --dest "$DIR" "${PURE[@]}" $needs

for wheel in "$DIR"/*.whl; do
  case $(basename "$wheel") in
    *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) echo "gpu_wheels: $wheel is not a pure-Python wheel: it may not install on the GPU machine" >&2; exit 1 ;;
  esac
done
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR/:"
ls "$DIR"/*.whl | xargs -n1 basename | sed 's/^/  /'
echo "gpu_wheels: carry $DIR/ with the working tree; on the GPU machine: bash scripts/gpu_check.sh --wheels $DIR"
