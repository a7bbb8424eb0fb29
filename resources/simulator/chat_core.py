"""What every answer of ``POST /chat/completions`` shares: the prepared response, usage, latency, billing
rules, the fault answers that come before or instead of a completion, and the drop of a connection.

It has to stay cheap per request (2000 in flight on two cores must measure the client, not the simulator):
responses are prepared once per prompt and cached, and nothing is logged per request.
"""

import asyncio
import concurrent.futures
import hashlib
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer
from resources.simulator.config import ProviderEndpoint, SimulatorConfig
from resources.simulator.faults import UNBILLED_FAULTS, FaultConfig
from resources.simulator.responses import (
    ChatRequest,
    Completion,
    KimiStyleGenerator,
    PreparedResponse,
    ResponseCache,
    ResponseGenerator,
    TokenAccountant,
)
from resources.simulator.state import SimulatorState
from resources.simulator.wire import answer, error_body, seconds_header

PROCESSING = b": OPENROUTER PROCESSING\n\n"
_SPACE_DRAW = 1 << 32


@dataclass(slots=True)
class Attempt:
    """One answer under way, once its generation id exists; recorded at most once (``recorded``), so an answer
    settled before its client went away is not billed again by the disconnect that follows."""

    gen_id: str
    req: ChatRequest
    prepared: PreparedResponse
    provider: ProviderEndpoint
    started: float
    streamed: bool
    billable: bool
    recorded: bool = False


