#!/usr/bin/env bash
# Create .venv and install eagle-forge with its pinned dependencies (idempotent; safe to rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU wheel of torch first, so nothing pulls a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -c constraints.txt -e ".[dev]"
bash scripts/install_chromium.sh  # where it can; never fails the setup
echo "eagle-forge installed in $(pwd)/.venv"
