"""The request-wide breaker where it went wrong (issue 18's audit): prompts refused one by one must never trip it,
on the first run or on a rerun; every_turn skips follow the same rules as single prompts; a request-wide 400 that
comes slowly still costs at most ``breaker_threshold`` requests; a zero cost stays zero; the resource's breaker
fields reach the engine; a 402's ``reason`` is read on the error as well as in its metadata."""

import asyncio
import json
import urllib.error
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from eagle_assets.datasets.file_readers import RawRow
from eagle_assets.datasets.formats import detect_format
from eagle_assets.datasets.prompts import Conversation, Prompt, conversation_of
from eagle_assets.datasets.samples import sample_rows
from eagle_assets.generation.breaker import PER_PROMPT, PROVEN_FACTOR, RequestWideBreaker
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.partition_runs import generation_settings
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.runner import GenerationSettings, PartitionJob, PartitionReport, PartitionRunner
from eagle_assets.generation.turn_chains import TurnChains
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.outcomes import Action, RawResponse, classify
from resources.openrouter.providers import ProviderPolicy, ProviderTable, parse_endpoints
from resources.openrouter.resource import OpenRouterResource
from resources.openrouter.secret import ApiKey
from resources.simulator.config import LatencyConfig
from tests.generation.conftest import MODEL, make_prompts
from tests.simulator.harness import _http_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter"
MANDATORY = "Reasoning is mandatory for this endpoint and cannot be disabled."
K = 8  # breaker_threshold


def flag_every(prompts: list[Prompt], every: int, marker: str) -> int:
    """Mark one prompt in ``every`` so that the simulator refuses it alone (a ``[[sim:…]]`` marker)."""
    flagged = 0
    for i, p in enumerate(prompts):
        if i % every == every // 3:
            p.messages[0]["content"] += f" [[sim:{marker}]]"
            flagged += 1
    return flagged


def refusal(file: str, status: int) -> tuple[str, str]:
    out = classify(RawResponse(status, (FIXTURES / file).read_bytes(), {}))
    assert out.action is Action.SKIP
    return out.error_class, out.message


# --- the breaker alone ---------------------------------------------------------------------------
def test_refusals_about_the_prompt_never_count():
    moderation = refusal("chat/403_moderation.json", 403)
    guardrail = refusal("chat/403_guardrail_injection.json", 403)
    assert {moderation[0], guardrail[0]} <= PER_PROMPT
    breaker = RequestWideBreaker(threshold=K)
    for _ in range(10 * K):
        assert breaker.on_skip(*moderation) is None and breaker.on_skip(*guardrail) is None
    assert breaker.tripped is None and not breaker.suspect


def test_once_the_partition_has_a_success_a_handful_alike_never_trips():
    alike = refusal("chat/400_provider_context_length.json", 400)
    rerun = RequestWideBreaker(threshold=K, proven=True)  # the journal holds a success
    assert all(rerun.on_skip(*alike) is None for _ in range(PROVEN_FACTOR * K - 1))
    assert rerun.on_skip(*alike) is not None  # four times the threshold in a row is request-wide again
    fresh = RequestWideBreaker(threshold=K)
    assert all(fresh.on_skip(*alike) is None for _ in range(K - 1)) and fresh.on_skip(*alike) is not None
    # A success during the run proves the request as well.
    run = RequestWideBreaker(threshold=K)
    run.on_success()
    assert all(run.on_skip(*alike) is None for _ in range(PROVEN_FACTOR * K - 1))


def test_alike_skips_that_are_a_small_share_of_what_is_out_never_trip():
    """A wave of 2000 whose fast 400s come back before its slow successes: 40 alike of 2000 is not all alike."""
    alike = refusal("chat/400_reasoning_mandatory.json", 400)
    breaker = RequestWideBreaker(threshold=K)
    assert all(breaker.on_skip(*alike, open_requests=2000 - n) is None for n in range(1, 41))
    # The same 40 with nothing else out are every answer: request-wide.
    alone = RequestWideBreaker(threshold=K)
    trips = [alone.on_skip(*alike, open_requests=0) for _ in range(K)]
    assert trips[-1] is not None and trips[-1].count == K


