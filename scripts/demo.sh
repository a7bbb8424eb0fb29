#!/usr/bin/env bash
# Set up (first time) and run the pipeline on the embedded default: the bundled OpenRouter simulator on
# 127.0.0.1 and the tiny target model. No API key, no GPU, no network.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/dagster ] || bash scripts/setup.sh
. .venv/bin/activate
python -m eagle_assets.demo "$@"
