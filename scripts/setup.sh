#!/usr/bin/env bash
# Set up trainbench on a fresh machine: a virtualenv in .venv with torch (the CPU build unless a GPU is present),
# the package and its extras, and the system packages its workloads and tests use.
#   bash scripts/setup.sh          # what `python -m bench sweep` needs
#   bash scripts/setup.sh --test   # plus test tools and headless Chromium (for the HTML report test)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
[ "${1:-}" = "--test" ] && with_tests=1
PYTHON=${PYTHON:-python3}

# System packages: Fashion-MNIST for the CNN workload; Chromium renders the HTML report in tests.
apt_pkgs="dataset-fashion-mnist"
[ "$with_tests" = 1 ] && apt_pkgs="$apt_pkgs chromium"
missing=""
for pkg in $apt_pkgs; do dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing$missing (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: please install$missing with your package manager (needs root); continuing without" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

# torch first, pinned: an unpinned torch pulls a CUDA build of several GB. TRAINBENCH_TORCH overrides the pin.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "${TRAINBENCH_TORCH:-torch>=2.4}"
  else
    .venv/bin/python -m pip install -q "${TRAINBENCH_TORCH:-torch==2.13.0}"
  fi
fi

extras="."
# the tests build Hugging Face configs, run submitit jobs and QAT too, and read exports back with pyarrow, MLflow and
# TensorBoard's own readers
[ "$with_tests" = 1 ] && extras=".[test,lint,transformers,slurm,torchao,parquet,mlflow,tensorboard]"
.venv/bin/python -m pip install -q -e "$extras"
.venv/bin/python -c "import torch, bench; print('setup: ok, torch', torch.__version__)"
