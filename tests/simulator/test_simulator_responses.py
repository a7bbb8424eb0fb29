"""The simulator's answers over real HTTP: responses and usage (token counts of the real Kimi tokenizer),
routing by provider preferences, the endpoints listing, and streaming that reassembles to the plain body.
"""

import asyncio
import json
from typing import Any

import aiohttp
import orjson
import pytest

from eagle_assets.tokenization.reconstruction import prompt_token_ids
from eagle_assets.tokenization.tool_declaration import declare_tools
from resources.simulator.config import LatencyConfig
from resources.simulator.faults import FaultConfig
from resources.simulator.responses import request_content_hash
from tests.simulator.sim_helpers import (
    FP4_NAMES,
    INT4_NAMES,
    MODEL,
    SEARCH_TOOL,
    WEATHER_TOOL,
    expected_completion_tokens,
    get_json,
    payload,
    post,
    simulator,
)

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
