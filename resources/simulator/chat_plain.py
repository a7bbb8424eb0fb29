"""The non-streaming answer of ``POST /chat/completions``: one JSON body after the latency, or a fault.

As OpenRouter does, the head (200, ``X-Generation-Id``) goes out at once and newlines pad the body
while the model runs (``plain_head_first``), so a client that times out in the padding still knows
the generation. A client that gives up on a non-streaming request is billed in full, as OpenRouter
bills it: the upstream generation ran to the end regardless.
"""

import asyncio

import orjson
from aiohttp import web

from resources.simulator.chat_core import Attempt, ChatCore
from resources.simulator.config import ProviderEndpoint
from resources.simulator.responses import ChatRequest, PreparedResponse
from resources.simulator.wire import JSON, error_body

# Faults whose status is decided before a provider ran: no early head for them.
_WHOLE_ANSWERS = frozenset({"server_error", "timeout_408"})


class PlainAnswer(ChatCore):
    async def _complete(
        self,
        request: web.Request,
        req: ChatRequest,
        prepared: PreparedResponse,
        provider: ProviderEndpoint,
        fault: str | None,
        started: float,
    ) -> web.StreamResponse:
        attempt = Attempt(self._new_id(), req, prepared, provider, started, False, self._billable(fault, prepared))
        delay = self._latency(fault)
        resp = await self._plain_wait(request, attempt, fault, delay)
        if fault == "server_error":
            return self._server_error(provider)
        if fault == "timeout_408":
            return self._answer(
                408,
                fault,
                error_body(
                    408, "Request timed out upstream", {"provider_name": provider.name, "error_type": "timeout"}
                ),
            )
        if fault == "drop_connection":
            if resp is not None:
                # The head named the generation: /generation knows the attempt (unbilled: no answer).
                self._record(attempt, 0, 0, prepared.finish_reason, billed=False, cancelled=True)
            return await self._drop(request)
        if fault == "error_body":
            return await self._plain_error_body(attempt, resp, delay)
        if fault == "finish_error":
            return await self._plain_finish_error(attempt, resp, delay)
        return await self._plain_completion(attempt, resp, fault, delay)

    async def _plain_wait(
        self, request: web.Request, attempt: Attempt, fault: str | None, delay: float
    ) -> web.StreamResponse | None:
        """Wait out the latency: errors decided before any provider ran come whole afterwards, with their own
        status (None); every other answer starts with its head (200 and the generation id), returned here,
        and pads with whitespace while "generating"."""
        resp: web.StreamResponse | None = None
        try:
            if self.config.plain_head_first and fault not in _WHOLE_ANSWERS:
                resp = web.StreamResponse(headers={"Content-Type": JSON, **self._id_header(attempt.gen_id)})
                await resp.prepare(request)
                await self._sleep_writing(resp, delay, b"\n")
            elif delay > 0:
                await asyncio.sleep(delay)
        except (asyncio.CancelledError, ConnectionError):
            self._plain_abandoned(attempt, head_sent=resp is not None)
            raise
        return resp

    def _plain_abandoned(self, attempt: Attempt, *, head_sent: bool) -> None:
        """The client gave up: billed in full (module docstring). Once the head named the generation,
        /generation knows it even unbilled: a client that noted the id must be able to settle it."""
        if self.state.stopping or not (attempt.billable or head_sent):
            return
        billed = attempt.billable
        prepared = attempt.prepared
        self._record(
            attempt,
            prepared.completion_tokens if billed else 0,
            prepared.reasoning_tokens if billed else 0,
            prepared.finish_reason,
            billed=billed,
            cancelled=True,
        )
        if billed:
            self.state.stats.by_outcome["abandoned"] += 1

    async def _plain_error_body(
        self, attempt: Attempt, resp: web.StreamResponse | None, delay: float
    ) -> web.StreamResponse:
        """A 200 whose body is an error object."""
        code: int | str = (502, "502", 503)[self.state.picker.randrange(3)]
        payload = error_body(
            code,
            "Upstream error from provider",
            {"provider_name": attempt.provider.name, "raw": "connection reset", "error_type": "provider_error"},
        )
        if resp is None:
            return self._answer(200, "error_body", payload, self._id_header(attempt.gen_id) or None)
        # The head named the generation: /generation knows it (no output, not billed).
        self._record(attempt, 0, 0, "error", billed=False, generation_s=delay)
        return await self._finish(resp, "error_body", orjson.dumps(payload))

    async def _plain_finish_error(
        self, attempt: Attempt, resp: web.StreamResponse | None, delay: float
    ) -> web.StreamResponse:
        """Half the content, then the provider failed: a choice with ``finish_reason: error``."""
        prepared, provider = attempt.prepared, attempt.provider
        done_tokens = prepared.completion_tokens // 2
        # Billed: output was produced, and only zero-completion answers are free.
        self._record(attempt, done_tokens, prepared.reasoning_tokens, "error", billed=True, generation_s=delay)
        # The recorded shape says ``cost: 0`` beside the partial output; /generation has what was billed.
        message = {**prepared.message, "content": prepared.content[: len(prepared.content) // 2]}
        message.pop("tool_calls", None)
        body = self._body(
            attempt.gen_id,
            provider,
            {
                "logprobs": None,
                "finish_reason": "error",
                "native_finish_reason": "error",
                "index": 0,
                "message": message,
                "error": {
                    "code": 502,
                    "message": "Provider disconnected mid-generation",
                    "metadata": {"provider_name": provider.name},
                },
            },
            self._usage(prepared.prompt_tokens, done_tokens, prepared.reasoning_tokens, 0.0),
        )
        if resp is None:
            return self._answer(200, "finish_error", body, self._id_header(attempt.gen_id) or None)
        return await self._finish(resp, "finish_error", orjson.dumps(body))

    async def _plain_completion(
        self, attempt: Attempt, resp: web.StreamResponse | None, fault: str | None, delay: float
    ) -> web.StreamResponse:
        """The whole answer, billed; truncated or padded by the faults that damage only its body."""
        prepared = attempt.prepared
        usage = self._record_whole(attempt, delay)
        data = orjson.dumps(self._body(attempt.gen_id, attempt.provider, prepared.choice, usage))
        if fault == "truncated_json":
            data = data[: len(data) // 2]
        elif fault == "whitespace_padding":
            data = (b"\n", b"\n\n", b"   \n", b"\n \n  ")[self.state.picker.randrange(4)] + data
        outcome = "ok" if fault is None else fault
        if resp is not None:
            return await self._finish(resp, outcome, data)
        self._count_200(outcome)
        return web.Response(body=data, content_type=JSON, headers=self._id_header(attempt.gen_id) or None)

    async def _finish(self, resp: web.StreamResponse, outcome: str, data: bytes) -> web.StreamResponse:
        """The body after an early head and its padding."""
        self._count_200(outcome)
        await resp.write(data)
        await resp.write_eof()
        return resp
