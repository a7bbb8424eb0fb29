"""The budget modes are named once: the resource's configuration, the environment and admission agree on them."""

import pydantic
import pytest

from eagle_assets.budget_mode import BUDGET_MODES, BudgetModeError, parse_budget_mode
from eagle_assets.generation.admission import MODES, AdmissionPolicy
from resources.openrouter.configured import openrouter_from_env
from resources.openrouter.resource import OpenRouterResource


def test_budget_modes_are_named_once_and_checked_by_the_resource():
    assert MODES == BUDGET_MODES == ("statistical", "hard")
    assert OpenRouterResource(budget_mode="hard").budget_mode == "hard" and AdmissionPolicy(mode="hard").hard
    with pytest.raises(pydantic.ValidationError, match="budget_mode"):
        OpenRouterResource(budget_mode="soft")  # type: ignore[arg-type]


def test_the_environment_names_a_mode_in_any_case(monkeypatch):
    assert parse_budget_mode(" Hard ") == "hard"
    with pytest.raises(BudgetModeError, match="one of statistical, hard, not 'soft'"):
        parse_budget_mode("soft")
    monkeypatch.setenv("EAGLE_FORGE_TARGET", "simulator")
    monkeypatch.setenv("EAGLE_FORGE_BUDGET_MODE", "HARD")
    assert openrouter_from_env().budget_mode == "hard"
    monkeypatch.setenv("EAGLE_FORGE_BUDGET_MODE", "soft")
    with pytest.raises(ValueError, match="budget mode must be one of"):
        openrouter_from_env()
