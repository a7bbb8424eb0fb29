"""The small helpers that the type-checking pass (issue 21) put in place of untyped idioms: each must read
exactly what the idiom it replaced read, including the malformed shapes an answer or a row may take."""

from typing import Any

import pytest

from eagle_assets.generation.ledger import NANO, UncertainAttempt
from eagle_assets.generation.ledger.uncertain import _uncertain_attempt
from eagle_assets.generation.runner import PartitionReport
from resources.openrouter.outcomes import _dict_at


@pytest.mark.parametrize(
    ("holder", "expected"),
    [
        ({"metadata": {"raw": "x"}}, {"raw": "x"}),
        ({"metadata": {}}, {}),
        ({}, {}),  # absent
        ({"metadata": None}, {}),  # null
        ({"metadata": "provider said no"}, {}),  # a string where an object belongs
        ({"metadata": ["a"]}, {}),
        ({"metadata": 3}, {}),
    ],
)
def test_dict_at_gives_the_object_or_an_empty_one(holder: dict[str, Any], expected: dict[str, Any]) -> None:
    assert _dict_at(holder, "metadata") == expected


def test_dict_at_returns_the_object_itself_and_a_fresh_empty_one() -> None:
    inner = {"retryable": True}
    assert _dict_at({"error": inner}, "error") is inner
    first, second = _dict_at({}, "error"), _dict_at({}, "error")
    first["written"] = 1
    assert second == {}


def test_uncertain_attempt_reads_a_row_by_position_and_money_in_nano_usd() -> None:
    row = ("gen-1", "spend-1", "b1", "b1/0", "p7", 2_500_000_000, 100.5, 3, 160.5)
    assert _uncertain_attempt(row) == UncertainAttempt("gen-1", "spend-1", "b1", "b1/0", "p7", 2.5, 100.5, 3, 160.5)
    assert _uncertain_attempt(list(row)).provisional_usd == 2_500_000_000 / NANO


def test_partition_report_adds_dollars_per_provider_as_floats() -> None:
    report = PartitionReport("b1/0", total=1)
    report.provider_usd["a"] += 0.25
    report.provider_usd["a"] += 0.5
    assert report.provider_usd == {"a": 0.75}
    assert isinstance(report.provider_usd["a"], float)
