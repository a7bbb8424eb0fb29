"""The simulator answering with the tiny target's own greedy output, over real HTTP on 127.0.0.1.

What the pipeline relies on: the prompt the model conditioned on is the one reconstruction renders,
the ids reconstruction rebuilds from the answer are the ids the model produced (decode → re-encode
round-trips), they are the model's greedy choice among the allowed ids, and text depends only on the
request.
"""

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import torch

from eagle_assets.target.tiny import build_tiny_target
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer
from eagle_assets.tokenization.reconstruction import reconstruct
from eagle_assets.tokenization.tokenizer_source import BUNDLED_DIR
from resources.openrouter.sse import assemble_sse
from resources.simulator.__main__ import config_from_args
from resources.simulator.config import SimulatorConfig
from resources.simulator.embedded import generator_flags
from resources.simulator.model_generator import (
    CONTENT_TOKENS,
    REASONING_TOKENS,
    TinyTargetGenerator,
    safe_token_ids,
)
from resources.simulator.responses import ChatRequest, request_content_hash
from tests.simulator.harness import SimulatorHandle, config_to_args, run_simulator_in_thread

TOKENIZER_DIR = BUNDLED_DIR
MODEL = "moonshotai/kimi-k2.5"
AUTH = {"Authorization": "Bearer sk-or-test"}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def tok() -> KimiTokenizer:
    return load_kimi_tokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("target") / "tiny-kimi", seed=0)


@pytest.fixture(scope="module")
def generator(tiny_dir: Path, tok: KimiTokenizer) -> Iterator[TinyTargetGenerator]:
    gen = TinyTargetGenerator(tiny_dir, tok, max_batch=8)
    yield gen
    gen.close()


@pytest.fixture(scope="module")
def sim(generator: TinyTargetGenerator) -> Iterator[SimulatorHandle]:
    with run_simulator_in_thread(SimulatorConfig(tokenizer_dir=TOKENIZER_DIR), generator=generator) as handle:
        yield handle


def body(messages: list[dict[str, Any]], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "max_tokens": 4096, "messages": messages, **extra}
    if tools:
        out["tools"] = tools
    return out


CHATS: list[dict[str, Any]] = [
    body([{"role": "user", "content": "Explain how a hash map handles collisions."}]),
    body(
        [
            {"role": "system", "content": "You are a careful Python reviewer."},
            {"role": "user", "content": "Write a function that merges two sorted lists."},
        ]
    ),
    body([{"role": "user", "content": "What is the weather in Paris?"}], [WEATHER_TOOL]),
    body(
        [
            {"role": "user", "content": "What is 17 * 23?"},
            {"role": "assistant", "content": "391", "reasoning": "17*20 + 17*3"},
            {"role": "user", "content": "And divided by 3? <|im_end|> stays text </think>"},
        ]
    ),
    body([{"role": "user", "content": "天气怎么样？ Réponds en français, s'il te plaît."}]),
    body([{"role": "user", "content": "  odd\twhitespace \n\n and [BOS] look-alikes <|im_user|>  "}]),
]


async def post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with session.post(
        f"{url}/chat/completions", data=orjson.dumps(payload), headers=AUTH, timeout=aiohttp.ClientTimeout(total=60)
    ) as r:
        return r.status, orjson.loads(await r.read())


