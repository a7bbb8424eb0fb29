"""The simulator's failures and money over real HTTP: each fault's documented outcome, fault rates and
admission limits, auth, credits and top-ups, billing of abandoned and partial requests, /generation lookups,
and many concurrent requests held and abandoned at once.
"""

import asyncio
from contextlib import suppress
from typing import Any

import aiohttp
import orjson
import pytest

from resources.simulator.config import LatencyConfig
from resources.simulator.faults import FAULT_NAMES, FaultConfig, TokenBucket
from tests.simulator.harness import SimulatorHandle
from tests.simulator.sim_helpers import INT4_NAMES, WEATHER_TOOL, get_json, payload, post, simulator

# --------------------------------------------------------------------------------------------
# Faults


async def _one_with_fault(fault: str, body: dict[str, Any] | None = None, **fault_kw: Any) -> tuple[Any, dict]:
    with simulator(faults=FaultConfig(**{fault: 1.0}, **fault_kw)) as sim:
        async with aiohttp.ClientSession() as s:
            try:
                timeout = 0.4 if fault == "stall" else 5.0
                result: Any = await post(s, sim.base_url, body or payload(f"fault {fault}"), timeout=timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                result = exc
            for _ in range(50):  # an abandoned request is billed when the server notices the disconnect
                if fault != "stall" or sim.stats()["billed_requests"]:
                    break
                await asyncio.sleep(0.02)
        return result, sim.stats()


@pytest.mark.parametrize("fault", FAULT_NAMES)
async def test_each_fault_produces_its_documented_outcome(fault):
    body = payload(f"fault {fault}", provider={"quantizations": ["int4"], "sort": "price"})
    result, stats = await _one_with_fault(fault, body, retry_after_s=2.0, stall_seconds=10.0)
    assert stats["by_outcome"].get(fault) == 1 or fault in ("stall",)
    if fault in ("drop_connection", "stall"):
        # A drop after the early head cuts the body; a stall times out.
        lost = (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)
        assert isinstance(result, lost if fault == "drop_connection" else TimeoutError)
        assert stats["billed_requests"] == (1 if fault == "stall" else 0)  # an abandoned request is billed in full
        return
    status, headers, raw = result
    parsed = None
    with suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(raw.strip())
    billed = stats["billed_requests"]
    if fault == "rate_limit":
        assert status == 429 and headers["Retry-After"] == "2" and parsed["error"]["code"] == 429
    elif fault == "rate_limit_no_retry_after":
        assert status == 429 and "Retry-After" not in headers and "X-RateLimit-Reset" not in headers
    elif fault == "server_error":
        assert status in (500, 502, 503) and parsed["error"]["message"]
    elif fault == "timeout_408":
        assert status == 408 and parsed["error"]["code"] == 408
    elif fault == "error_body":
        assert status == 200 and "error" in parsed and "choices" not in parsed and billed == 0
    elif fault == "finish_error":
        choice = parsed["choices"][0]
        assert status == 200 and choice["finish_reason"] == "error" and choice["error"]["message"]
        # Billed for its partial output, though the body says cost 0 (the recorded shape): /generation knows.
        assert parsed["usage"]["cost"] == 0 and parsed["usage"]["completion_tokens"] > 0 and billed == 1
    elif fault == "truncated_json":
        assert status == 200 and parsed is None and raw.startswith(b'{"id":') and billed == 1
    elif fault == "whitespace_padding":
        assert status == 200 and raw[:1].isspace() and parsed["choices"][0]["message"]["content"] and billed == 1
    elif fault == "disallowed_provider":
        # Routing asked for int4: the answer comes from a name no int4 endpoint has, so the client can see it.
        assert status == 200 and parsed["provider"] not in INT4_NAMES
        assert stats["by_provider"] == {parsed["provider"]: 1}
        assert billed == 1 and stats["generations"][0]["provider"] == parsed["provider"]
    elif fault == "inflight_402":
        assert status == 402 and headers["Retry-After"] == "1"
        assert parsed["error"]["metadata"]["limit_source"] == "openrouter_in_flight_budget"
    else:  # pragma: no cover - a new fault needs a line here
        pytest.fail(f"untested fault {fault}")
    if fault not in ("truncated_json", "whitespace_padding", "disallowed_provider", "finish_error"):
        assert billed == 0 and stats["credits"]["usage"] == 0


async def test_markers_and_fault_rates():
    with simulator(faults=FaultConfig(rate_limit=0.3, server_error=0.1)) as sim:
        async with aiohttp.ClientSession() as s:
            st400, _, b400 = await post(s, sim.base_url, payload("bad [[sim:400]] prompt"))
            st403, _, b403 = await post(s, sim.base_url, payload("flag me [[sim:403]]"))
            forced = await post(s, sim.base_url, payload("always [[sim:fault=finish_error]]"))
            results = await asyncio.gather(*(post(s, sim.base_url, payload(f"p{i}")) for i in range(300)))
    assert st400 == 400 and orjson.loads(b400)["error"]["code"] == 400
    assert st403 == 403 and orjson.loads(b403)["error"]["code"] == 403
    assert orjson.loads(forced[2])["choices"][0]["finish_reason"] == "error"
    statuses = [r[0] for r in results]
    assert 60 <= statuses.count(429) <= 120
    assert 10 <= sum(statuses.count(c) for c in (500, 502, 503)) <= 55
    stats = sim.stats()
    assert stats["by_outcome"]["moderation"] == 1 and stats["by_outcome"]["bad_request"] == 1
    assert stats["requests_received"] == 303


async def test_fault_config_is_replaced_at_runtime_over_http():
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            assert (await post(s, sim.base_url, payload("a")))[0] == 200
            async with s.post(f"{sim.root_url}/_sim/faults", json={"timeout_408": 1.0}) as r:
                assert r.status == 200
            assert (await post(s, sim.base_url, payload("b")))[0] == 408
            async with s.post(f"{sim.root_url}/_sim/faults", json={"nonsense": 1}) as r:
                assert r.status == 400
            async with s.post(f"{sim.root_url}/_sim/faults", json={"rate_limit": 0.7, "stall": 0.7}) as r:
                assert r.status == 400
            sim.set_faults(FaultConfig())
            assert (await post(s, sim.base_url, payload("c")))[0] == 200
            async with s.post(f"{sim.root_url}/_sim/reset_stats") as r:
                assert r.status == 200
    assert sim.stats()["requests_received"] == 0


def test_fault_config_validation_and_token_bucket():
    with pytest.raises(ValueError):
        FaultConfig(rate_limit=0.6, server_error=0.6)
    with pytest.raises(ValueError):
        FaultConfig.from_mapping({"rate_limt": 0.1})
    assert (
        FaultConfig.from_mapping({"admit_rate_per_s": "none", "admit_retry_after": "false"}).admit_retry_after is False
    )
    now = [0.0]
    bucket = TokenBucket(10.0, 2.0, clock=lambda: now[0])
    assert [bucket.try_take() for _ in range(3)] == [True, True, False]
    now[0] += 0.1
    assert bucket.try_take() and not bucket.try_take()
    assert 0 < bucket.seconds_until_token() <= 0.1


def _stopped_clock_bucket(sim: SimulatorHandle) -> None:
    """The admission bucket the faults configured, on a clock that does not move: it admits its burst and then
    nothing, however long the requests take to arrive, so what is admitted is a count, not a race."""

    def swap() -> None:
        live = sim.state.bucket
        assert live is not None
        sim.state.bucket = TokenBucket(live.rate, live.burst, clock=lambda: 0.0)

    sim.call(swap)


async def test_admit_rate_storm_rejects_the_excess_with_429():
    with simulator(faults=FaultConfig(admit_rate_per_s=1, admit_burst=5, retry_after_s=3)) as sim:
        _stopped_clock_bucket(sim)
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post(s, sim.base_url, payload(f"storm {i}")) for i in range(40)))
            sim.set_faults(admit_rate_per_s=0.5, admit_burst=1, admit_retry_after=False)
            _stopped_clock_bucket(sim)
            later = await asyncio.gather(*(post(s, sim.base_url, payload(f"later {i}")) for i in range(5)))
    ok = [r for r in results if r[0] == 200]
    rejected = [r for r in results if r[0] == 429]
    assert len(ok) == 5 and len(rejected) == 35  # the burst, and not one token more
    assert all(r[1]["Retry-After"] == "3" for r in rejected)
    assert [r[0] for r in later].count(200) == 1
    assert all("Retry-After" not in r[1] for r in later if r[0] == 429)
    stats = sim.stats()
    assert stats["admitted"] == len(ok) + 1 and stats["admit_rejected"] == len(rejected) + 4