class ChatCore:
    """State and helpers of the chat route; one instance per app, sharing the ``SimulatorState``."""

    def __init__(self, config: SimulatorConfig, state: SimulatorState, generator: ResponseGenerator | None) -> None:
        self.config = config
        self.state = state
        self.accountant = TokenAccountant(load_kimi_tokenizer(config.tokenizer_dir))
        if generator is None and config.tiny_target_dir is not None:
            from resources.simulator.model_generator import tiny_target_generator  # imports torch

            generator = tiny_target_generator(config, self.accountant.tokenizer)
        self.generator: ResponseGenerator = generator or KimiStyleGenerator(
            config.seed, config.mean_completion_tokens, config.tool_call_probability
        )
        # A generator that blocks (a model forward) offers ``submit(request) -> concurrent Future``
        # and is awaited off the event loop; the template generator stays inline (no await, no thread).
        self._submit: Callable[[ChatRequest], concurrent.futures.Future[Completion]] | None = getattr(
            self.generator, "submit", None
        )
        self.cache = ResponseCache(config.cache_size)
        self._id_prefix = secrets.token_hex(4)
        self._counter = itertools.count(1)
        # A model-backed generator's text is the model's own output: it gets no leading spaces.
        self._leading_space_rate = config.leading_space_rate if self._submit is None else 0.0

    def _answer(self, status: int, outcome: str, payload: Any, headers: dict[str, str] | None = None) -> web.Response:
        """An error answer of the chat route: it names a generation id in its head too (recorded on 400, 402
        and 429), though nothing was generated (/generation does not know it)."""
        if self.config.generation_id_header:
            headers = {**(headers or {}), "X-Generation-Id": self._new_id()}
        return answer(self.state, status, outcome, payload, headers)

    def _id_header(self, gen_id: str) -> dict[str, str]:
        return {"X-Generation-Id": gen_id} if self.config.generation_id_header else {}

    def _new_id(self) -> str:
        return f"gen-{int(time.time())}-{self._id_prefix}{next(self._counter):010d}"

    @staticmethod
    def _cache_key(req: ChatRequest, exclude_reasoning: bool) -> tuple[Any, ...]:
        choice_key = req.tool_choice if isinstance(req.tool_choice, str | None) else orjson.dumps(req.tool_choice)
        return (req.content_hash, req.max_tokens, exclude_reasoning, choice_key)

    def _account(self, req: ChatRequest, completion: Completion, exclude_reasoning: bool) -> PreparedResponse:
        prompt_tokens = self.accountant.prompt_tokens(req.messages, req.tools)
        if self._leading_space_rate and self._draw("space", req.content_hash, self._leading_space_rate):
            # Some Kimi providers start both fields with a space; it is text like any other (counted, kept).
            completion = Completion(
                " " + completion.reasoning if completion.reasoning else "",
                " " + completion.content if completion.content else "",
                completion.tool_calls,
                completion.finish_reason,
            )
        return self.accountant.prepare(completion, prompt_tokens, req.max_tokens, exclude_reasoning)

    def _prepare(self, req: ChatRequest, exclude_reasoning: bool) -> PreparedResponse:
        key = self._cache_key(req, exclude_reasoning)
        prepared = self.cache.get(key)
        if prepared is None:
            prepared = self._account(req, self.generator.generate(req), exclude_reasoning)
            self.cache.put(key, prepared)
        return prepared

    async def _prepare_off_loop(self, req: ChatRequest, exclude_reasoning: bool) -> PreparedResponse:
        assert self._submit is not None
        key = self._cache_key(req, exclude_reasoning)
        prepared = self.cache.get(key)
        if prepared is None:
            # Shielded: a client that gives up must not cancel a generation other requests share.
            completion = await asyncio.shield(asyncio.wrap_future(self._submit(req)))
            prepared = self._account(req, completion, exclude_reasoning)
            self.cache.put(key, prepared)
        return prepared

    def _draw(self, what: str, content_hash: str, rate: float) -> bool:
        """A fixed draw per prompt and purpose (text never depends on the attempt), true at ``rate``."""
        digest = hashlib.blake2b(f"{what}:{self.config.seed}:{content_hash}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") < rate * _SPACE_DRAW

    def _usage(self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int, cost: float) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cost": cost,
            "is_byok": False,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "cost_details": {"upstream_inference_cost": None},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens, "image_tokens": 0},
        }

    def _outside(self, candidates: list[ProviderEndpoint]) -> ProviderEndpoint | None:
        """An endpoint routing should have excluded, under a display name no candidate shares (a
        violation the client can see; one under a shared name is what pinning by tag prevents)."""
        names = {e.name.lower() for e in candidates}
        pool = [e for e in self.config.providers if e.name.lower() not in names and e.status == 0]
        return self.state.picker.choice(pool) if pool else None

    def _early_fault(self, fault: str, faults: FaultConfig, provider: ProviderEndpoint) -> web.Response:
        if fault == "inflight_402":
            return self._answer(
                402,
                fault,
                error_body(
                    402,
                    "Your in-flight spending budget is exhausted; retry when earlier requests finish",
                    {"limit_source": "openrouter_in_flight_budget"},
                ),
                {"Retry-After": "1"},
            )
        headers = None
        if fault == "rate_limit":
            headers = {
                "Retry-After": seconds_header(faults.retry_after_s),
                "X-RateLimit-Reset": str(int((time.time() + faults.retry_after_s) * 1000)),
            }
        return self._answer(
            429,
            fault,
            error_body(
                429,
                f"{provider.name} is temporarily rate-limited upstream. Please retry shortly.",
                {
                    "provider_name": provider.name,
                    "raw": f"{provider.slug}: rate limit exceeded",
                    "error_type": "rate_limit",
                },
            ),
            headers,
        )

    def _server_error(self, provider: ProviderEndpoint) -> web.Response:
        status = (500, 502, 503)[self.state.picker.randrange(3)]
        messages = {
            500: "Internal Server Error",
            502: "Provider returned an invalid response",
            503: "Provider is unavailable",
        }
        headers = {"Retry-After": "1"} if status == 503 else None
        return self._answer(
            status,
            "server_error",
            error_body(
                status,
                messages[status],
                {"provider_name": provider.name, "raw": "upstream error", "error_type": "provider_error"},
            ),
            headers,
        )

    def _latency(self, fault: str | None) -> float:
        if fault == "stall":
            return self.state.faults.stall_seconds
        return self.config.latency.draw(self.state.latency_rng)

    def _billable(self, fault: str | None, prepared: PreparedResponse) -> bool:
        if fault in UNBILLED_FAULTS:
            return False
        if fault == "truncated_json" and not self.state.faults.bill_truncated_json:
            return False
        return prepared.completion_tokens > 0

    def _record(
        self,
        attempt: Attempt,
        completion_tokens: int,
        reasoning_tokens: int,
        finish_reason: str,
        *,
        billed: bool,
        cancelled: bool = False,
        generation_s: float | None = None,
    ) -> float:
        """Make the attempt known to /generation, billed or not; the cost charged (0 if nothing).
        ``generation_s`` None: the time since the request arrived (an attempt cut short)."""
        attempt.recorded = True
        started = attempt.started
        return self.state.record_generation(
            attempt.gen_id,
            attempt.req.content_hash,
            attempt.provider,
            attempt.prepared.prompt_tokens,
            completion_tokens,
            reasoning_tokens,
            finish_reason,
            billed=billed,
            streamed=attempt.streamed,
            cancelled=cancelled,
            started=started,
            generation_s=time.monotonic() - started if generation_s is None else generation_s,
        )

    def _record_whole(self, attempt: Attempt, generation_s: float) -> dict[str, Any]:
        """Record the whole answer (billed if billable) and return the usage object that reports its cost."""
        prepared = attempt.prepared
        cost = self._record(
            attempt,
            prepared.completion_tokens,
            prepared.reasoning_tokens,
            prepared.finish_reason,
            billed=attempt.billable,
            generation_s=generation_s,
        )
        return self._usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.reasoning_tokens, cost)

    def _count_200(self, outcome: str) -> None:
        """Count an answer whose status went out as 200, whatever its body turned out to be."""
        st = self.state.stats
        st.by_outcome[outcome] += 1
        st.by_status["200"] += 1

    def _body(
        self, gen_id: str, provider: ProviderEndpoint, choice: dict[str, Any], usage: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": gen_id,
            "provider": provider.name,
            "model": self.config.model_permaslug,
            "object": "chat.completion",
            "created": int(time.time()),
            "choices": [choice],
            "system_fingerprint": None,
            "usage": usage,
        }

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        """Close the TCP connection without a byte of response, like a crashed edge node."""
        st = self.state.stats
        st.by_outcome["drop_connection"] += 1
        st.by_status["none"] += 1
        transport = request.transport
        if transport is not None:
            transport.abort()
        # The aborted connection cancels this handler (handler_cancellation); should a runner
        # without it host the app, the error raised below goes nowhere either.
        await asyncio.sleep(5)
        raise ConnectionResetError("simulated dropped connection")

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    async def _sleep_writing(self, resp: web.StreamResponse, seconds: float, filler: bytes) -> None:
        """Wait, sending ``filler`` now and then as OpenRouter does while it generates: a newline padding a
        non-streaming body, a ``PROCESSING`` comment in a stream."""
        interval = self.config.processing_comment_interval_s
        while seconds > 0:
            step = min(interval, seconds)
            await asyncio.sleep(step)
            seconds -= step
            if seconds > 0:
                await resp.write(filler)
