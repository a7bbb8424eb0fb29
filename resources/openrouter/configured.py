"""Pick the OpenRouter resource's configuration from the settings (``EAGLE_FORGE_TARGET``: the bundled
simulator or the real API). Nothing here reads the key: secrets are resolved when a run starts, never at import.
"""

from typing import Any

from eagle_assets.settings import SIM_KEY_VAR, current_settings
from resources.openrouter.resource import OpenRouterResource


def simulator_base_url() -> str:
    return f"http://127.0.0.1:{current_settings().sim_port}/api/v1"


def openrouter_from_env() -> OpenRouterResource:
    s = current_settings()
    common: dict[str, Any] = {
        "budget_usd": s.budget_usd,
        "budget_mode": s.budget_mode,
        "token_shortfall": s.token_shortfall,
        "stream": s.stream,
    }
    if s.target == "simulator":
        # A real key in /tmp/or-key.txt has no business going to the simulator: only an explicit file is read.
        return OpenRouterResource(
            base_url=simulator_base_url(),
            api_key_file=s.key_file,
            api_key_env=SIM_KEY_VAR,
            start_embedded_simulator=True,
            max_tokens=s.max_tokens,
            max_in_flight=s.max_in_flight,
            request_timeout_s=s.request_timeout_s,
            progress_interval_s=2.0,
            key_poll_interval_s=2.0,
            account_observe_interval_s=2.0,
            **common,
        )
    key: dict[str, Any] = {"api_key_file": s.key_file} if s.key_file else {}  # else the resource's default file
    return OpenRouterResource(**common, **key)
