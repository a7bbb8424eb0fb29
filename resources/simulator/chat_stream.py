"""The streamed answer of ``POST /chat/completions``: SSE chunks in OpenRouter's shapes, faults mid-stream.

``: OPENROUTER PROCESSING`` comments while waiting, reasoning and content deltas, a finish chunk, a
last usage chunk, ``data: [DONE]``; an error chunk with a top-level ``error`` mid-stream. A stream
the client abandons is billed for what was generated so far.
"""

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from resources.simulator.chat_core import PROCESSING, ChatCore
from resources.simulator.config import ProviderEndpoint
from resources.simulator.responses import ChatRequest, PreparedResponse
from resources.simulator.wire import error_body

_DONE = b"data: [DONE]\n\n"


class StreamAnswer(ChatCore):
    async def _stream(
        self,
        request: web.Request,
        req: ChatRequest,
        prepared: PreparedResponse,
        provider: ProviderEndpoint,
        fault: str | None,
        started: float,
    ) -> web.StreamResponse:
        state = self.state
        cfg = self.config
        if fault == "server_error":
            await self._sleep(self._latency(None))
            return self._server_error(provider)
        if fault == "timeout_408":
            await self._sleep(self._latency(None))
            return self._answer(
                408, fault, error_body(408, "Request timed out upstream", {"provider_name": provider.name})
            )
        gen_id = self._new_id()
        created = int(time.time())
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **self._id_header(gen_id)}
        )
        await resp.prepare(request)
        deltas = prepared.stream_deltas(cfg.stream_chunks)
        billable = self._billable(fault, prepared)
        total_delay = self._latency(None)
        sent = 0
        base = {
            "id": gen_id,
            "provider": provider.name,
            "model": cfg.model_permaslug,
            "object": "chat.completion.chunk",
            "created": created,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            payload = {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "finish_reason": finish,
                        "native_finish_reason": finish,
                        "logprobs": None,
                    }
                ],
                **extra,
            }
            return b"data: " + orjson.dumps(payload) + b"\n\n"

        try:
            await resp.write(PROCESSING)
            if fault == "whitespace_padding":
                await resp.write(PROCESSING)
            if fault == "stall":
                await asyncio.sleep(state.faults.stall_seconds)
            await self._sleep_with_comments(resp, total_delay * 0.3)
            per_chunk = total_delay * 0.7 / max(1, len(deltas))
            cut = (
                len(deltas) // 2
                if fault in ("drop_connection", "finish_error", "error_body", "truncated_json")
                else None
            )
            for i, delta in enumerate(deltas):
                if cut is not None and i == cut:
                    break
                if per_chunk > 0:
                    await asyncio.sleep(per_chunk)
                await resp.write(chunk(delta))
                sent += 1
            if fault == "drop_connection":
                # The id went out with the first chunk: /generation knows the attempt (unbilled: no answer).
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    prepared.completion_tokens * sent // max(1, len(deltas)),
                    prepared.reasoning_tokens,
                    prepared.finish_reason,
                    billed=False,
                    streamed=True,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                sent = len(deltas) + 1  # settled above: the disconnect below must not bill it again
                return await self._drop(request)
            if fault == "truncated_json":
                if billable:
                    state.record_generation(
                        gen_id,
                        req.content_hash,
                        provider,
                        prepared.prompt_tokens,
                        prepared.completion_tokens,
                        prepared.reasoning_tokens,
                        prepared.finish_reason,
                        billed=True,
                        streamed=True,
                        cancelled=False,
                        started=started,
                        generation_s=total_delay,
                    )
                line = chunk(deltas[min(sent, len(deltas) - 1)])
                await resp.write(line[: len(line) // 2])
                state.stats.by_outcome[fault] += 1
                state.stats.by_status["200"] += 1
                transport = request.transport
                if transport is not None:
                    transport.abort()
                return resp
            if fault in ("finish_error", "error_body"):
                done_tokens = prepared.completion_tokens * sent // max(1, len(deltas))
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    done_tokens,
                    prepared.reasoning_tokens,
                    "error",
                    billed=True,  # billed for the output produced before the error (no usage chunk says so)
                    streamed=True,
                    cancelled=False,
                    started=started,
                    generation_s=total_delay,
                )
                err = error_body(502, "Provider disconnected mid-generation", {"provider_name": provider.name})
                await resp.write(chunk({"role": "assistant", "content": ""}, "error", **err))
                await resp.write(_DONE)
                state.stats.by_outcome[fault] += 1
                state.stats.by_status["200"] += 1
                await resp.write_eof()
                return resp
            cost = state.record_generation(
                gen_id,
                req.content_hash,
                provider,
                prepared.prompt_tokens,
                prepared.completion_tokens,
                prepared.reasoning_tokens,
                prepared.finish_reason,
                billed=billable,
                streamed=True,
                cancelled=False,
                started=started,
                generation_s=total_delay,
            )
            sent = len(deltas) + 1  # billed in full from here on
            usage = self._usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.reasoning_tokens, cost)
            await resp.write(chunk({"role": "assistant", "content": ""}, prepared.finish_reason))
            # Usage comes last, in a chunk of its own: most recorded streams repeat the finish choice there,
            # the others send ``choices: []`` (a fixed draw per prompt, as text never depends on the attempt).
            if self._draw("usage-choice", req.content_hash, cfg.usage_chunk_with_choice_rate):
                last = chunk({"role": "assistant", "content": ""}, prepared.finish_reason, usage=usage)
            else:
                last = b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
            await resp.write(last + _DONE)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            if sent <= len(deltas) and not state.stopping:
                # A cancelled stream is billed for what was generated so far. Its id went out with the head, so
                # /generation knows it whether or not it was billed (an unbillable fault at 0), as OpenRouter's
                # does: a client that noted the id must be able to settle it.
                done = prepared.completion_tokens * sent // max(1, len(deltas))
                state.record_generation(
                    gen_id,
                    req.content_hash,
                    provider,
                    prepared.prompt_tokens,
                    done,
                    min(done, prepared.reasoning_tokens),
                    prepared.finish_reason,
                    billed=billable,
                    streamed=True,
                    cancelled=True,
                    started=started,
                    generation_s=time.monotonic() - started,
                )
                if billable:
                    state.stats.by_outcome["stream_abandoned"] += 1
            raise
        outcome = "ok" if fault is None else fault
        state.stats.by_outcome[outcome] += 1
        state.stats.by_status["200"] += 1
        return resp
