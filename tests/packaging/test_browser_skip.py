"""The README's test command on a machine without Chromium: the browser tests skip and say why; CI never skips.

Chromium is installed on this machine, so "missing" is a path where there is none (``EAGLE_FORGE_CHROMIUM``),
in a pytest of ``tests/browser`` of its own: the skip happens before any server starts.
"""

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_browser_tests(chromium: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("EAGLE_FORGE_REQUIRE_BROWSER", "EAGLE_FORGE_SKIP_BROWSER")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests/browser", "-q", "-p", "no:cacheprovider"],
        cwd=REPO_ROOT,
        env={**base, "EAGLE_FORGE_CHROMIUM": str(chromium), **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_without_chromium_the_browser_tests_skip_with_the_reason_in_the_summary(tmp_path):
    missing = tmp_path / "no-chromium-here"
    done = run_browser_tests(missing)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "skipped" in out and "passed" not in out and "error" not in out.lower(), out
    # pytest's short summary (-rs, from pyproject) names the reason and the path looked at
    assert "SKIPPED [" in out and f"no Chromium at {missing}" in out, out


def test_ci_turns_the_missing_chromium_into_a_failure(tmp_path):
    missing = tmp_path / "no-chromium-here"
    done = run_browser_tests(missing, EAGLE_FORGE_REQUIRE_BROWSER="1")
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert f"browser tests cannot run: no Chromium at {missing}" in out and "may not be skipped here" in out, out
    assert "SKIPPED [" not in out, out
