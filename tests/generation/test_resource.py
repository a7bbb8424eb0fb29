"""The resource's configuration maps onto the engine's settings field by field; the account cap."""

import dataclasses
import json
from pathlib import Path

import pytest

from eagle_assets.generation.partition_runs import generation_settings, preflight
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.settings import EnvSettingError
from resources.openrouter.account import account_cap
from resources.openrouter.configured import openrouter_from_env
from resources.openrouter.providers import ProviderPolicy
from resources.openrouter.resource import SIMULATOR_KEY, OpenRouterResource, is_loopback
from resources.openrouter.secret import MissingApiKeyError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter" / "account"


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
    s = generation_settings(res)
    assert s.retry == RetryPolicy(max_attempts=7, max_congestion_waits=50, base_delay_s=0.25, max_delay_s=9.0)
    assert (s.max_tokens, s.budget_usd, s.max_in_flight) == (512, 12.5, 300)
    assert s.sampling == {"temperature": 0.6, "reasoning": {"effort": "high"}}
    assert (s.stream, s.stream_idle_timeout_s) == (False, 60.0)
    assert res.policy() == ProviderPolicy(
        ("int4", "int8", "fp8", "fp16", "bf16", "fp32"), ("fireworks", "baseten"), "price", True, ()
    )
    assert res.requested_parameters(with_tools=True) == ("max_tokens", "reasoning", "temperature", "tools")
    streaming = OpenRouterResource(
        stream=True, stream_idle_timeout_s=5, require_parameters=False, trust_unknown_quantization=["novita"]
    )
    assert (generation_settings(streaming).stream, generation_settings(streaming).stream_idle_timeout_s) == (True, 5)
    assert streaming.policy().require_parameters is False
    assert streaming.policy().trust_unknown_quantization == ("novita",)
    with pytest.raises(ValueError, match="stream_idle_timeout_s"):
        preflight(OpenRouterResource(stream_idle_timeout_s=0))


KEY = json.loads((FIXTURES / "key_limited.json").read_text())["data"]
UNLIMITED = json.loads((FIXTURES / "key_unlimited.json").read_text())["data"]
CREDITS = json.loads((FIXTURES / "credits.json").read_text())["data"]


def test_account_cap_says_which_cap_is_in_force():
    limited = account_cap(KEY, None)
    assert (limited.source, limited.remaining_usd) == ("key_limit", 74.5)
    fallback = account_cap(UNLIMITED, CREDITS)
    assert fallback.source == "account_credits" and fallback.remaining_usd == pytest.approx(500.0 - 412.87)
    assert "the key itself is unlimited" in fallback.detail
    none = account_cap(UNLIMITED, None, "answered HTTP 403 (it needs a management key)")
    assert none.remaining_usd is None and none.source == "none" and "HTTP 403" in none.detail
    both = account_cap(KEY, {"total_credits": 80.0, "total_usage": 60.0})
    assert both.source == "key_limit+account_credits" and both.remaining_usd == pytest.approx(20.0)


def test_bad_settings_are_refused_before_spending():
    with pytest.raises(ValueError, match="budget_usd must be >= 0"):
        preflight(OpenRouterResource(budget_usd=-1))
    with pytest.raises(ValueError, match="max_tokens"):
        preflight(OpenRouterResource(max_tokens=0))


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
    with pytest.raises(EnvSettingError, match=r"EAGLE_FORGE_TARGET='elsewhere'.*'simulator' or 'openrouter'"):
        openrouter_from_env()


class _Lines:
    """A logger that keeps what it is told (the run log's info and warning lines)."""

    def __init__(self) -> None:
        self.info_lines: list[str] = []
        self.warning_lines: list[str] = []

    def info(self, msg: str) -> None:
        self.info_lines.append(msg)

    def warning(self, msg: str) -> None:
        self.warning_lines.append(msg)


async def test_every_endpoint_require_parameters_removes_is_logged_with_the_parameter():
    from resources.simulator.config import DEFAULT_PROVIDERS, SUPPORTED_PARAMETERS, SimulatorConfig
    from tests.simulator.harness import run_simulator_in_thread

    bare = tuple(p for p in SUPPORTED_PARAMETERS if p not in ("temperature", "top_p"))
    providers = tuple(
        dataclasses.replace(e, supported_parameters=bare) if e.slug == "moonshotai" else e for e in DEFAULT_PROVIDERS
    )
    with run_simulator_in_thread(SimulatorConfig(providers=providers)) as sim:
        for res, removed in (
            (OpenRouterResource(base_url=sim.base_url, api_key_file=""), []),
            (OpenRouterResource(base_url=sim.base_url, api_key_file="", temperature=0.6), ["moonshotai/int4"]),
        ):
            log = _Lines()
            async with res.client() as client:
                table = await res.provider_table(client, log)
            assert [line.split("[")[1].split("]")[0] for line in log.warning_lines] == removed
            assert ("moonshotai/int4" in {e.tag for e in table.allowed}) is not removed
    assert "does not list temperature, which every request sends" in log.warning_lines[0]
