"""The generation side of the OpenRouter resource: settings, ledger, tokenizer and account, from its configuration."""

import pytest

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.partition_runs import (
    account_snapshot,
    generation_settings,
    native_completion_counts,
    open_ledger,
    preflight,
    prompt_estimator,
)
from resources.openrouter.resource import OpenRouterResource


def test_preflight_returns_the_settings_it_checked():
    res = OpenRouterResource(base_url="http://127.0.0.1:1/api/v1", api_key_file="", budget_mode="hard", top_p=0.9)
    settings = preflight(res)
    assert settings == generation_settings(res)
    assert settings.admission.hard and settings.sampling == res.sampling() == {"top_p": 0.9}


def test_the_waiting_and_shortfall_fields_reach_the_engine(monkeypatch):
    res = OpenRouterResource(others_stall_s=5.0, token_shortfall=0.05)
    settings = generation_settings(res)
    assert settings.others_stall_s == 5.0 and settings.admission.token_shortfall == 0.05
    monkeypatch.setenv("EAGLE_FORGE_TOKEN_SHORTFALL", "0.03")
    from resources.openrouter.configured import openrouter_from_env

    assert generation_settings(openrouter_from_env()).admission.token_shortfall == 0.03


def test_the_ledger_opens_where_the_resource_says_and_is_closed_after(tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLE_FORGE_DATABASE_URL", raising=False)
    res = OpenRouterResource(ledger_path=str(tmp_path / "ledger.sqlite"), budget_mode="hard")
    with open_ledger(res, generation_settings(res).admission) as ledger:
        assert str(tmp_path / "ledger.sqlite") in ledger.location and ledger.policy.hard
        ledger.record_spend("B1", "B1/0", "p0", 0.25, "error")
    with open_ledger(res) as again:  # the first one let go of it
        assert again.totals().usd_spent == pytest.approx(0.25) and not again.policy.hard


def test_prompt_estimates_come_from_the_tokenizer_the_resource_names(monkeypatch):
    monkeypatch.delenv("EAGLE_FORGE_TOKENIZER", raising=False)
    assert OpenRouterResource(tokenizer_path="/somewhere/kimi").tokenizer_location() == "/somewhere/kimi"
    estimate = prompt_estimator(OpenRouterResource(tokenizer_path="bundled"))
    short = Prompt("p0", [{"role": "user", "content": "hello"}], None, 1, 0)
    longer = Prompt("p1", [{"role": "user", "content": "hello " * 200}], None, 2, 1)
    assert 0 < estimate(short) < estimate(longer)


def test_account_snapshot_reads_the_key_and_the_ledger(tmp_path, monkeypatch):
    from resources.simulator.config import SimulatorConfig
    from tests.simulator.harness import run_simulator_in_thread

    monkeypatch.delenv("EAGLE_FORGE_DATABASE_URL", raising=False)
    with run_simulator_in_thread(SimulatorConfig()) as sim:
        res = OpenRouterResource(
            base_url=sim.base_url, api_key_file="", ledger_path=str(tmp_path / "ledger.sqlite"), budget_usd=7.5
        )
        with open_ledger(res) as ledger:
            ledger.record_spend("B1", "B1/0", "p0", 0.5, "error")
        snap = account_snapshot(res, "a test")
    assert (snap.budget_usd, snap.spent_usd, snap.observed_by) == (7.5, pytest.approx(0.5), "a test")
    assert snap.cap_source != "unknown" and snap.available_usd <= 7.0
    assert native_completion_counts(res, {}) == {}  # nothing asked: no server needed