def test_the_first_wave_is_held_until_threshold_answers_or_a_success():
    breaker = RequestWideBreaker(threshold=K)
    assert breaker.holds_first_wave and breaker.probe_size == K
    for _ in range(K - 1):
        breaker.on_response()  # answers to retry (429, timeouts): no success, not yet K
    assert breaker.holds_first_wave
    breaker.on_response()
    assert not breaker.holds_first_wave
    ok = RequestWideBreaker(threshold=K)
    ok.on_response()
    ok.on_success()
    assert not ok.holds_first_wave
    # With a success journaled, the wave stays held while every answer is the same skip, until it decides.
    rerun = RequestWideBreaker(threshold=K, proven=True)
    assert rerun.probe_size == PROVEN_FACTOR * K
    for _ in range(K):
        rerun.on_response()
        rerun.on_skip("bad_request", MANDATORY)
    assert rerun.holds_first_wave
    rerun.on_response()
    rerun.on_skip("bad_request", "another cause")
    assert not rerun.holds_first_wave  # two causes: not one request-wide error
    assert not RequestWideBreaker(threshold=0).holds_first_wave
    # Accepted requests (200 response heads, before any answer) open it: a request-wide 400 never gets one.
    heads = RequestWideBreaker(threshold=K)
    assert [heads.on_accepted() for _ in range(K)] == [False] * (K - 1) + [True]
    assert not heads.holds_first_wave and not heads.on_accepted()


# --- the engine: false trips ---------------------------------------------------------------------
@pytest.mark.parametrize("marker", ["400", "403"])
@pytest.mark.sim(latency=LatencyConfig.fixed(0.3))
def test_prompts_refused_one_by_one_in_a_wide_wave_never_trip_it(harness, marker):
    """Refusals come back at once, successes after the latency: the wave's refusals arrive in a row (the audit:
    300 prompts, 4% flagged, stopped fatal with 288 ok)."""
    prompts = make_prompts(200, tag=f"w{marker}")
    flagged = flag_every(prompts, 20, marker)
    assert flagged > K
    report = harness.run(prompts, max_in_flight=200, timeout_s=10.0, breaker_threshold=K)
    assert report.stop_reason == "completed" and report.complete, report.summary()
    assert report.ok == 200 - flagged and report.skipped == flagged and report.request_wide_skips == 0
    skips = [r for r in harness.records() if r["status"] == "skipped"]
    assert len(skips) == flagged and all(r["final"] for r in skips)


@pytest.mark.sim(latency=LatencyConfig.fixed(0.05))
def test_a_rerun_of_only_the_skipped_prompts_never_trips_it(harness):
    prompts = make_prompts(60, tag="rr")
    flagged = flag_every(prompts, 5, "400")  # 12 alike 400s, more than the threshold
    first = harness.run(prompts, breaker_threshold=K)
    assert first.complete and first.skipped == flagged > K, first.summary()
    again = harness.run(prompts, breaker_threshold=K, reask_skipped=True)  # only the 12 are asked, all refused
    assert again.reasked_skips == flagged and again.requests == flagged, again.summary()
    assert again.stop_reason == "completed" and again.complete and again.request_wide_skips == 0
    assert len(harness.records()) == 60


def test_a_request_wide_400_after_a_config_change_still_trips_on_a_partition_with_successes(harness):
    prompts = make_prompts(100, tag="cc")
    harness.run(prompts[:16])  # a first run bought 16
    harness.sim.reset_stats()
    harness.sim.set_request_wide_error(MANDATORY)
    report = harness.run(prompts, breaker_threshold=K)
    assert report.stop_reason == "fatal" and MANDATORY in report.stop_detail, report.summary()
    assert report.requests == harness.sim.stats(0)["requests_received"] <= PROVEN_FACTOR * K
    assert [r["status"] for r in harness.records()] == ["ok"] * 16  # none of the refusals is journaled
    harness.sim.set_request_wide_error(None)
    fixed = harness.run(prompts)
    assert fixed.complete and fixed.ok == 84 and len(harness.records()) == 100


# --- the engine: a request-wide 400 that comes slowly ----------------------------------------------
def test_a_slow_request_wide_400_costs_at_most_threshold_requests(harness):
    """The 400 comes after 1.5 s (longer than the 1 s the first wave used to be held): still at most K sent."""
    harness.sim.set_request_wide_error(MANDATORY, delay_s=1.5)
    prompts = make_prompts(40, tag="slow")
    report = harness.run(prompts, max_in_flight=2000, timeout_s=10.0, breaker_threshold=K)
    assert report.stop_reason == "fatal" and MANDATORY in report.stop_detail, report.summary()
    assert harness.sim.stats(0)["requests_received"] <= K and report.requests <= K
    assert harness.records() == []


@pytest.mark.sim(latency=LatencyConfig.fixed(0.3))
def test_a_working_request_opens_the_first_wave_with_its_first_answers(harness):
    """Answers that take longer than any window: the wave opens once the first ones are in, not later."""
    report = harness.run(make_prompts(64, tag="open"), max_in_flight=64, timeout_s=10.0, breaker_threshold=K)
    assert report.complete and report.ok == 64
    assert report.peak_in_flight > K  # past the held first wave: the rest went out together