# --------------------------------------------------------------------------------------------
# Auth, credits, billing


async def test_auth_is_required():
    with simulator(accepted_keys=frozenset({"sk-good"})) as sim:
        async with aiohttp.ClientSession() as s:
            assert (await post(s, sim.base_url, payload("x"), headers={}))[0] == 401
            assert (await post(s, sim.base_url, payload("x"), headers={"Authorization": "Bearer "}))[0] == 401
            status, _, raw = await post(s, sim.base_url, payload("x"), headers={"Authorization": "Bearer sk-bad"})
            assert status == 401 and orjson.loads(raw)["error"]["code"] == 401
            assert (await post(s, sim.base_url, payload("x"), headers={"Authorization": "Bearer sk-good"}))[0] == 200
            assert (await get_json(s, f"{sim.base_url}/key", headers={}))[0] == 401
            assert (await get_json(s, f"{sim.base_url}/key", headers={"Authorization": "Bearer sk-good"}))[0] == 200


async def test_credits_run_out_then_topup_restores_service():
    # Chutes: $0.45 / $2.00 per M. A 1000-token reservation needs ~$0.002.
    with simulator(credits=0.004, management_keys=frozenset({"sk-or-test"})) as sim:
        async with aiohttp.ClientSession() as s:
            route = {"provider": {"quantizations": ["int4"], "sort": "price"}, "max_tokens": 1000}
            status, _, raw = await post(s, sim.base_url, {**payload("too big"), **route, "max_tokens": 100_000})
            assert status == 402
            err = orjson.loads(raw)["error"]
            assert err["code"] == 402 and err["metadata"]["limit_source"] == "openrouter_credits"
            assert "requires more credits, or fewer max_tokens" in err["message"]
            statuses = [(await post(s, sim.base_url, {**payload(f"spend {i}"), **route}))[0] for i in range(8)]
            assert statuses[0] == 200 and statuses[-1] == 402
            _, key = await get_json(s, f"{sim.base_url}/key")
            assert key["data"]["usage"] > 0 and key["data"]["limit"] == 0.004 and key["data"]["is_free_tier"] is False
            assert key["data"]["limit_remaining"] == pytest.approx(0.004 - key["data"]["usage"])
            async with s.post(f"{sim.root_url}/_sim/topup", json={"amount": 1.0}) as r:
                assert r.status == 200
            assert (await post(s, sim.base_url, {**payload("after topup"), **route}))[0] == 200
            _, credits = await get_json(s, f"{sim.base_url}/credits")
            forbidden, err = await get_json(s, f"{sim.base_url}/credits", headers={"Authorization": "Bearer sk-plain"})
            _, old_key = await get_json(s, f"{sim.base_url}/auth/key")
    assert forbidden == 403 and err["error"]["message"] == "Only management keys can perform this operation"
    assert credits["data"]["total_credits"] == pytest.approx(1.004)
    assert credits["data"]["total_usage"] == pytest.approx(sim.stats()["billed_usd"])
    assert old_key["data"]["usage"] == pytest.approx(credits["data"]["total_usage"])


