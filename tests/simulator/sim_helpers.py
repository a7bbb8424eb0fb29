"""Shared pieces of the simulator tests that run it over real HTTP on 127.0.0.1.

The generation engine's tests trust the simulator to behave like OpenRouter (status codes, error
bodies, billing rules, token counts of the real tokenizer), so each documented behaviour is pinned
against a live server rather than against handler functions, in ``test_simulator_responses``,
``test_simulator_faults_billing`` and ``test_simulator_process_cli``; this module holds what they share
(the module-scoped ``tk`` fixture is in ``conftest.py``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import orjson

from resources.simulator.config import SimulatorConfig
from tests.simulator.harness import SimulatorHandle, run_simulator_in_thread

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