@pytest.mark.sim(latency=LatencyConfig.fixed(2.0))
@pytest.mark.parametrize("stream", [False, True])
def test_the_first_wave_opens_on_accepted_heads_not_on_answers(harness, stream):
    """OpenRouter sends a 200 head before the answer: once K requests were accepted the rest go out at once, so
    all 64 are out together (held until K answers, at most 64 - K could be: the first K were back by then)."""
    report = harness.run(
        make_prompts(64, tag=f"h{stream}"),
        max_in_flight=64,
        timeout_s=10.0,
        breaker_threshold=K,
        stream=stream,
        idle_s=5.0,
    )
    assert report.complete and report.ok == 64, report.summary()
    assert harness.sim.stats(0)["peak_in_flight"] == 64 == report.peak_in_flight


# --- every_turn ----------------------------------------------------------------------------------
def b5_conversations(n: int, tag: str, flag_second_turn: set[int] | None = None) -> list[Conversation]:
    """B5's builder (whole conversations, regenerated turn by turn); ``flag_second_turn``: rows whose second
    question the simulator refuses alone."""
    fmt = detect_format(["id", "messages"])
    out = []
    for i, row in enumerate(sample_rows("B5", n)):
        if i in (flag_second_turn or set()):
            row["messages"][2]["content"] += " [[sim:400]]"
        out.append(conversation_of(RawRow("b5.jsonl", i + 1, i, {"id": f"{tag}{i:03d}", **row}), fmt, "every_turn"))
    return out


def run_chains(harness, convs: list[Conversation], **kw) -> PartitionReport:
    return harness.run([], chains=TurnChains(convs), breaker_threshold=K, **kw)


def test_every_turn_request_wide_400_journals_nothing_and_the_fixed_rerun_buys_every_turn(harness):
    convs = b5_conversations(20, "rw")
    total = sum(len(c.turns or []) for c in convs)
    harness.sim.set_request_wide_error(MANDATORY)
    report = run_chains(harness, convs)
    assert report.stop_reason == "fatal" and MANDATORY in report.stop_detail, report.summary()
    assert report.requests <= K and harness.records() == []
    harness.sim.set_request_wide_error(None)
    fixed = run_chains(harness, b5_conversations(20, "rw"))
    assert fixed.complete and fixed.stop_reason == "completed", fixed.summary()
    recs = harness.records()
    assert len(recs) == total and all(r["status"] == "ok" for r in recs)


def test_every_turn_skips_without_a_success_are_not_final_and_restart_their_chains(harness):
    convs = b5_conversations(3, "nf")  # fewer first turns than the threshold: the breaker cannot tell
    total = sum(len(c.turns or []) for c in convs)
    harness.sim.set_request_wide_error('Input required: specify "prompt" or "messages"')
    report = run_chains(harness, convs)
    assert report.stop_reason == "no_success" and report.unconfirmed_skips == 3, report.summary()
    firsts = [r for r in harness.records() if r["prompt_id"].endswith("#t1")]
    assert len(firsts) == 3 and all(r["status"] == "skipped" and r["final"] is False for r in firsts)
    harness.sim.set_request_wide_error(None)
    again = run_chains(harness, b5_conversations(3, "nf"))
    assert again.reasked_skips == 3 and again.already_done == 0, again.summary()
    assert again.complete and again.stop_reason == "completed" and again.ok == total
    assert [r["status"] for r in harness.records()] == ["ok"] * total


def test_every_turn_skips_beside_successes_are_final_and_reask_skipped_restarts_them(harness):
    convs = b5_conversations(10, "rs", flag_second_turn={1, 4, 7})
    total = sum(len(c.turns or []) for c in convs)
    first = run_chains(harness, convs)
    assert first.complete and first.stop_reason == "completed", first.summary()
    recs = {r["prompt_id"]: r for r in harness.records()}
    refused = sorted(pid for pid, r in recs.items() if r["status"] == "skipped" and r["error_class"] == "bad_request")
    assert len(refused) == 3 and all(pid.endswith("#t2") and recs[pid]["final"] for pid in refused)
    assert run_chains(harness, b5_conversations(10, "rs", {1, 4, 7})).requests == 0  # final: not asked again
    before = harness.sim.stats(0)["requests_received"]
    again = run_chains(harness, b5_conversations(10, "rs", {1, 4, 7}), reask_skipped=True)
    assert again.reasked_skips == 3 and again.requests == 3, again.summary()  # each chain restarts at its skip
    assert harness.sim.stats(0)["requests_received"] == before + 3
    assert again.complete and again.stop_reason == "completed" and len(harness.records()) == total


# --- a zero cost is a cost -----------------------------------------------------------------------
async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    text = body["messages"][-1]["content"]
    name = "ok_zero_cost.json" if "zero" in text else "ok_no_cost.json"
    return web.Response(body=(FIXTURES / "chat" / name).read_bytes(), content_type="application/json")


