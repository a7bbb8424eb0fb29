"""The OpenRouter simulator, over real HTTP on 127.0.0.1.

The generation engine's tests trust the simulator to behave like OpenRouter (status codes, error
bodies, billing rules, token counts of the real tokenizer), so each documented behaviour is pinned
here against a live server rather than against handler functions.
"""

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from eagle_assets.tokenization.reconstruction import prompt_token_ids
from eagle_assets.tokenization.tool_declaration import declare_tools
from resources.simulator.__main__ import config_from_args
from resources.simulator.config import (
    DEFAULT_PROVIDERS,
    LatencyConfig,
    ProviderEndpoint,
    SimulatorConfig,
    is_loopback_host,
)
from resources.simulator.faults import FAULT_NAMES, FaultConfig, TokenBucket
from resources.simulator.responses import request_content_hash
from tests.simulator.harness import (
    SimulatorHandle,
    config_to_args,
    run_simulator_in_thread,
    spawn_simulator_process,
)

MODEL = "moonshotai/kimi-k2.5"
AUTH = {"Authorization": "Bearer sk-or-test"}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}
INT4_NAMES = {"Moonshot AI", "Chutes", "SiliconFlow", "Parasail"}
FP4_NAMES = {"Fireworks", "BaseTen", "DeepInfra"}


@pytest.fixture(scope="module")
def tk():
    return load_kimi_tokenizer("bundled")


@contextmanager
def simulator(**overrides: Any) -> Iterator[SimulatorHandle]:
    with run_simulator_in_thread(SimulatorConfig(**overrides)) as handle:
        yield handle


def payload(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4096, "messages": [{"role": "user", "content": content}], **extra}


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout: float = 15.0, headers: Any = None
) -> tuple[int, Any, bytes]:
    async with session.post(
        f"{url}/chat/completions",
        data=orjson.dumps(body),
        headers=headers if headers is not None else AUTH,
        timeout=aiohttp.ClientTimeout(total=timeout),
    ) as r:
        return r.status, r.headers, await r.read()


async def get_json(session: aiohttp.ClientSession, url: str, headers: Any = None) -> tuple[int, Any]:
    async with session.get(url, headers=headers if headers is not None else AUTH) as r:
        return r.status, orjson.loads(await r.read())


def expected_completion_tokens(tk, message: dict[str, Any], finish_reason: str) -> int:
    sp = tk.special_tokens
    n = len(tk.encode_ordinary(message.get("reasoning") or "")) + 1 + len(tk.encode_ordinary(message["content"] or ""))
    calls = message.get("tool_calls") or []
    if calls:
        n += 2  # section begin / end
        for c in calls:
            n += 3 + len(tk.encode_ordinary(c["id"])) + len(tk.encode_ordinary(c["function"]["arguments"]))
        assert sp["<|tool_calls_section_begin|>"] and sp["<|tool_call_argument_begin|>"]
    return n + (1 if finish_reason in ("stop", "tool_calls") else 0)


# --------------------------------------------------------------------------------------------
# Responses and usage


async def test_same_prompt_gives_same_response_and_is_seen_billed_twice():
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            body = payload("Explain how a hash map handles collisions.")
            st1, h1, b1 = await post(s, sim.base_url, body)
            st2, _h2, b2 = await post(s, sim.base_url, body)
            _, _, other = await post(s, sim.base_url, payload("Something else entirely, please."))
    assert st1 == st2 == 200
    r1, r2 = orjson.loads(b1), orjson.loads(b2)
    assert r1["id"] != r2["id"] and r1["id"].startswith("gen-")
    # As on OpenRouter: the head names the generation (X-Generation-Id), and it is the body's first field.
    assert h1["X-Generation-Id"] == r1["id"] and b1.lstrip().startswith(f'{{"id":"{r1["id"]}"'.encode())
    for r in (r1, r2):
        r.pop("id")
        r.pop("created")
    assert r1 == r2
    assert orjson.loads(other)["choices"][0]["message"] != r1["choices"][0]["message"]
    stats = sim.stats()
    digest = request_content_hash(body["messages"], None)
    assert stats["billed_by_hash"][digest] == 2
    assert stats["hashes_billed_more_than_once"] == [digest]


