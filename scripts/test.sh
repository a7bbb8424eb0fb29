#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] && [ -x .venv/bin/mypy ] || bash scripts/setup.sh  # a .venv from before mypy: add it
. .venv/bin/activate
ruff check .
ruff format --check .  # one formatting, so diffs show changes and not style
mypy  # the packages configured in pyproject.toml ([tool.mypy])
python -m pytest -q "$@"
