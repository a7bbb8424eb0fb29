"""A request-wide error is told from prompts bad one by one: the breaker on the recorded 400 bodies, then the
engine against the simulator answering every request with one, and the partition that bought nothing."""

import json
from pathlib import Path

import pytest

from eagle_assets.generation.breaker import RequestWideBreaker, normalize_message
from resources.openrouter.outcomes import Action, RawResponse, classify
from tests.generation.conftest import make_prompts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter"
CASES = {c["file"]: c for c in json.loads((FIXTURES / "cases.json").read_text())["chat"]}
REQUEST_WIDE = [
    "chat/400_reasoning_mandatory.json",
    "chat/400_reasoning_mandatory_provider.json",
    "chat/400_input_required.json",
]
MANDATORY = "Reasoning is mandatory for this endpoint and cannot be disabled."


def skip_of(file: str):
    case = CASES[file]
    out = classify(RawResponse(case["status"], (FIXTURES / file).read_bytes(), case.get("headers", {})))
    assert out.action is Action.SKIP  # each alone reads as "this prompt can never succeed"
    return out


@pytest.mark.parametrize("file", REQUEST_WIDE)
def test_the_same_recorded_400_on_every_answer_trips_after_threshold(file):
    out = skip_of(file)
    breaker = RequestWideBreaker(threshold=5)
    assert breaker.holds_first_wave
    trips = [breaker.on_skip(out.error_class, out.message) for _ in range(5)]
    assert trips[:4] == [None] * 4 and trips[4] is not None
    assert trips[4].count == 5 and trips[4].message == out.message and not breaker.holds_first_wave
    assert "request-wide error" in trips[4].describe() and out.message in trips[4].describe()
    assert breaker.on_skip(out.error_class, out.message) is None  # it trips once
    assert breaker.is_tripped_by(out.error_class, out.message)


def test_per_prompt_skips_between_successes_never_trip():
    context = skip_of("chat/400_provider_context_length.json")
    moderation = skip_of("chat/403_moderation.json")
    breaker = RequestWideBreaker(threshold=3)
    for _ in range(50):
        assert breaker.on_skip(context.error_class, context.message) is None
        assert breaker.on_skip(moderation.error_class, moderation.message) is None
        breaker.on_success()
    assert breaker.tripped is None and breaker.seen_success and not breaker.holds_first_wave and not breaker.suspect
    # Two causes alternating are two counts, not one.
    mandatory = skip_of("chat/400_reasoning_mandatory.json")
    breaker = RequestWideBreaker(threshold=3)
    assert breaker.on_skip(mandatory.error_class, mandatory.message) is None
    assert breaker.on_skip(context.error_class, context.message) is None
    assert breaker.on_skip(mandatory.error_class, mandatory.message) is None
    assert breaker.on_skip(mandatory.error_class, mandatory.message) is not None


def test_messages_alike_but_for_numbers_and_ids_are_one_cause():
    a = "This endpoint's maximum context length is 262144 tokens. However, you requested about 300512 tokens."
    b = "This endpoint's maximum context length is 262144 tokens. However, you requested about 271002 tokens."
    assert normalize_message(a) == normalize_message(b)
    assert normalize_message("Generation gen-1773323560-Tq8XbV3nLm5oPz0rWs1e failed") == "generation # failed"
    assert normalize_message(MANDATORY) != normalize_message('Input required: specify "prompt" or "messages"')
    off = RequestWideBreaker(threshold=0)
    assert not off.holds_first_wave and all(off.on_skip("bad_request", MANDATORY) is None for _ in range(100))
    with pytest.raises(ValueError):
        RequestWideBreaker(threshold=-1)


# --- the engine ------------------------------------------------------------------------------------
def test_a_request_wide_400_stops_the_run_fatal_after_at_most_threshold_requests(harness):
    harness.sim.set_request_wide_error(MANDATORY)
    prompts = make_prompts(40, tag="rw")
    report = harness.run(prompts, max_in_flight=64, breaker_threshold=8)
    assert report.stop_reason == "fatal" and MANDATORY in report.stop_detail, report.summary()
    assert "request-wide error" in report.stop_detail
    assert report.requests <= 8 and report.skipped == 0 and report.ok == 0
    assert harness.records() == []  # none of those skips is final: nothing journaled
    assert harness.sim.stats(0)["billed_usd"] == 0
    # Once the request is fixed (here: the stand-in answers normally), every prompt is bought.
    harness.sim.set_request_wide_error(None)
    again = harness.run(prompts, max_in_flight=64)
    assert again.complete and again.stop_reason == "completed" and again.ok == 40
    assert len([r for r in harness.records() if r["status"] == "ok"]) == 40


def test_a_partition_with_skips_and_no_success_fails_and_asks_them_again(harness):
    harness.sim.set_request_wide_error('Input required: specify "prompt" or "messages"')
    prompts = make_prompts(5, tag="few")  # fewer than the threshold: the breaker cannot tell
    report = harness.run(prompts, breaker_threshold=8)
    assert report.stop_reason == "no_success", report.summary()
    assert "none succeeded" in report.stop_detail and "Input required" in report.stop_detail
    recs = harness.records()
    assert len(recs) == 5 and all(r["status"] == "skipped" and r["final"] is False for r in recs)
    assert report.unconfirmed_skips == 5
    harness.sim.set_request_wide_error(None)
    again = harness.run(prompts)
    assert again.reasked_skips == 5 and again.ok == 5 and again.stop_reason == "completed"
    assert [r["status"] for r in harness.records()] == ["ok"] * 5


def test_skips_beside_successes_are_final_and_reask_skipped_asks_them_again(harness):
    prompts = make_prompts(12, tag="mix")
    for p in prompts[:3]:
        p.messages[0]["content"] += " [[sim:400]]"
    first = harness.run(prompts)
    assert first.complete and first.skipped == 3 and first.ok == 9
    assert all(r["final"] for r in harness.records() if r["status"] == "skipped")
    assert harness.run(prompts).requests == 0  # final: never asked again by default
    # After a change of configuration the user asks the skipped ones again.
    again = harness.run(prompts, reask_skipped=True)
    assert again.reasked_skips == 3 and again.requests == 3 and again.skipped == 3 and again.complete