async def test_response_depends_on_seed_only_not_on_attempt():
    body = payload("Write a haiku about caching.")
    async with aiohttp.ClientSession() as s:
        with simulator(seed=1) as sim:
            a = orjson.loads((await post(s, sim.base_url, body))[2])
        with simulator(seed=1, faults=FaultConfig(rate_limit=0.5)) as sim:
            seen = []
            for _ in range(12):
                status, _, raw = await post(s, sim.base_url, body)
                if status == 200:
                    seen.append(orjson.loads(raw)["choices"][0]["message"])
        with simulator(seed=2) as sim:
            c = orjson.loads((await post(s, sim.base_url, body))[2])
    assert seen and all(m == a["choices"][0]["message"] for m in seen)
    assert c["choices"][0]["message"] != a["choices"][0]["message"]


async def test_usage_matches_the_kimi_tokenizer(tk):
    finishes = set()
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            for i in range(16):
                tools = [WEATHER_TOOL, SEARCH_TOOL] if i % 2 else None
                body = payload(f"Question {i}: what is the weather like in Paris? <|im_end|> is a special id here")
                if tools:
                    body["tools"] = tools
                status, _, raw = await post(s, sim.base_url, body)
                assert status == 200
                r = orjson.loads(raw)
                choice = r["choices"][0]
                msg, usage = choice["message"], r["usage"]
                finishes.add(choice["finish_reason"])
                assert r["model"] == "moonshotai/kimi-k2.5-0127" and r["provider"] in INT4_NAMES | FP4_NAMES
                assert set(msg) >= {"role", "content", "reasoning", "reasoning_details"}
                assert msg["reasoning_details"][0]["text"] == msg["reasoning"]
                prompt = body["messages"][0]["content"]
                rendered = (
                    f"<|im_user|>user<|im_middle|>{prompt}<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
                )
                if tools:  # declared in TypeScript, as Kimi K2.5's tokenizer does
                    declared = declare_tools(tools).tools_ts_str
                    assert declared and "type get_weather = (_: {" in declared
                    rendered = f"<|im_system|>tool_declare<|im_middle|>{declared}<|im_end|>" + rendered
                # The serving path: the rendered prompt encoded with every special allowed (the literal
                # <|im_end|> in the question is one id), exactly what reconstruction rebuilds.
                assert usage["prompt_tokens"] == len(tk.encode_with_special(rendered))
                assert usage["prompt_tokens"] == len(prompt_token_ids(tk, body["messages"], tools))
                assert usage["completion_tokens"] == expected_completion_tokens(tk, msg, choice["finish_reason"])
                assert usage["completion_tokens_details"]["reasoning_tokens"] == len(
                    tk.encode_ordinary(msg["reasoning"])
                )
                assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
                assert usage["cost"] > 0 and choice["native_finish_reason"] == choice["finish_reason"]
                if choice["finish_reason"] == "tool_calls":
                    call = msg["tool_calls"][0]
                    name = call["function"]["name"]
                    assert call["id"] == f"functions.{name}:0" and name in ("get_weather", "search_docs")
                    assert isinstance(json.loads(call["function"]["arguments"]), dict)
                else:
                    assert "tool_calls" not in msg and msg["content"]
    assert finishes == {"stop", "tool_calls"}


async def test_prompt_the_template_cannot_render_is_a_bad_request():
    # The prompt is counted with the real chat template; a message it cannot render is the caller's error.
    broken = {"role": "assistant", "content": "x", "tool_calls": [5]}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}, broken, {"role": "user", "content": "q"}]}
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            status, _, raw = await post(s, sim.base_url, body)
            assert status == 400 and b"cannot render the prompt" in raw
            assert (await post(s, sim.base_url, payload("fine")))[0] == 200


