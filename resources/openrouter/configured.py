"""Pick the OpenRouter resource's configuration from the environment.

``EAGLE_FORGE_TARGET`` selects where requests go: ``simulator`` (the default: the bundled simulator
on 127.0.0.1, no key needed) or ``openrouter`` (the real API; needs a key). ``EAGLE_FORGE_STREAM=1``
streams responses. Nothing here reads the key: secrets are resolved when a run starts, never at
import.
"""

import os
from typing import Any

from eagle_assets.budget_mode import parse_budget_mode
from eagle_assets.errors import ConfigError
from resources.openrouter.resource import OpenRouterResource
from resources.simulator.config import DEFAULT_PORT as DEFAULT_SIMULATOR_PORT


class TargetConfigError(ConfigError, ValueError):
    """EAGLE_FORGE_TARGET names no known target."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def simulator_base_url() -> str:
    port = int(os.environ.get("EAGLE_FORGE_SIM_PORT", DEFAULT_SIMULATOR_PORT))
    return f"http://127.0.0.1:{port}/api/v1"


def openrouter_from_env() -> OpenRouterResource:
    target = os.environ.get("EAGLE_FORGE_TARGET", "simulator").strip().lower()
    budget = float(os.environ.get("EAGLE_FORGE_BUDGET_USD", "100"))
    budget_mode = parse_budget_mode(os.environ.get("EAGLE_FORGE_BUDGET_MODE", "statistical"))  # or "hard"
    key_file = os.environ.get("EAGLE_FORGE_KEY_FILE")
    shortfall = float(os.environ.get("EAGLE_FORGE_TOKEN_SHORTFALL", "0"))
    if target == "simulator":
        # A real key in /tmp/or-key.txt has no business going to the simulator: only an explicit file is read.
        return OpenRouterResource(
            base_url=simulator_base_url(),
            api_key_file=key_file or "",
            api_key_env="EAGLE_FORGE_SIM_KEY",
            start_embedded_simulator=True,
            budget_usd=budget,
            budget_mode=budget_mode,
            token_shortfall=shortfall,
            max_tokens=int(os.environ.get("EAGLE_FORGE_MAX_TOKENS", "1024")),
            max_in_flight=int(os.environ.get("EAGLE_FORGE_MAX_IN_FLIGHT", "2000")),
            request_timeout_s=float(os.environ.get("EAGLE_FORGE_REQUEST_TIMEOUT_S", "120")),
            progress_interval_s=2.0,
            key_poll_interval_s=2.0,
            account_observe_interval_s=2.0,
            stream=_flag("EAGLE_FORGE_STREAM"),
        )
    if target == "openrouter":
        key: dict[str, Any] = {"api_key_file": key_file} if key_file else {}  # else the resource's default file
        return OpenRouterResource(
            budget_usd=budget,
            budget_mode=budget_mode,
            token_shortfall=shortfall,
            stream=_flag("EAGLE_FORGE_STREAM"),
            **key,
        )
    raise TargetConfigError(f"EAGLE_FORGE_TARGET must be 'simulator' or 'openrouter', got {target!r}")
