"""The streamed answer of ``POST /chat/completions``: SSE chunks in OpenRouter's shapes, faults mid-stream.

``: OPENROUTER PROCESSING`` comments while waiting, reasoning and content deltas, a finish chunk, a
last usage chunk, ``data: [DONE]``; an error chunk with a top-level ``error`` mid-stream. A stream
the client abandons is billed for what was generated so far.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from resources.simulator.chat_core import PROCESSING, Attempt, ChatCore
from resources.simulator.config import ProviderEndpoint
from resources.simulator.responses import ChatRequest, PreparedResponse
from resources.simulator.wire import error_body

_DONE = b"data: [DONE]\n\n"
# Faults that end a stream after half its deltas.
_CUT_SHORT = frozenset({"drop_connection", "finish_error", "error_body", "truncated_json"})
_EMPTY_DELTA: dict[str, Any] = {"role": "assistant", "content": ""}


class _Chunks:
    """The SSE lines of one stream: each repeats its id, provider, model and creation time."""

    __slots__ = ("base",)

    def __init__(self, gen_id: str, provider: str, model: str) -> None:
        self.base = {
            "id": gen_id,
            "provider": provider,
            "model": model,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
        }

    def choice(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        payload = {
            **self.base,
            "choices": [
                {"index": 0, "delta": delta, "finish_reason": finish, "native_finish_reason": finish, "logprobs": None}
            ],
            **extra,
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def usage_only(self, usage: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps({**self.base, "choices": [], "usage": usage}) + b"\n\n"


@dataclass(slots=True)
class _Progress:
    """How many deltas went out: what a stream cut short is billed for."""

    total: int
    sent: int = 0

    def share(self, tokens: int) -> int:
        return tokens * self.sent // max(1, self.total)


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
        if fault == "server_error":
            await self._sleep(self._latency(None))
            return self._server_error(provider)
        if fault == "timeout_408":
            await self._sleep(self._latency(None))
            return self._answer(
                408, fault, error_body(408, "Request timed out upstream", {"provider_name": provider.name})
            )
        attempt = Attempt(self._new_id(), req, prepared, provider, started, True, self._billable(fault, prepared))
        chunks = _Chunks(attempt.gen_id, provider.name, self.config.model_permaslug)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                **self._id_header(attempt.gen_id),
            }
        )
        await resp.prepare(request)
        deltas = prepared.stream_deltas(self.config.stream_chunks)
        total_delay = self._latency(None)
        progress = _Progress(len(deltas))
        try:
            await self._stream_wait(resp, fault, total_delay * 0.3)
            await self._stream_deltas(resp, chunks, deltas, progress, total_delay * 0.7, fault in _CUT_SHORT)
            if fault == "drop_connection":
                # The id went out with the first chunk: /generation knows the attempt (unbilled: no answer).
                done = progress.share(prepared.completion_tokens)
                self._record(
                    attempt, done, prepared.reasoning_tokens, prepared.finish_reason, billed=False, cancelled=True
                )
                return await self._drop(request)
            if fault == "truncated_json":
                return await self._stream_truncated(
                    request, resp, attempt, chunks, deltas[min(progress.sent, len(deltas) - 1)], total_delay
                )
            if fault in ("finish_error", "error_body"):
                return await self._stream_error_chunk(resp, attempt, chunks, progress, fault, total_delay)
            await self._stream_finish(resp, attempt, chunks, total_delay)
        except (asyncio.CancelledError, ConnectionError):
            self._stream_abandoned(attempt, progress)
            raise
        self._count_200("ok" if fault is None else fault)
        return resp

    async def _stream_wait(self, resp: web.StreamResponse, fault: str | None, seconds: float) -> None:
        """Processing comments before the first delta; a stall holds the stream open first."""
        await resp.write(PROCESSING)
        if fault == "whitespace_padding":
            await resp.write(PROCESSING)
        if fault == "stall":
            await asyncio.sleep(self.state.faults.stall_seconds)
        await self._sleep_writing(resp, seconds, PROCESSING)

    async def _stream_deltas(
        self,
        resp: web.StreamResponse,
        chunks: _Chunks,
        deltas: list[dict[str, Any]],
        progress: _Progress,
        seconds: float,
        cut_short: bool,
    ) -> None:
        """The deltas, ``seconds`` spread over them; a stream ``cut_short`` stops after half."""
        per_chunk = seconds / max(1, len(deltas))
        for delta in deltas[: len(deltas) // 2] if cut_short else deltas:
            if per_chunk > 0:
                await asyncio.sleep(per_chunk)
            await resp.write(chunks.choice(delta))
            progress.sent += 1

    async def _stream_truncated(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        attempt: Attempt,
        chunks: _Chunks,
        delta: dict[str, Any],
        total_delay: float,
    ) -> web.StreamResponse:
        """The upstream finished (billed, unless ``bill_truncated_json`` is off), but the connection breaks in
        the middle of a chunk."""
        prepared = attempt.prepared
        if attempt.billable:
            self._record(
                attempt,
                prepared.completion_tokens,
                prepared.reasoning_tokens,
                prepared.finish_reason,
                billed=True,
                generation_s=total_delay,
            )
        line = chunks.choice(delta)
        await resp.write(line[: len(line) // 2])
        self._count_200("truncated_json")
        transport = request.transport
        if transport is not None:
            transport.abort()
        return resp

    async def _stream_error_chunk(
        self,
        resp: web.StreamResponse,
        attempt: Attempt,
        chunks: _Chunks,
        progress: _Progress,
        fault: str,
        total_delay: float,
    ) -> web.StreamResponse:
        """The provider failed mid-generation: a chunk with a top-level ``error``, then ``[DONE]``."""
        prepared, provider = attempt.prepared, attempt.provider
        # Billed for the output produced before the error (no usage chunk says so).
        done = progress.share(prepared.completion_tokens)
        self._record(attempt, done, prepared.reasoning_tokens, "error", billed=True, generation_s=total_delay)
        err = error_body(502, "Provider disconnected mid-generation", {"provider_name": provider.name})
        await resp.write(chunks.choice(_EMPTY_DELTA, "error", **err))
        await resp.write(_DONE)
        self._count_200(fault)
        await resp.write_eof()
        return resp

    async def _stream_finish(
        self, resp: web.StreamResponse, attempt: Attempt, chunks: _Chunks, total_delay: float
    ) -> None:
        """The finish chunk, then usage in a last chunk of its own: billed in full from here on."""
        prepared = attempt.prepared
        usage = self._record_whole(attempt, total_delay)
        await resp.write(chunks.choice(_EMPTY_DELTA, prepared.finish_reason))
        # Most recorded streams repeat the finish choice in the usage chunk, the others send ``choices: []``
        # (a fixed draw per prompt, as text never depends on the attempt).
        if self._draw("usage-choice", attempt.req.content_hash, self.config.usage_chunk_with_choice_rate):
            last = chunks.choice(_EMPTY_DELTA, prepared.finish_reason, usage=usage)
        else:
            last = chunks.usage_only(usage)
        await resp.write(last + _DONE)
        await resp.write_eof()

    def _stream_abandoned(self, attempt: Attempt, progress: _Progress) -> None:
        """A stream its client left is billed for what was generated so far. Its id went out with the head, so
        /generation knows it even unbilled: a client that noted the id must be able to settle it."""
        if attempt.recorded or self.state.stopping:
            return
        prepared = attempt.prepared
        done = progress.share(prepared.completion_tokens)
        self._record(
            attempt,
            done,
            min(done, prepared.reasoning_tokens),
            prepared.finish_reason,
            billed=attempt.billable,
            cancelled=True,
        )
        if attempt.billable:
            self.state.stats.by_outcome["stream_abandoned"] += 1
