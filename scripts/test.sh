#!/usr/bin/env bash
# Run the test suite (sets up .venv first if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
# A .venv from before mypy or pytest-xdist: add them.
[ -x .venv/bin/pytest ] && [ -x .venv/bin/mypy ] && .venv/bin/python -c "import xdist" 2>/dev/null || bash scripts/setup.sh
. .venv/bin/activate
# Bytecode caches on, even where the environment turns them off (PYTHONDONTWRITEBYTECODE): otherwise each of the
# workers and every Python the tests start recompiles the project and pytest rewrites every test module again
# (collection 17 -> 11 CPU-s per worker here). They go to __pycache__/, which git ignores.
unset PYTHONDONTWRITEBYTECODE
# mypy checks on one core; on the other, compile the project and let pytest rewrite its test modules once, so the
# workers below find them cached (on a fresh clone each worker would otherwise do it again: ~6 CPU-s each).
# Its output is dropped: the run below reports any collection error.
{ python -m compileall -q -j 0 eagle_assets resources sensors benchmarks tests scripts
  python -m pytest -q --collect-only -p no:cacheprovider; } >/dev/null 2>&1 &
warm=$!
ruff check .
ruff format --check .  # one formatting, so diffs show changes and not style
mypy  # the files configured in pyproject.toml ([tool.mypy]): the product, the benchmarks, the runbook
wait "$warm" || true
# On pytest-xdist workers: much of the suite waits on subprocesses, servers and sockets, so 3 workers beat the
# 2 cores they share (tests/conftest.py groups module-shared fixtures and deals slow tests first). Measured here,
# whole script: 2 workers 486 s of pytest / 719 CPU-s, 3 workers 458 s / 763 CPU-s, 4 workers 542 s / 948 CPU-s
# (a fourth process on 2 cores costs more CPU in contention than its overlap saves).
# TEST_WORKERS=0 runs in one process (not an EAGLE_FORGE_ name: those are settings, and an unknown one is refused); arguments after the script's name go to pytest.
python -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadgroup "$@"
