"""Reassemble an OpenRouter SSE stream into the non-streaming body, so one classifier handles both.

Per chunk the transport only appends bytes and notes whether a ``data:`` event arrived (stall
detection) and, until it is known, the generation id (OpenRouter puts ``"id":"gen-…"`` in every
chunk, so the first one names the generation). Parsing happens once, at the end: the data payloads
are joined into one JSON array and decoded by a single ``orjson.loads``. That keeps streaming within
a few percent of plain mode in CPU per request (``benchmarks/bench_transport.py --variants
engine,engine-stream``), where parsing every chunk as it arrives would not be.

Stream shapes handled (``tests/fixtures/openrouter/*.sse``): ``: OPENROUTER PROCESSING`` comments,
reasoning and content deltas (leading spaces kept exactly), tool-call deltas by index, a finish
chunk, a final usage chunk with ``choices: []``, ``data: [DONE]``, and an error chunk (top-level
``error`` plus ``finish_reason: "error"``) mid-stream.
"""

from dataclasses import dataclass
from typing import Any

import orjson

from resources.openrouter.outcomes import generation_id_from_prefix


@dataclass(frozen=True)
class AssembledStream:
    body: dict[str, Any] | None  # the non-streaming shape; None when nothing usable arrived
    complete: bool  # ``[DONE]`` or a finish reason was seen: the stream was not cut off
    generation_id: str | None


class SSEAssembler:
    """Feed raw bytes as they arrive; ``finish()`` builds the body."""

    __slots__ = ("_parts", "_size", "generation_id")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.generation_id: str | None = None

    def feed(self, data: bytes) -> bool:
        """Keep ``data``; True when it holds a data event (comments alone do not prove progress)."""
        self._parts.append(data)
        has_data = b"data:" in data
        if has_data and self.generation_id is None and self._size < 65536:
            self.generation_id = generation_id_from_prefix(b"".join(self._parts))
        self._size += len(data)
        return has_data

    def finish(self) -> AssembledStream:
        return assemble_sse(b"".join(self._parts), self.generation_id)


def _payloads(text: bytes) -> tuple[list[bytes], bool]:
    out: list[bytes] = []
    done = False
    for line in text.split(b"\n"):
        if not line.startswith(b"data:"):
            continue  # comments (":"), blank separators, event/id fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
        elif payload:
            out.append(payload)
    return out, done


def _decode(payloads: list[bytes]) -> tuple[list[Any], bool]:
    """All chunks in one loads; a torn last chunk (cut connection) is dropped and reported."""
    try:
        return orjson.loads(b"[" + b",".join(payloads) + b"]"), False
    except orjson.JSONDecodeError:
        chunks, torn = [], False
        for p in payloads:
            try:
                chunks.append(orjson.loads(p))
            except orjson.JSONDecodeError:
                torn = True
        return chunks, torn


def assemble_sse(text: bytes, generation_id: str | None = None) -> AssembledStream:
    payloads, done = _payloads(text)
    chunks, torn = _decode(payloads)
    head: dict[str, Any] = {}
    reasoning: list[str] = []
    content: list[str] = []
    tools: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    native: str | None = None
    usage: Any = None
    error: Any = None
    for c in chunks:
        if not isinstance(c, dict):
            continue
        if not head and c.get("id"):
            head = {k: c.get(k) for k in ("id", "provider", "model", "created", "system_fingerprint")}
        if c.get("usage"):
            usage = c["usage"]
        if isinstance(c.get("error"), dict):
            error = c["error"]
        for ch in c.get("choices") or ():
            d = ch.get("delta") or {}
            r = d.get("reasoning")
            if r is None:
                r = d.get("reasoning_content")
            if r:
                reasoning.append(r)
            t = d.get("content")
            if t:
                content.append(t)
            for call in d.get("tool_calls") or ():
                index = int(call.get("index") or 0)
                slot = tools.get(index)
                if slot is None:
                    slot = tools[index] = {
                        "id": None,
                        "index": index,
                        "type": "function",
                        "function": {"name": "", "arguments": ""},
                    }
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
                native = ch.get("native_finish_reason")
            if isinstance(ch.get("error"), dict):
                error = ch["error"]
    gen_id = generation_id or (head.get("id") if str(head.get("id") or "").startswith("gen-") else None)
    if not chunks:
        return AssembledStream(None, False, gen_id)
    produced = bool(reasoning or content or tools)
    base = {
        "id": head.get("id"),
        "provider": head.get("provider"),
        "model": head.get("model"),
        "object": "chat.completion",
        "created": head.get("created"),
    }
    if error is not None and not produced:
        # An error before any output (a rate limit, no provider): the error-body shape, so that its
        # code classifies it (congestion, credits...) rather than a generic mid-stream failure.
        return AssembledStream({**base, "error": error, "usage": usage}, True, gen_id)
    calls = [tools[i] for i in sorted(tools)]
    text = "".join(content)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if (text or not calls) else None,
        "reasoning": "".join(reasoning) if reasoning else None,
    }
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": "error" if error is not None else finish,
        "native_finish_reason": native,
        "message": message,
    }
    body: dict[str, Any] = {**base, "choices": [choice], "usage": usage}
    if error is not None:
        choice["error"] = error
        body["error"] = error
    complete = (done or finish is not None or error is not None) and not (torn and not done)
    return AssembledStream(body, complete, gen_id)