async def test_abandoned_request_is_billed_in_full_and_partial_errors_for_their_output():
    with simulator(latency=LatencyConfig.fixed(0.8)) as sim:
        async with aiohttp.ClientSession() as s:
            body = payload("I will not wait for this")
            with pytest.raises(TimeoutError):
                await post(s, sim.base_url, body, timeout=0.2)
            for _ in range(100):
                if sim.stats()["billed_requests"]:
                    break
                await asyncio.sleep(0.02)
            stats = sim.stats()
            gen = stats["generations"][0]
            assert gen["cancelled"] and gen["billed"] and stats["by_outcome"]["abandoned"] == 1
            sim.set_faults(finish_error=1.0)
            await post(s, sim.base_url, payload("fails mid-way"), timeout=5)
            status, record = await get_json(s, f"{sim.base_url}/generation?id={gen['id']}")
    assert status == 200 and record["data"]["total_cost"] == pytest.approx(gen["cost"]) and record["data"]["cancelled"]
    assert stats["billed_usd"] == pytest.approx(gen["cost"]) and stats["in_flight"] == 0
    final = sim.stats()
    assert final["billed_requests"] == 2 and final["by_finish_reason"]["error"] == 1
    partial = final["generations"][-1]
    assert partial["finish_reason"] == "error" and 0 < partial["cost"] < gen["cost"]