async def test_mean_length_and_mixed_content(tk):
    with simulator(mean_completion_tokens=120) as sim:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(*(post(s, sim.base_url, payload(f"topic number {i}")) for i in range(80)))
    bodies = [orjson.loads(raw) for _, _, raw in results]
    lengths = [b["usage"]["completion_tokens"] for b in bodies]
    assert 80 < sum(lengths) / len(lengths) < 170
    text = "".join(b["choices"][0]["message"]["content"] for b in bodies)
    assert "```" in text and any(ord(ch) > 0x2000 for ch in text)


async def test_max_tokens_cuts_at_a_token_boundary(tk):
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            body = payload("Describe the water cycle in detail.")
            full = orjson.loads((await post(s, sim.base_url, body))[2])
            short = orjson.loads((await post(s, sim.base_url, {**body, "max_tokens": 5}))[2])
            r_ids = tk.encode_ordinary(full["choices"][0]["message"]["reasoning"])
            c_ids = tk.encode_ordinary(full["choices"][0]["message"]["content"])
            mid = orjson.loads((await post(s, sim.base_url, {**body, "max_tokens": len(r_ids) + 1 + 3}))[2])
            hidden = orjson.loads((await post(s, sim.base_url, {**body, "reasoning": {"exclude": True}}))[2])
    assert hidden["choices"][0]["message"]["reasoning"] is None
    assert hidden["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"]
    assert hidden["usage"] == full["usage"]
    assert full["choices"][0]["finish_reason"] == "stop"
    sc = short["choices"][0]
    assert sc["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 5
    assert sc["message"]["reasoning"] == tk.decode(r_ids[:5]) and sc["message"]["content"] == ""
    mc = mid["choices"][0]
    assert mc["finish_reason"] == "length" and mid["usage"]["completion_tokens"] == len(r_ids) + 4
    assert mc["message"]["reasoning"] == full["choices"][0]["message"]["reasoning"]
    assert mc["message"]["content"] == tk.decode(c_ids[:3])
    assert mid["usage"]["cost"] < full["usage"]["cost"]


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
# Routing


async def test_routing_honours_provider_preferences():
    cases = [
        ({"quantizations": ["int4"], "sort": "price"}, "Chutes"),
        ({"quantizations": ["int4"], "ignore": ["chutes"], "sort": "price"}, "SiliconFlow"),
        ({"sort": "price"}, "Novita"),  # Together is cheaper but down (status -5): never routed to
        ({"quantizations": ["fp4"], "ignore": ["fireworks"], "sort": "price"}, "DeepInfra"),  # cheaper prompt
        ({"quantizations": ["fp4"], "ignore": ["fireworks", "deepinfra/fp4"], "sort": "price"}, "BaseTen"),
        ({"quantizations": ["fp8"], "sort": "price"}, "DeepInfra"),
        ({"only": ["deepinfra/fp8"], "sort": "price"}, "DeepInfra"),  # a full tag pins one endpoint
        ({"quantizations": ["unknown"], "sort": "price"}, "Novita"),  # null quantization counts as unknown
        ({"only": ["parasail"]}, "Parasail"),
        ({"only": ["moonshotai/int4"]}, "Moonshot AI"),
        ({"only": ["siliconflow/int4", "chutes/int4"], "require_parameters": True, "sort": "price"}, "Chutes"),
        ({"quantizations": ["int4"], "max_price": {"completion": 2.3}, "sort": "price"}, "Chutes"),
        ({"quantizations": ["int4"], "order": ["siliconflow", "chutes"]}, "SiliconFlow"),
        (None, "Moonshot AI"),
    ]
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            for prefs, expected in cases:
                extra = {} if prefs is None else {"provider": prefs}
                status, _, raw = await post(s, sim.base_url, payload("route me", **extra))
                assert status == 200, prefs
                assert orjson.loads(raw)["provider"] == expected, prefs
            # SiliconFlow lacks top_p: with require_parameters it is never used for a request that sends it.
            pinned = {"only": ["siliconflow/int4", "chutes/int4"], "require_parameters": True, "order": ["siliconflow"]}
            status, _, raw = await post(s, sim.base_url, payload("route me", top_p=0.9, provider=pinned))
            assert status == 200 and orjson.loads(raw)["provider"] == "Chutes"
            status, _, raw = await post(
                s, sim.base_url, payload("route me", provider={**pinned, "require_parameters": False}, top_p=0.9)
            )
            assert status == 200 and orjson.loads(raw)["provider"] == "SiliconFlow"
            only_sf = {"only": ["siliconflow/int4"], "require_parameters": True}
            status, _, raw = await post(s, sim.base_url, payload("route me", top_p=0.9, provider=only_sf))
            err = orjson.loads(raw)["error"]
            assert status == 404 and err["message"].startswith(
                "No endpoints found that can handle the requested parameters"
            )
            for prefs in (
                {"quantizations": ["bf16"]},
                {"quantizations": ["int4"], "max_price": {"completion": 1.5}},
                {"only": ["fireworks"], "ignore": ["fireworks"]},
                {"only": ["together/fp8"]},  # down
            ):
                status, _, raw = await post(s, sim.base_url, payload("route me", provider=prefs))
                err = orjson.loads(raw)["error"]
                assert status == 404 and err["code"] == 404, prefs
                assert err["message"].startswith("No allowed providers are available for the selected model"), prefs
                assert "together" not in err["metadata"]["available_providers"]


async def test_endpoints_listing():
    with simulator() as sim:
        async with aiohttp.ClientSession() as s:
            status, body = await get_json(s, f"{sim.base_url}/models/moonshotai/kimi-k2.5/endpoints")
            missing, _ = await get_json(s, f"{sim.base_url}/models/nobody/nothing/endpoints")
    assert status == 200 and missing == 404
    eps = {e["tag"]: e for e in body["data"]["endpoints"]}
    names = {e["provider_name"] for e in body["data"]["endpoints"]}
    assert names >= INT4_NAMES | FP4_NAMES and body["data"]["id"] == MODEL
    assert eps["moonshotai/int4"]["provider_name"] == "Moonshot AI" and eps["deepinfra/fp4"]["quantization"] == "fp4"
    assert eps["deepinfra/fp8"]["provider_name"] == "DeepInfra"  # one name, two endpoints
    assert eps["fireworks"]["provider_name"] == eps["fireworks/fast"]["provider_name"] == "Fireworks"  # bare tags
    assert eps["novita"]["quantization"] is None and eps["atlas-cloud/unknown"]["quantization"] == "unknown"
    assert eps["together/fp8"]["status"] == -5
    assert "top_p" not in eps["siliconflow/int4"]["supported_parameters"]
    assert eps["chutes/int4"]["pricing"] == {
        **eps["chutes/int4"]["pricing"],
        "prompt": "0.00000045",
        "completion": "0.000002",
    }
    assert eps["parasail/int4"]["pricing"]["completion"] == "0.0000028"
    assert eps["baseten/fp4"]["pricing"]["prompt"] == "0.00000042" and eps["baseten/fp4"]["provider_name"] == "BaseTen"
    for tag, e in eps.items():
        assert e["context_length"] > 0 and "tools" in e["supported_parameters"]
        assert tag == tag.lower() and (e["status"] == 0 or tag == "together/fp8")


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
# Streaming


def _reassemble(raw: bytes) -> tuple[dict[str, Any], dict[str, Any], str, list[str]]:
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    usage: dict[str, Any] = {}
    finish = ""
    comments = []
    lines = [line for line in raw.decode().split("\n") if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        if line.startswith(":"):
            comments.append(line)
            continue
        chunk = orjson.loads(line.removeprefix("data: "))
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"].startswith("gen-")
        if chunk.get("usage"):  # the last chunk: usage, with the finish choice repeated or no choices
            usage = chunk["usage"]
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        message["reasoning"] += delta.get("reasoning") or ""
        for tc in delta.get("tool_calls") or []:
            slot = message["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
            slot["id"] = tc.get("id") or slot["id"]
            fn = tc.get("function") or {}
            slot["name"] = fn.get("name") or slot["name"]
            slot["arguments"] += fn.get("arguments") or ""
        if choice["finish_reason"]:
            finish = choice["finish_reason"]
            if "error" in chunk:
                message["error"] = chunk["error"]
    return message, usage, finish, comments


async def test_streaming_reassembles_to_the_non_streaming_message():
    with simulator(latency=LatencyConfig.fixed(0.1), processing_comment_interval_s=0.02) as sim:
        async with aiohttp.ClientSession() as s:
            seen_tool_calls = False
            for i in range(6):
                body = payload(f"stream test {i}", tools=[WEATHER_TOOL])
                _, _, plain = await post(s, sim.base_url, body)
                status, headers, streamed = await post(s, sim.base_url, {**body, "stream": True})
                assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
                full = orjson.loads(plain)
                msg, usage, finish, comments = _reassemble(streamed)
                ref = full["choices"][0]["message"]
                assert comments and comments[0] == ": OPENROUTER PROCESSING"
                # null beside tool calls in the plain body; the stream's deltas concatenate to "".
                assert msg["content"] == (ref["content"] or "") and msg["reasoning"] == ref["reasoning"]
                assert finish == full["choices"][0]["finish_reason"]
                calls = [
                    {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in msg["tool_calls"].values()
                ]
                want = [
                    {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                    for c in ref.get("tool_calls") or []
                ]
                assert calls == want
                seen_tool_calls |= bool(calls)
                assert {k: v for k, v in usage.items() if k != "cost"} == {
                    k: v for k, v in full["usage"].items() if k != "cost"
                }
                assert usage["cost"] == pytest.approx(full["usage"]["cost"])
            sim.set_faults(finish_error=1.0)
            status, _, broken = await post(s, sim.base_url, {**payload("stream error"), "stream": True})
    assert seen_tool_calls
    msg, _, finish, _ = _reassemble(broken)
    assert status == 200 and finish == "error" and msg["error"]["code"] == 502
    assert sim.stats()["billed_requests"] == 13  # the stream cut by an error is billed for its first chunks


# --------------------------------------------------------------------------------------------
# Persistence, processes, CLI


async def test_state_file_keeps_the_balance_across_restarts(tmp_path: Path):
    state_file = tmp_path / "sim" / "state.json"
    async with aiohttp.ClientSession() as s:
        with simulator(credits=5.0, state_file=state_file) as sim:
            assert (await post(s, sim.base_url, payload("persist me")))[0] == 200
            sim.topup(2.5)
            usage = sim.stats()["credits"]["usage"]
        saved = json.loads(state_file.read_text())
        assert saved["limit"] == 7.5 and saved["usage"] == pytest.approx(usage) and usage > 0
        with simulator(credits=100.0, state_file=state_file) as sim:
            _, key = await get_json(s, f"{sim.base_url}/key")
    assert key["data"]["limit"] == 7.5 and key["data"]["usage"] == pytest.approx(usage)
    assert not [p for p in state_file.parent.iterdir() if p.name != "state.json"]  # no temp files left


async def test_spawned_process_serves_and_persists(tmp_path: Path):
    state_file = tmp_path / "state.json"
    args = [
        "--port",
        "0",
        "--credits",
        "3",
        "--state-file",
        str(state_file),
        "--latency-fixed",
        "0.01",
        "--fault",
        "whitespace_padding=1.0",
        "--seed",
        "7",
    ]
    proc = spawn_simulator_process(args, ready_timeout=30)
    try:
        assert proc.base_url.startswith("http://127.0.0.1:") and proc.base_url.endswith("/api/v1")
        async with aiohttp.ClientSession() as s:
            status, _, raw = await post(s, proc.base_url, payload("from a child process"))
            assert status == 200 and raw[:1].isspace()
        proc.topup(1.0)
        spent = proc.stats()["credits"]["usage"]
    finally:
        assert proc.terminate() == 0
    assert json.loads(state_file.read_text())["limit"] == 4.0
    with spawn_simulator_process(["--port", "0", "--state-file", str(state_file)]) as again:
        async with aiohttp.ClientSession() as s:
            _, key = await get_json(s, f"{again.base_url}/key")
    assert key["data"]["limit"] == 4.0 and key["data"]["usage"] == pytest.approx(spent)


def test_cli_refuses_non_loopback_hosts_and_parses_flags(tmp_path: Path):
    for host in ("0.0.0.0", "192.168.1.5", "example.com", "::"):
        assert not is_loopback_host(host)
        with pytest.raises(SystemExit):
            config_from_args(["--host", host])
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "::1"):
        assert is_loopback_host(host)
    with pytest.raises(ValueError):
        SimulatorConfig(host="0.0.0.0")
    cfg = config_from_args(
        [
            "--port",
            "0",
            "--credits",
            "12",
            "--state-file",
            str(tmp_path / "s.json"),
            "--latency-lognormal",
            "0.4",
            "0.5",
            "--fault",
            "rate_limit=0.05",
            "--fault",
            "stall_seconds=3",
            "--admit-rate",
            "500",
            "--seed",
            "9",
            "--key",
            "k1",
        ]
    )
    assert cfg.credits == 12 and cfg.latency.median_s == 0.4 and cfg.latency.sigma == 0.5 and cfg.seed == 9
    assert cfg.faults.rate_limit == 0.05 and cfg.faults.stall_seconds == 3 and cfg.faults.admit_rate_per_s == 500
    assert cfg.accepted_keys == frozenset({"k1"})
    with pytest.raises(SystemExit):
        config_from_args(["--fault", "rate_limit=2"])


def test_config_round_trips_through_cli_flags(tmp_path: Path):
    cfg = SimulatorConfig(
        port=0,
        seed=3,
        credits=1.25,
        state_file=tmp_path / "s.json",
        accepted_keys=frozenset({"a", "b"}),
        latency=LatencyConfig.lognormal(0.2, 0.7, 0.01, 9.0),
        mean_completion_tokens=50,
        generation_404_ms=20,
        faults=FaultConfig(rate_limit=0.1, stall=0.05, stall_seconds=2, admit_rate_per_s=100, admit_retry_after=False),
        providers=(
            *DEFAULT_PROVIDERS[:2],
            ProviderEndpoint("Acme", "acme", "fp8", 0.3, 1.1),
            ProviderEndpoint("Acme", "acme", None, 0.2, 1.0, status=-2, endpoint_tag="acme/fast"),
            ProviderEndpoint("Bolt", "bolt", "int4", 0.3, 1.2, supported_parameters=("max_tokens", "tools")),
        ),
        unlimited_key=True,
        management_keys=frozenset({"mk"}),
        workspace_budget_usd=2.5,
        leading_space_rate=0.5,
        generation_id_header=False,
        plain_head_first=False,
        request_wide_400="Reasoning is mandatory for this endpoint and cannot be disabled.",
        usage_chunk_with_choice_rate=0.25,
    )
    assert config_from_args(config_to_args(cfg)) == cfg
    assert config_from_args(config_to_args(SimulatorConfig())) == SimulatorConfig()
    fixed = SimulatorConfig(latency=LatencyConfig.fixed(0.05))
    assert config_from_args(config_to_args(fixed)).latency == fixed.latency


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
