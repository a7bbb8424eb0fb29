"""The simulator answers in the shapes of ``tests/fixtures/openrouter``, so the engine's tests run
against the real-shaped API: each answer here goes through the same classifier and must land where
the corpus body of the same kind lands."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from resources.openrouter.account import read_account_cap
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.outcomes import RawResponse, classify, generation_id_from_prefix
from resources.openrouter.secret import ApiKey
from resources.simulator.config import LatencyConfig, SimulatorConfig
from resources.simulator.faults import FaultConfig
from tests.simulator.harness import SimulatorHandle, run_simulator_in_thread

MODEL = "moonshotai/kimi-k2.5"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter"
CORPUS = {c["file"]: c for c in json.loads((FIXTURES / "cases.json").read_text())["chat"]}
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}


@contextmanager
def simulator(**overrides: Any) -> Iterator[SimulatorHandle]:
    overrides.setdefault("latency", LatencyConfig.fixed(0.002))
    overrides.setdefault("mean_completion_tokens", 40)
    with run_simulator_in_thread(SimulatorConfig(**overrides)) as handle:
        yield handle


def body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 512, "messages": [{"role": "user", "content": content}], **extra}


async def ask(url: str, payload: dict[str, Any], key: str = "sk-or-test") -> RawResponse:
    async with OpenRouterClient(url, ApiKey(key), request_timeout_s=20) as client:
        return await client.chat_completion(payload, idle_timeout_s=10)


def corpus_class(file: str) -> tuple[str, str]:
    return CORPUS[file]["action"], CORPUS[file]["error_class"]


def outcome(raw: RawResponse) -> tuple[str, str]:
    out = classify(raw)
    return out.action.value, out.error_class


async def test_error_answers_classify_like_their_corpus_bodies():
    with simulator() as sim:
        url = sim.base_url
        assert outcome(await ask(url, {**body("x"), "model": "moonshotai/kimi-k2.5-0000"})) == corpus_class(
            "chat/400_unknown_model.json"
        )
        assert outcome(await ask(url, body("flag me [[sim:403]]"))) == corpus_class("chat/403_moderation.json")
        assert outcome(await ask(url, body("[[sim:403guardrail]]"))) == corpus_class(
            "chat/403_guardrail_injection.json"
        )
        no_route = await ask(url, body("x", provider={"only": ["together/fp8"]}))
        assert no_route.status == 404
        assert outcome(no_route) == corpus_class("chat/404_no_allowed_providers.json")
        params = await ask(
            url, body("x", top_p=0.5, provider={"only": ["siliconflow/int4"], "require_parameters": True})
        )
        assert outcome(params) == corpus_class("chat/404_require_parameters.json")
        sim.set_faults(FaultConfig(rate_limit=1.0, retry_after_s=3))
        limited = await ask(url, body("x"))
        assert outcome(limited) == corpus_class("chat/429_retry_after.json") and classify(limited).retry_after_s == 3
        sim.set_faults(FaultConfig(inflight_402=1.0))
        assert outcome(await ask(url, body("x"))) == corpus_class("chat/402_in_flight_budget.json")
        sim.set_faults(FaultConfig(timeout_408=1.0))
        assert outcome(await ask(url, body("x"))) == corpus_class("chat/408_timeout.json")
        sim.set_faults(FaultConfig(truncated_json=1.0))
        torn = await ask(url, body("torn"))
        assert outcome(torn) == corpus_class("chat/torn_body.json")
        assert generation_id_from_prefix(torn.body) is not None  # the id survives in the torn prefix


async def test_workspace_budget_answers_403_and_stops_until_raised():
    with simulator(workspace_budget_usd=0.0) as sim:
        raw = await ask(sim.base_url, body("anything"))
        assert raw.status == 403 and outcome(raw) == corpus_class("chat/403_workspace_budget.json")
        assert orjson.loads(raw.body)["error"]["message"].startswith("Budget limit exceeded")
        assert sim.stats()["billed_requests"] == 0
        sim.set_workspace_budget(1.0)
        assert (await ask(sim.base_url, body("anything"))).status == 200


async def test_unlimited_key_has_null_limits_and_credits_answer_management_keys_only():
    with simulator(unlimited_key=True, credits=7.0, management_keys=frozenset({"sk-or-mgmt"})) as sim:
        async with OpenRouterClient(sim.base_url, ApiKey("sk-or-test")) as client:
            key = await client.key_info()
            plain_cap, allowed = await read_account_cap(client)
        async with OpenRouterClient(sim.base_url, ApiKey("sk-or-mgmt")) as client:
            mgmt_cap, mgmt_allowed = await read_account_cap(client)
    assert key["limit"] is None and key["limit_remaining"] is None and key["is_management_key"] is False
    assert plain_cap.remaining_usd is None and plain_cap.source == "none" and allowed is False
    assert "403" in plain_cap.detail and "budget_usd" in plain_cap.detail
    assert mgmt_cap.source == "account_credits" and mgmt_cap.remaining_usd == pytest.approx(7.0) and mgmt_allowed


async def _raw_answers(url: str) -> list[tuple[Any, bytes]]:
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-or-test"}) as s:
        out = []
        for payload in (body("plain"), body("stream", stream=True)):
            async with s.post(f"{url}/chat/completions", json=payload) as r:
                out.append((r.headers, await r.read()))
        return out


async def test_generation_id_header_and_the_id_opens_body_and_stream():
    with simulator(processing_comment_interval_s=0.004, latency=LatencyConfig.fixed(0.03)) as sim:
        (plain_headers, plain), (stream_headers, stream) = await _raw_answers(sim.base_url)
        sim.set_faults(FaultConfig(rate_limit=1.0))
        limited = await ask(sim.base_url, body("slow down"))
        refused = await ask(sim.base_url, {**body("x"), "model": "moonshotai/kimi-k2.5-0000"})
    # The head names the generation (as recorded since October 2026), and the body agrees.
    assert plain.startswith(b"\n") and plain.lstrip().startswith(b'{"id":"gen-')  # padded while generating
    assert plain_headers["X-Generation-Id"] == orjson.loads(plain)["id"]
    first_data = next(line for line in stream.split(b"\n") if line.startswith(b"data:"))
    assert first_data.startswith(b'data: {"id":"gen-') and stream.startswith(b": OPENROUTER PROCESSING")
    assert stream_headers["X-Generation-Id"] == orjson.loads(first_data[6:])["id"]
    usage_chunk = orjson.loads(stream.split(b"data: ")[-2])
    assert usage_chunk["usage"]["completion_tokens"] > 0
    assert stream.endswith(b"data: [DONE]\n\n")
    # Errors name one too (recorded on 400, 402 and 429), though nothing was generated.
    assert limited.generation_id and limited.generation_id.startswith("gen-") and limited.status == 429
    assert refused.generation_id and refused.status == 400
    # As older recordings: no header, and the whole plain answer at the end, unpadded.
    with simulator(generation_id_header=False, plain_head_first=False, latency=LatencyConfig.fixed(0.03)) as sim:
        (plain_headers, plain), (stream_headers, stream) = await _raw_answers(sim.base_url)
    assert not [h for h in (*plain_headers, *stream_headers) if "generation" in h.lower()]
    assert plain.startswith(b'{"id":"gen-') and b"data: " in stream


async def test_streams_send_both_usage_chunk_shapes_and_each_reassembles():
    """Most recorded streams repeat the finish choice on the usage chunk; the others send ``choices: []``."""
    shapes = []
    with simulator(usage_chunk_with_choice_rate=0.5) as sim:
        async with (
            aiohttp.ClientSession(headers={"Authorization": "Bearer sk-or-test"}) as s,
            OpenRouterClient(sim.base_url, ApiKey("sk-or-test")) as client,
        ):
            for i in range(30):
                payload = body(f"usage shape {i}", stream=True)
                async with s.post(f"{sim.base_url}/chat/completions", json=payload) as r:
                    raw = await r.read()
                last = orjson.loads(raw.split(b"data: ")[-2])
                shapes.append(bool(last["choices"]))
                if last["choices"]:
                    assert last["choices"][0]["finish_reason"] in ("stop", "tool_calls", "length")
                again = await client.chat_completion(payload)  # the same prompt: the same shape, reassembled
                out = classify(again)
                assert out.error_class == "ok" and out.data["usage"] == last["usage"]
    assert 5 <= sum(shapes) <= 25  # both shapes, about half each


async def test_leading_spaces_and_null_content_beside_tool_calls():
    tk = load_kimi_tokenizer("bundled")
    spaced, plain, null_content = 0, 0, 0
    with simulator(leading_space_rate=0.5, tool_call_probability=1.0) as sim:
        async with OpenRouterClient(sim.base_url, ApiKey("sk-or-test")) as client:
            for i in range(40):
                tools = [TOOL] if i % 2 else None
                raw = await client.chat_completion(body(f"question number {i} about spaces", tools=tools))
                data = orjson.loads(raw.body)
                msg = data["choices"][0]["message"]
                if msg["reasoning"].startswith(" "):
                    spaced += 1
                    assert msg["content"] is None or msg["content"].startswith(" ")
                else:
                    plain += 1
                if msg.get("tool_calls") and msg["content"] is None:
                    null_content += 1
                # The space is text like any other: the usage counts it.
                n = len(tk.encode_ordinary(msg["reasoning"])) + 1 + len(tk.encode_ordinary(msg["content"] or ""))
                if not msg.get("tool_calls"):
                    assert data["usage"]["completion_tokens"] == n + 1
    assert spaced >= 8 and plain >= 8 and null_content >= 3
    with simulator(leading_space_rate=0.0) as sim:
        raw = await ask(sim.base_url, body("question number 1 about spaces"))
        assert not orjson.loads(raw.body)["choices"][0]["message"]["reasoning"].startswith(" ")