async def test_generation_lookup_with_not_found_window():
    # The window is a minute, so the first lookup falls in it however slow the machine; closing it at run time
    # (as /_sim/generation_window does) is what ends it, not a wait.
    with simulator(generation_404_ms=60_000) as sim:
        async with aiohttp.ClientSession() as s:
            _, _, raw = await post(s, sim.base_url, payload("look me up", tools=[WEATHER_TOOL]))
            r = orjson.loads(raw)
            url = f"{sim.base_url}/generation?id={r['id']}"
            early, _ = await get_json(s, url)
            sim.set_generation_window(0)
            status, g = await get_json(s, url)
            unknown, _ = await get_json(s, f"{sim.base_url}/generation?id=gen-nope")
    assert early == 404 and status == 200 and unknown == 404
    d = g["data"]
    assert d["id"] == r["id"] and d["provider_name"] == r["provider"]
    assert d["total_cost"] == pytest.approx(r["usage"]["cost"])
    assert d["native_tokens_prompt"] == r["usage"]["prompt_tokens"]
    assert d["native_tokens_completion"] == r["usage"]["completion_tokens"]
    assert d["native_tokens_reasoning"] == r["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert d["finish_reason"] == r["choices"][0]["finish_reason"]
    assert d["latency"] >= 0 and d["generation_time"] >= 0


# --------------------------------------------------------------------------------------------
# Concurrency and abandonment


async def _until(done: Any, what: str, limit_s: float = 120.0) -> None:
    """Wait for a condition the test then asserts on; the limit only ends a wait that will never come true."""
    for _ in range(int(limit_s / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def test_many_concurrent_requests_are_held_at_once():
    # Every answer is held for ten minutes, so however slowly this machine sends the 400 requests, each one is
    # still held when the last arrives: the server holding all 400 at once is a count it reports, not a race.
    # The clients then give up; the server lets every request go and bills each in full (OpenRouter's rule).
    with simulator(latency=LatencyConfig.fixed(600.0)) as sim:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            calls = [asyncio.create_task(post(s, sim.base_url, payload(f"c{i % 50}"), timeout=900)) for i in range(400)]
            await _until(lambda: sim.stats(0)["in_flight"] == 400, "400 requests held at once")
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        await _until(lambda: sim.stats(0)["in_flight"] == 0, "every abandoned request let go")
    stats = sim.stats(generations_limit=0)
    assert stats["peak_in_flight"] == 400 and stats["requests_received"] == 400 and stats["generations"] == []
    assert stats["by_outcome"] == {"abandoned": 400} and stats["billed_requests"] == 400


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unbilled_attempt_abandoned_after_its_head_is_known_to_generation_at_no_cost(stream):
    """The head named the generation, then the client went away before the (unbillable) fault played out:
    /generation must still know the id (at 0), or a client that noted it could never settle it."""
    with simulator(latency=LatencyConfig.fixed(1.0), faults=FaultConfig(drop_connection=1.0)) as sim:
        async with aiohttp.ClientSession() as s:
            body = {**payload("dropped later, abandoned first"), **({"stream": True} if stream else {})}
            req = s.post(f"{sim.base_url}/chat/completions", json=body, headers={"Authorization": "Bearer sk-or-x"})
            resp = await asyncio.wait_for(req, 5.0)
            gen_id = resp.headers["X-Generation-Id"]
            resp.close()  # gone before the answer: the server notices the disconnect
            status = 404
            for _ in range(100):
                status, record = await get_json(s, f"{sim.base_url}/generation?id={gen_id}")
                if status == 200:
                    break
                await asyncio.sleep(0.05)
    assert status == 200, f"/generation does not know {gen_id}"
    assert record["data"]["total_cost"] == 0 and record["data"]["cancelled"]
    assert sim.stats()["billed_requests"] == 0