async def post_all(url: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        answers = await asyncio.gather(*(post(s, url, p) for p in payloads))
    for status, answer in answers:
        assert status == 200, answer
    return [a for _, a in answers]


def record(payload: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What the pipeline stores for a success (eagle_assets.generation.records) and reconstructs from."""
    choice = answer["choices"][0]
    msg = choice["message"]
    return {
        "messages": payload["messages"],
        "tools": payload.get("tools"),
        "reasoning": msg.get("reasoning"),
        "content": msg.get("content"),
        "tool_calls": msg.get("tool_calls"),
        "finish_reason": choice["finish_reason"],
    }


def content_hash(payload: dict[str, Any]) -> str:
    return request_content_hash(payload["messages"], payload.get("tools") or None)


# --------------------------------------------------------------------------------------------


def test_allow_list_round_trips_alone_and_concatenated(tok: KimiTokenizer) -> None:
    allowed = safe_token_ids(tok)
    assert len(allowed) > 20_000 and safe_token_ids(tok) is allowed  # cached per tokenizer
    for i in allowed:
        text = tok.decode([i])
        assert text[0] == " " and text[1:].isascii() and text[1:].isalpha()
        assert tok.encode_ordinary(text) == [i]
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.choice(allowed) for _ in range(rng.randrange(1, 120))]
        assert tok.encode_ordinary(tok.decode(ids)) == ids


async def test_answer_reconstructs_to_the_generated_ids(sim: SimulatorHandle, generator: TinyTargetGenerator, tok):
    answers = await post_all(sim.base_url, CHATS)  # concurrent: decoded as one batch
    assert generator.stats["max_batch_seen"] > 1
    for payload, answer in zip(CHATS, answers, strict=True):
        sample = generator.sample(content_hash(payload))
        assert sample is not None
        choice, usage = answer["choices"][0], answer["usage"]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        r_lo, r_hi = REASONING_TOKENS
        c_lo, c_hi = CONTENT_TOKENS
        assert r_lo <= len(sample.reasoning_ids) <= r_hi and c_lo <= len(sample.content_ids) <= c_hi
        assert set(sample.reasoning_ids + sample.content_ids) <= set(generator.allowed_ids)
        rc = reconstruct(record(payload, answer), tok)
        assert rc.input_ids[: rc.prompt_len] == list(sample.prompt_ids)
        assert rc.input_ids[rc.prompt_len :] == sample.response_ids
        assert usage["completion_tokens"] == rc.completion_len
        assert usage["completion_tokens_details"]["reasoning_tokens"] == len(sample.reasoning_ids)
    assert generator.stats["roundtrip_failures"] == 0
    async with aiohttp.ClientSession() as s, s.get(f"{sim.root_url}/_sim/stats") as r:
        reported = orjson.loads(await r.read())["generator"]
    assert reported["generations"] >= len(CHATS) and reported["tokens"] > 0


async def test_generation_is_the_greedy_choice_among_allowed_ids(
    sim: SimulatorHandle, generator: TinyTargetGenerator
) -> None:
    await post_all(sim.base_url, CHATS)
    allowed = torch.tensor(generator.allowed_ids)
    model = generator.model
    for payload in CHATS:
        sample = generator.sample(content_hash(payload))
        assert sample is not None
        ids = [*sample.prompt_ids, *sample.response_ids[:-1]]  # <|im_end|> is never fed
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0]  # no cache, no padding, full vocabulary
        p = len(sample.prompt_ids)
        forced = p + len(sample.reasoning_ids)  # the position of </think>
        assert ids[forced] == generator.think_end_id
        for pos in range(p, len(ids)):
            if pos == forced:
                continue
            scores = logits[pos - 1, allowed]
            best = int(scores.argmax())
            if int(allowed[best]) != ids[pos]:  # only a float near-tie may differ from the reference order
                chosen = int((allowed == ids[pos]).nonzero())
                assert float(scores[best] - scores[chosen]) < 1e-4, (payload["messages"], pos)


async def test_identical_requests_give_identical_text(
    sim: SimulatorHandle, generator: TinyTargetGenerator, tiny_dir: Path, tok: KimiTokenizer
) -> None:
    payload = body([{"role": "user", "content": "Determinism check: same prompt, same text."}])
    first, second = await post_all(sim.base_url, [payload, payload])
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    assert generator.sample(content_hash(payload)) is not None
    # A fresh generator (no cache, a batch of its own) writes the same text.
    fresh = TinyTargetGenerator(tiny_dir, tok)
    try:
        req = ChatRequest(payload["messages"], None, None, None, content_hash(payload))
        again = fresh.generate(req)
    finally:
        fresh.close()
    msg = first["choices"][0]["message"]
    assert (again.reasoning, again.content) == (msg["reasoning"], msg["content"])


async def test_max_tokens_cuts_a_prefix(sim: SimulatorHandle, generator: TinyTargetGenerator, tok) -> None:
    full_payload = CHATS[0]
    (full,) = await post_all(sim.base_url, [full_payload])
    sample = generator.sample(content_hash(full_payload))
    assert sample is not None
    n_r = len(sample.reasoning_ids)
    limits = [n_r - 3, n_r + 1 + 5]  # inside the reasoning, inside the content
    cut = await post_all(sim.base_url, [{**full_payload, "max_tokens": m} for m in limits])
    for limit, answer in zip(limits, cut, strict=True):
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == limit
        msg, whole = choice["message"], full["choices"][0]["message"]
        assert whole["reasoning"].startswith(msg["reasoning"]) and whole["content"].startswith(msg["content"])
        rc = reconstruct(record(full_payload, answer), tok)
        assert rc.input_ids[rc.prompt_len :] == sample.response_ids[:limit]
        assert rc.completion_len == limit


async def test_streamed_answer_has_the_same_text(sim: SimulatorHandle) -> None:
    payload = body([{"role": "user", "content": "Stream me the tiny target's answer."}])
    (plain,) = await post_all(sim.base_url, [payload])
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{sim.base_url}/chat/completions", data=orjson.dumps({**payload, "stream": True}), headers=AUTH) as r,
    ):
        raw = await r.read()
    streamed = assemble_sse(raw)  # as the engine reads it: deltas joined, usage from the last chunk
    assert streamed.complete and streamed.body is not None
    got, msg = streamed.body["choices"][0]["message"], plain["choices"][0]["message"]
    assert (got["reasoning"], got["content"]) == (msg["reasoning"], msg["content"])
    assert streamed.body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


async def test_config_builds_the_generator_and_the_cli_carries_it(tiny_dir: Path, tok: KimiTokenizer) -> None:
    config = SimulatorConfig(tokenizer_dir=TOKENIZER_DIR, tiny_target_dir=tiny_dir, tiny_target_max_batch=4)
    args = config_to_args(config)
    assert args[args.index("--tiny-target") + 1] == str(tiny_dir)
    back = config_from_args(args)
    assert back.tiny_target_dir == tiny_dir and back.tiny_target_max_batch == 4
    assert config_from_args(["--tiny-target-seed", "0", "--tiny-target", str(tiny_dir)]).tiny_target_dir == tiny_dir
    assert config_from_args([]).tiny_target_dir is None
    payload = CHATS[1]
    with run_simulator_in_thread(config) as handle:
        (answer,) = await post_all(handle.base_url, [payload])
    rc = reconstruct(record(payload, answer), tok)
    assert answer["usage"]["completion_tokens"] == rc.completion_len
    assert set(rc.input_ids[rc.prompt_len : -1]) <= {*safe_token_ids(tok), tok.special_id("</think>")}


def test_embedded_generator_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAGLE_FORGE_SIM_GENERATOR", raising=False)
    monkeypatch.delenv("EAGLE_FORGE_SIM_TINY_TARGET_SEED", raising=False)
    assert generator_flags() == ["--tiny-target-seed", "0"]
    monkeypatch.setenv("EAGLE_FORGE_SIM_TINY_TARGET_SEED", "3")
    assert generator_flags() == ["--tiny-target-seed", "3"]
    kimi = ["--tiny-target-seed", "3", "--tiny-target-kind", "kimi-k25-tiny"]
    assert generator_flags("kimi-k25-tiny") == kimi  # the target resource's tiny target, passed on
    monkeypatch.setenv("EAGLE_FORGE_SIM_GENERATOR", "kimi-style")
    assert generator_flags() == []
    monkeypatch.setenv("EAGLE_FORGE_SIM_GENERATOR", "gpt")
    with pytest.raises(ValueError, match="EAGLE_FORGE_SIM_GENERATOR"):
        generator_flags()


async def test_a_prompt_the_template_cannot_render_is_a_400(sim: SimulatorHandle) -> None:
    bad = body([{"role": "assistant", "content": "x", "tool_calls": [{"function": 5}]}])
    async with aiohttp.ClientSession() as s:
        status, answer = await post(s, sim.base_url, bad)
        assert status == 400 and "chat template" in answer["error"]["message"]
        status, _ = await post(s, sim.base_url, CHATS[0])  # the worker carries on
        assert status == 200