async def _account(request: web.Request) -> web.Response:
    if request.path.endswith("/key"):
        return web.Response(
            body=(FIXTURES / "account/key_unlimited.json").read_bytes(), content_type="application/json"
        )
    if request.path.endswith("/endpoints"):
        data = (FIXTURES / "account/endpoints_kimi_k25.json").read_bytes()
        return web.Response(body=data, content_type="application/json")
    name, status = ("credits_403.json", 403) if request.path.endswith("/credits") else ("generation_404.json", 404)
    return web.Response(status=status, body=(FIXTURES / "account" / name).read_bytes(), content_type="application/json")


@asynccontextmanager
async def stand_in() -> AsyncIterator[str]:
    """OpenRouter on 127.0.0.1 answering with the recorded bodies: a zero cost, or none at all."""
    app = web.Application()
    app.router.add_post("/api/v1/chat/completions", _chat)
    for path in ("/api/v1/key", "/api/v1/credits", "/api/v1/generation", f"/api/v1/models/{MODEL}/endpoints"):
        app.router.add_get(path, _account)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/api/v1"
    finally:
        await runner.cleanup()


def test_a_success_that_says_it_cost_zero_is_charged_zero(tmp_path):
    prompts = [
        Prompt("zero", [{"role": "user", "content": "zero: what is the capital of France?"}], None, 1, 0),
        Prompt("none", [{"role": "user", "content": "none: what is the capital of France?"}], None, 2, 1),
    ]
    settings = GenerationSettings(
        model=MODEL, max_tokens=256, budget_usd=10.0, retry=RetryPolicy(max_attempts=2), commit_interval_s=0.01
    )
    job = PartitionJob("T1", "0000", prompts, 10**9, tmp_path / "j.journal")

    async def go() -> tuple[PartitionReport, float, float]:
        ledger = BudgetLedger(tmp_path / "ledger.sqlite")
        try:
            async with stand_in() as url, OpenRouterClient(url, ApiKey("sk-test"), request_timeout_s=10) as client:
                table = ProviderTable(parse_endpoints(await client.endpoints(MODEL)), ProviderPolicy(), ("max_tokens",))
                runner = PartitionRunner(job, client, ledger, table, settings, lambda p: 40, emit=lambda s: None)
                report = await runner.run()
                prompt_price, completion_price = table.price_of("Moonshot AI")
            return report, ledger.totals().usd_spent, 31 * prompt_price + 58 * completion_price
        finally:
            ledger.close()

    report, spent, priced = asyncio.run(go())
    assert report.ok == 2 and report.stop_reason == "completed", report.summary()
    cost = {r["prompt_id"]: r["cost"] for r in read_records(tmp_path / "j.journal")}
    assert cost["zero"] == 0.0  # free, discounted, BYOK: what the answer said
    assert priced > 0 and cost["none"] == pytest.approx(priced)  # only a missing cost is priced from the usage
    assert spent == pytest.approx(priced) and report.spent_usd == pytest.approx(priced)


# --- settings and outcomes -----------------------------------------------------------------------
def test_the_breaker_fields_reach_the_engine():
    settings = generation_settings(OpenRouterResource(breaker_threshold=3, reask_skipped=True))
    assert settings.breaker_threshold == 3 and settings.reask_skipped is True
    default = generation_settings(OpenRouterResource())
    assert default.breaker_threshold == 8 and default.reask_skipped is False
    assert not any("probe" in name for name in OpenRouterResource.model_fields)  # no time window left to set


@pytest.mark.parametrize(
    ("file", "action", "error_class", "says"),
    [
        ("chat/402_reason_on_error_in_flight.json", Action.RETRY, "in_flight_budget", "in-flight"),
        ("chat/402_reason_on_error_weight.json", Action.STOP_CREDITS, "credits_exhausted", "lower max_tokens"),
    ],
)
def test_a_402_reason_on_the_error_itself_is_read(file, action, error_class, says):
    body = json.loads((FIXTURES / file).read_bytes())
    assert "reason" in body["error"] and "reason" not in body["error"].get("metadata", {})
    out = classify(RawResponse(402, (FIXTURES / file).read_bytes(), {}))
    assert (out.action, out.error_class) == (action, error_class) and says in out.message


def test_the_request_wide_400_and_its_delay_are_set_over_http(harness):
    """What ``SimulatorProcess.set_request_wide_error`` posts: the message and the delay, a negative one refused."""
    url = f"{harness.sim.root_url}/_sim/request_wide_error"
    assert _http_json(url, {"message": MANDATORY, "delay_s": 0.2}) == {"request_wide_error": MANDATORY, "delay_s": 0.2}
    state = harness.sim.state
    assert (state.request_wide_error, state.request_wide_delay_s) == (MANDATORY, 0.2)
    with pytest.raises(urllib.error.HTTPError, match="400"):
        _http_json(url, {"message": MANDATORY, "delay_s": -1})
    assert _http_json(url, {"message": None}) == {"request_wide_error": None, "delay_s": 0.0}
