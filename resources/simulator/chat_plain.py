"""The non-streaming answer of ``POST /chat/completions``: one JSON body after the latency, or a fault.

As OpenRouter does, the head (200, ``X-Generation-Id``) goes out at once and newlines pad the body
while the model runs (``plain_head_first``), so a client that times out in the padding still knows
the generation. A client that gives up on a non-streaming request is billed in full, as OpenRouter
bills it: the upstream generation ran to the end regardless.
"""

import asyncio
import time

import orjson
from aiohttp import web

from resources.simulator.chat_core import ChatCore
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
        state = self.state
        gen_id = self._new_id()
        billable = self._billable(fault, prepared)
        delay = self._latency(fault)
        # Errors decided before any provider ran come whole, with their own status; every other answer
        # starts with its head (200 and the generation id) and pads with whitespace while "generating".
        resp: web.StreamResponse | None = None
        try:
            if self.config.plain_head_first and fault not in _WHOLE_ANSWERS:
                resp = web.StreamResponse(headers={"Content-Type": JSON, **self._id_header(gen_id)})
                await resp.prepare(request)
                await self._sleep_with_padding(resp, delay)
            elif delay > 0:
                await asyncio.sleep(delay)
        except (asyncio.CancelledError, ConnectionError):
            # The client gave up: OpenRouter still bills a non-streaming request in full, because
            # the upstream generation ran to the end regardless. Once the head named the generation,
            # /generation knows it even when nothing is billed (a fault without output, at 0): a client
            # that noted the id must be able to settle it.
            if (billable or resp is not None) and not state.stopping:
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    prepared.completion_tokens if billable else 0,
                    prepared.reasoning_tokens if billable else 0,
                    prepared.finish_reason,
                    billed=billable,
                    streamed=False,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                if billable:
                    state.stats.by_outcome["abandoned"] += 1
            raise
        headers = self._id_header(gen_id) or None
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
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    0,
                    0,
                    prepared.finish_reason,
                    billed=False,
                    streamed=False,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
            return await self._drop(request)
        if fault == "error_body":
            code: int | str = (502, "502", 503)[state.picker.randrange(3)]
            payload = error_body(
                code,
                "Upstream error from provider",
                {"provider_name": provider.name, "raw": "connection reset", "error_type": "provider_error"},
            )
            if resp is None:
                return self._answer(200, fault, payload, headers)
            # The head named the generation: /generation knows it (no output, not billed).
            state.record_generation(
                gen_id,
                req.content_hash,
                provider,
                prepared.prompt_tokens,
                0,
                0,
                "error",
                billed=False,
                streamed=False,
                cancelled=False,
                started=started,
                generation_s=delay,
            )
            return await self._finish(resp, fault, orjson.dumps(payload))
        if fault == "finish_error":
            partial = prepared.content[: len(prepared.content) // 2]
            done_tokens = prepared.completion_tokens // 2
            state.record_generation(
                gen_id,
                req.content_hash,
                provider,
                prepared.prompt_tokens,
                done_tokens,
                prepared.reasoning_tokens,
                "error",
                billed=True,  # output was produced: only zero-completion answers are free
                streamed=False,
                cancelled=False,
                started=started,
                generation_s=delay,
            )
            # The recorded shape says ``cost: 0`` beside the partial output; /generation has what was billed.
            message = {**prepared.message, "content": partial}
            message.pop("tool_calls", None)
            body = self._body(
                gen_id,
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
                return self._answer(200, fault, body, headers)
            return await self._finish(resp, fault, orjson.dumps(body))

        cost = state.record_generation(
            gen_id,
            req.content_hash,
            provider,
            prepared.prompt_tokens,
            prepared.completion_tokens,
            prepared.reasoning_tokens,
            prepared.finish_reason,
            billed=billable,
            streamed=False,
            cancelled=False,
            started=started,
            generation_s=delay,
        )
        body = self._body(
            gen_id,
            provider,
            prepared.choice,
            self._usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.reasoning_tokens, cost),
        )
        data = orjson.dumps(body)
        outcome = "ok" if fault is None else fault
        if fault == "truncated_json":
            data = data[: len(data) // 2]
        elif fault == "whitespace_padding":
            data = (b"\n", b"\n\n", b"   \n", b"\n \n  ")[state.picker.randrange(4)] + data
        if resp is not None:
            return await self._finish(resp, outcome, data)
        st = state.stats
        st.by_outcome[outcome] += 1
        st.by_status["200"] += 1
        return web.Response(body=data, content_type=JSON, headers=headers)

    async def _finish(self, resp: web.StreamResponse, outcome: str, data: bytes) -> web.StreamResponse:
        """The body after an early head and its padding."""
        st = self.state.stats
        st.by_outcome[outcome] += 1
        st.by_status["200"] += 1
        await resp.write(data)
        await resp.write_eof()
        return resp
