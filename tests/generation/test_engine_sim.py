"""The generation engine against the simulator over real HTTP: every error class, provider policy,
budgets, credits, resumption."""

import pytest

from eagle_assets.generation.ledger import BudgetLedger
from resources.openrouter.providers import NoAllowedProviderError, ProviderPolicy
from resources.simulator.faults import FaultConfig
from tests.generation.conftest import make_prompts

ALLOWED = {"Moonshot AI", "Chutes", "SiliconFlow", "Parasail"}


def assert_unique_complete(h, prompts, report):
    recs = h.records()
    ids = [r["prompt_id"] for r in recs]
    assert len(ids) == len(set(ids)), "a prompt was journaled twice"
    assert set(ids) == {p.prompt_id for p in prompts}
    assert report.complete and report.stop_reason == "completed", report.summary()
    return recs


def test_happy_path_records_usage_and_cost(harness):
    prompts = make_prompts(40) + make_prompts(10, tag="tool", tools=True)
    report = harness.run(prompts)
    recs = assert_unique_complete(harness, prompts, report)
    ok = [r for r in recs if r["status"] == "ok"]
    assert len(ok) == 50 and report.requests == 50
    assert {r["provider"] for r in ok} <= ALLOWED
    assert all(r["completion_tokens"] > 0 and r["cost"] > 0 and r["generation_id"] for r in ok)
    assert any(r["tool_calls"] for r in ok), "the simulator answers some tool prompts with tool calls"
    stats = harness.sim.stats(0)
    assert harness.ledger_totals().usd_spent == pytest.approx(stats["billed_usd"], rel=1e-9)
    assert stats["hashes_billed_more_than_once"] == []
    assert any("prompts |" in line for line in report.log_lines)


def test_rerun_skips_done_prompts(harness):
    prompts = make_prompts(20)
    harness.run(prompts)
    before = harness.sim.stats(0)["requests_received"]
    report = harness.run(prompts)
    assert report.already_done == 20 and report.requests == 0
    assert harness.sim.stats(0)["requests_received"] == before


FAULTS = [
    ("rate_limit", {"rate_limit": 0.3}, {"rate_limited"}),
    ("rate_limit_no_retry_after", {"rate_limit_no_retry_after": 0.3}, {"rate_limited"}),
    ("server_error", {"server_error": 0.3}, {"server_error", "no_provider"}),
    ("timeout_408", {"timeout_408": 0.3}, {"timeout"}),
    ("drop_connection", {"drop_connection": 0.3}, {"connection"}),
    ("stall", {"stall": 0.2, "stall_seconds": 5.0}, {"timeout"}),
    ("error_body", {"error_body": 0.3}, {"error_body", "rate_limited"}),
    ("finish_error", {"finish_error": 0.3}, {"finish_error"}),
    ("truncated_json", {"truncated_json": 0.3}, {"malformed"}),
    ("inflight_402", {"inflight_402": 0.3}, {"in_flight_budget"}),
    ("disallowed_provider", {"disallowed_provider": 0.3}, {"disallowed_provider"}),
]


@pytest.mark.parametrize(("name", "faults", "classes"), FAULTS, ids=[f[0] for f in FAULTS])
def test_each_transient_fault_is_retried_to_completion(harness, name, faults, classes):
    harness.sim.set_faults(FaultConfig(**{"retry_after_s": 0.05, **faults}))
    prompts = make_prompts(40, tag=name[:3])
    report = harness.run(prompts, max_attempts=12, timeout_s=1.0)
    recs = assert_unique_complete(harness, prompts, report)
    assert set(report.errors) & classes, f"expected one of {classes}, saw {dict(report.errors)}"
    assert all(r["provider"] in ALLOWED for r in recs)
    totals = harness.ledger_totals()
    billed = harness.sim.stats(0)["billed_usd"]
    # The ledger is never below what the provider billed (uncertain attempts are charged at worst case).
    assert totals.usd_spent >= billed - 1e-9
    assert totals.usd_reserved == 0 and totals.in_flight == 0


def test_whitespace_padding_is_parsed(harness):
    harness.sim.set_faults(FaultConfig(whitespace_padding=1.0))
    prompts = make_prompts(10)
    report = harness.run(prompts)
    assert_unique_complete(harness, prompts, report)
    assert not report.errors


