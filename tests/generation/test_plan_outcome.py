"""``plan_outcome``: a recorded plan's projection for the rest against what the ledger then holds (the demo)."""

import math

from eagle_assets.generation.plan_report import plan_outcome


def dataset(name: str, usd: float, tokens: float, spent: float, produced: int) -> dict:
    return {
        "name": name,
        "usd": {"expected": usd, "low": usd / 2, "high": usd * 2},
        "output_tokens": {"expected": tokens, "low": tokens / 2, "high": tokens * 2},
        "spent_usd": spent,
        "produced_tokens": produced,
    }


def test_the_projection_against_what_was_spent_after_the_plan():
    doc = {"datasets": [dataset("A", 0.06, 3000, 0.03, 1500), dataset("B", 0.04, 2000, 0.02, 1000)]}
    # The ledger now: the pilot's spend (in the plan) plus what generation bought after it.
    out = plan_outcome(doc, {"A": (0.03 + 0.063, 1500 + 3150), "B": (0.02 + 0.038, 1000 + 1900)})
    assert math.isclose(out.projected_usd, 0.10) and out.projected_tokens == 5000
    assert math.isclose(out.spent_usd, 0.101) and out.produced_tokens == 5050
    assert math.isclose(out.before_usd, 0.05) and out.before_tokens == 2500
    assert math.isclose(out.usd_error, 0.01) and math.isclose(out.tokens_error, 0.01)
    assert out.within(0.10) and not out.within(0.005)
    plan_line, actual_line = out.lines()
    assert plan_line.startswith("plan: $0.1000 and 5,000 output tokens projected for the rest")
    assert actual_line == (
        "generation then spent $0.1010 and produced 5,050 output tokens: +1.0% dollars, +1.0% output tokens"
        " against the plan"
    )


def test_only_the_datasets_asked_about_and_nothing_projected():
    doc = {"datasets": [dataset("A", 0.0, 0.0, 0.05, 2500), dataset("B", 0.04, 2000, 0.0, 0)]}
    out = plan_outcome(doc, {"A": (0.05, 2500)})  # B was not generated: left out
    assert out.projected_usd == 0 and out.spent_usd == 0 and out.produced_tokens == 0
    assert math.isnan(out.usd_error) and not out.within(0.10)
    assert "against the plan" not in out.lines()[1]
