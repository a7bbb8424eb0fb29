"""Reassemble an OpenRouter SSE stream into the non-streaming body, so one classifier handles both.

Parsed once, at the end, with no Python per text chunk, so thousands of chunks per answer cost about what one
non-streaming body does: the text deltas are cut out by regular expressions as the escaped JSON strings they are
and unescaped by one ``orjson.loads``, and only the few chunks that carry structure are decoded. The shapes
handled are the recordings in ``tests/fixtures/openrouter/*.sse``.
"""

import re
from dataclasses import dataclass
from typing import Any

import orjson

from resources.openrouter.outcomes import generation_id_from_prefix


@dataclass(frozen=True)
class AssembledStream:
    body: dict[str, Any] | None  # the non-streaming shape; None when nothing usable arrived
    complete: bool  # ``[DONE]`` or a finish reason was seen: the stream was not cut off
    generation_id: str | None


# Chunks that carry more than text are parsed whole (few: the first, tool calls, the finish, the
# usage, an error, the last); they are found by these markers, none of which a text chunk has.
_TAIL_MARKERS = (b'"finish_reason":"', b'"usage":{', b'"error":{')
_TOOL_CALLS = b'"tool_calls":['
_TAIL_LINES = 6
# Text deltas are taken as the escaped JSON strings they are, in order, and unescaped in one go: a
# literal ``"content":"`` cannot occur inside a JSON string (its quotes would be escaped).
_CONTENT = re.compile(rb'"content":"((?:[^"\\]++|\\.)*+)"')
_REASONING = re.compile(rb'"reasoning":"((?:[^"\\]++|\\.)*+)"')
_REASONING_ALT = re.compile(rb'"reasoning_content":"((?:[^"\\]++|\\.)*+)"')


def _text(pieces: list[bytes]) -> str:
    return orjson.loads(b'"' + b"".join(pieces) + b'"') if pieces else ""


def _decode(payloads: list[bytes]) -> tuple[list[Any], bool]:
    """The chunks in one loads; a torn one (cut connection) is dropped and reported."""
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


def _line(text: bytes, at: int) -> tuple[int, int]:
    start = text.rfind(b"\n", 0, at) + 1
    end = text.find(b"\n", at)
    return start, len(text) if end < 0 else end


def _picked(text: bytes) -> tuple[list[bytes], bool, bool]:
    """The structural chunks' payloads, in order; whether ``[DONE]`` came; whether any data came.

    Found by scanning for markers and taking the line around each (a raw newline cannot occur
    inside a JSON string, so a line is a chunk): no Python per text chunk. Finish, usage and
    errors end a stream, so they are looked for in its last lines only; tool calls anywhere.
    """
    first = 0 if text.startswith(b"data:") else text.find(b"\ndata:") + 1
    if first == 0 and not text.startswith(b"data:"):
        return [], False, False
    spans = {_line(text, first)}
    done = False
    tail_start = last = len(text)
    for _ in range(_TAIL_LINES):
        at = text.rfind(b"\ndata:", first, last)
        if at < 0:
            break
        span = _line(text, at + 1)
        if text[span[0] : span[1]].rstrip() == b"data: [DONE]":
            done = True
        else:
            spans.add(span)
        tail_start = last = at
    markers = [(m, tail_start) for m in _TAIL_MARKERS]
    if _TOOL_CALLS in text:
        markers.append((_TOOL_CALLS, 0))
    for marker, start in markers:
        at = text.find(marker, start)
        while at >= 0:
            span = _line(text, at)
            spans.add(span)
            at = text.find(marker, span[1])
    return [text[a + 5 : b] for a, b in sorted(spans)], done, True


def _merge_tool_call(tools: dict[int, dict[str, Any]], call: dict[str, Any]) -> None:
    """Fold one streamed tool-call delta into its slot: the id and name arrive once, the arguments in pieces."""
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


def assemble_sse(text: bytes) -> AssembledStream:
    picked, done, any_data = _picked(text)
    gen_id = generation_id_from_prefix(text)  # OpenRouter puts it in every chunk, the first included
    if not any_data:
        return AssembledStream(None, False, gen_id)
    chunks, torn = _decode(picked)
    head: dict[str, Any] = {}
    tools: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    native: str | None = None
    usage: Any = None
    error: Any = None
    for c in chunks:
        if not isinstance(c, dict):
            continue
        if not head and c.get("id"):
            head = {k: c.get(k) for k in ("id", "provider", "model", "created")}
        if c.get("usage"):
            usage = c["usage"]
        if isinstance(c.get("error"), dict):
            error = c["error"]
        for ch in c.get("choices") or ():
            d = ch.get("delta") or {}
            for call in d.get("tool_calls") or ():
                _merge_tool_call(tools, call)
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
                native = ch.get("native_finish_reason")
            if isinstance(ch.get("error"), dict):
                error = ch["error"]
    try:
        content = _text(_CONTENT.findall(text))
        reasoning = _text(_REASONING.findall(text) or _REASONING_ALT.findall(text))
    except orjson.JSONDecodeError:  # a broken escape: not an answer to keep
        return AssembledStream(None, False, gen_id)
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
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if (content or not calls) else None,
        "reasoning": reasoning or None,
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