def test_disallowed_provider_is_discarded_and_its_cost_counted(harness):
    harness.sim.set_faults(FaultConfig(disallowed_provider=0.5))
    prompts = make_prompts(30)
    report = harness.run(prompts, max_attempts=20)
    recs = assert_unique_complete(harness, prompts, report)
    assert report.discarded_usd > 0 and all(r["provider"] in ALLOWED for r in recs)
    led = BudgetLedger(harness.ledger_path)
    assert led.spend_by_kind()["discarded"] == pytest.approx(report.discarded_usd)
    led.close()
    assert harness.ledger_totals().usd_spent == pytest.approx(harness.sim.stats(0)["billed_usd"])


def test_bad_request_and_moderation_are_recorded_and_never_retried(harness):
    prompts = make_prompts(6)
    prompts[1].messages[0]["content"] += " [[sim:400]]"
    prompts[2].messages[0]["content"] += " [[sim:403]]"
    report = harness.run(prompts)
    recs = {r["prompt_id"]: r for r in harness.records()}
    assert report.skipped == 2 and report.complete
    assert recs[prompts[1].prompt_id]["status"] == "skipped"
    assert recs[prompts[1].prompt_id]["error_class"] == "bad_request"
    assert recs[prompts[2].prompt_id]["error_class"] == "moderation"
    assert report.requests == 6  # one attempt each, no retries of 400/403
    again = harness.run(prompts)
    assert again.requests == 0


@pytest.mark.sim(accepted_keys=frozenset({"sk-good"}))
def test_bad_key_stops_the_run_without_spending(harness):
    prompts = make_prompts(20)
    try:
        report = harness.run(prompts, key="sk-wrong")
    except Exception as exc:  # the endpoints call may already refuse the key
        assert "401" in str(exc) and "sk-wrong" not in str(exc)
        return
    assert report.stop_reason == "fatal" and report.ok == 0
    assert report.requests <= 64  # stopped on the first answers, no retries
    assert harness.sim.stats(0)["billed_usd"] == 0


def test_no_allowed_provider_refuses_to_start(harness):
    with pytest.raises(NoAllowedProviderError, match="no endpoint is allowed"):
        harness.run(make_prompts(3), policy=ProviderPolicy(quantizations=("bf16",)))
    assert harness.sim.stats(0)["requests_received"] == 0


def test_dollar_budget_is_never_exceeded_and_resumes(harness):
    prompts = make_prompts(300)
    report = harness.run(prompts, budget=0.03, max_tokens=256)
    assert report.stop_reason == "budget" and 0 < report.done < 300
    t = harness.ledger_totals()
    assert t.usd_spent <= 0.03 + 1e-12 and t.usd_reserved == 0
    assert harness.sim.stats(0)["billed_usd"] <= 0.03
    # Raise the budget: the partition continues where it stopped, nothing bought twice.
    report2 = harness.run(prompts, budget=5.0)
    assert report2.already_done == report.done
    assert_unique_complete(harness, prompts, report2)
    assert harness.sim.stats(0)["hashes_billed_more_than_once"] == []


def test_token_budget_is_respected(harness):
    prompts = make_prompts(200)
    report = harness.run(prompts, token_budget=3000, max_tokens=128, max_in_flight=16)
    assert report.stop_reason == "tokens"
    kept = sum(r.get("completion_tokens", 0) for r in harness.records())
    assert kept <= 3000
    led = BudgetLedger(harness.ledger_path)
    assert led.totals("T1").tokens_spent == kept
    led.close()


@pytest.mark.sim(credits=0.02)
def test_credits_exhausted_then_topup_completes(harness):
    prompts = make_prompts(200)
    report = harness.run(prompts, max_tokens=128)
    assert report.stop_reason == "credits" and report.done < 200
    assert harness.sim.stats(0)["credits"]["remaining"] >= 0
    harness.sim.topup(5.0)
    report2 = harness.run(prompts, max_tokens=128)
    assert_unique_complete(harness, prompts, report2)
    assert harness.sim.stats(0)["hashes_billed_more_than_once"] == []


def test_length_finish_is_kept_and_marked(harness):
    prompts = make_prompts(10)
    harness.run(prompts, max_tokens=8)
    recs = harness.records()
    assert recs and all(r["finish_reason"] == "length" and r["truncated"] for r in recs)
    assert all(r["completion_tokens"] <= 8 for r in recs)


def test_429_storm_adapts_concurrency_and_completes(harness):
    harness.sim.set_faults(FaultConfig(admit_rate_per_s=300, admit_burst=20, admit_retry_after=False))
    prompts = make_prompts(300)
    report = harness.run(prompts, max_in_flight=200, max_attempts=30)
    assert_unique_complete(harness, prompts, report)
    assert report.errors["rate_limited"] > 0
