"""The resource's configuration maps onto the engine's settings field by field."""

import pytest

from eagle_assets.generation.retry_policy import RetryPolicy
from resources.openrouter.configured import TargetConfigError, openrouter_from_env
from resources.openrouter.resource import SIMULATOR_KEY, OpenRouterResource, is_loopback
from resources.openrouter.secret import MissingApiKeyError


def test_settings_mapping():
    res = OpenRouterResource(
        max_attempts=7,
        max_congestion_waits=50,
        retry_base_delay_s=0.25,
        retry_max_delay_s=9.0,
        max_tokens=512,
        budget_usd=12.5,
        max_in_flight=300,
        temperature=0.6,
        top_p=None,
        extra_body={"reasoning": {"effort": "high"}},
    )
    s = res.generation_settings()
    assert s.retry == RetryPolicy(max_attempts=7, max_congestion_waits=50, base_delay_s=0.25, max_delay_s=9.0)
    assert (s.max_tokens, s.budget_usd, s.max_in_flight) == (512, 12.5, 300)
    assert s.sampling == {"temperature": 0.6, "reasoning": {"effort": "high"}}
    assert res.policy().routing() == {
        "quantizations": ["int4", "int8", "fp8", "fp16", "bf16", "fp32"],
        "ignore": ["fireworks", "baseten"],
        "allow_fallbacks": True,
        "sort": "price",
    }


def test_bad_settings_are_refused_before_spending():
    with pytest.raises(ValueError, match="budget_usd must be >= 0"):
        OpenRouterResource(budget_usd=-1).preflight()
    with pytest.raises(ValueError, match="max_tokens"):
        OpenRouterResource(max_tokens=0).preflight()


def test_keys_loopback_placeholder_and_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    sim = OpenRouterResource(
        base_url="http://127.0.0.1:1/api/v1", api_key_file=str(tmp_path / "none"), api_key_env="NO_SUCH_KEY_VAR"
    )
    assert sim.api_key().reveal() == SIMULATOR_KEY
    real = OpenRouterResource(api_key_file=str(tmp_path / "none"), api_key_env="NO_SUCH_KEY_VAR")
    with pytest.raises(MissingApiKeyError, match="no OpenRouter API key found"):
        real.preflight()
    assert is_loopback("http://localhost:8/x") and is_loopback("http://127.3.4.5/x")
    assert not is_loopback("https://openrouter.ai/api/v1")


def test_target_selection(monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_TARGET", "simulator")
    res = openrouter_from_env()
    assert is_loopback(res.base_url) and res.start_embedded_simulator and res.api_key_file == ""
    monkeypatch.setenv("EAGLE_FORGE_TARGET", "openrouter")
    assert openrouter_from_env().base_url == "https://openrouter.ai/api/v1"
    monkeypatch.setenv("EAGLE_FORGE_TARGET", "elsewhere")
    with pytest.raises(TargetConfigError, match="must be 'simulator' or 'openrouter'"):
        openrouter_from_env()
