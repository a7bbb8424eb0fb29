"""Rebuild the exact token ids of a generated sample from the API's text fields.

The API returns text (``reasoning``, ``content``, ``tool_calls``), not the ids the target produced,
so the sample is rebuilt as the target saw it: the prompt rendered and tokenized as the serving
stack does it (K2.5 template with the generation prompt, history reasoning dropped, tools declared
in TypeScript, special-token text in the data as special ids unless ``data_specials="ordinary"``),
then the response appended piece by piece:

    encode_ordinary(reasoning) + </think> + encode_ordinary(content)
    + <|tool_calls_section_begin|> (<|tool_call_begin|> id <|tool_call_argument_begin|> args <|tool_call_end|>)*
    + <|tool_calls_section_end|> + <|im_end|>

Every piece boundary is a special token, and tiktoken pre-tokenizes each special-free stretch on
its own, so encoding the pieces separately is identical to encoding the rendered assistant turn
(the tests check this against the template). Text the model wrote stays ordinary even when it
looks like a special token: the model generated ordinary tokens there, whatever the prompt mode.
``finish_reason == "length"`` (or any reason other than a natural stop, see
``ENDED_FINISH_REASONS``) means the model never emitted ``<|im_end|>`` (nor ``</think>`` when it
was cut off while reasoning).

Limits that no text API can lift: the ids are the canonical BPE encoding of the returned text, so
a sampled non-canonical split, or whitespace a provider stripped, is not recovered.
"""

import gc
import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from eagle_assets.tokenization.chat_encoding import DataSpecials, Segment, chat_segments, encode_segments
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer
from eagle_assets.tokenization.toolcall_text import (
    ARGUMENT_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    ParsedToolText,
    contains_tool_markup,
    parse_tool_text,
)

THINK_END = "</think>"
IM_END = "<|im_end|>"
# Finish reasons after which the model itself ended its turn (so ``<|im_end|>`` was generated).
# Anything else ("length", "content_filter", "error", None) is treated as cut off: a missing
# end-of-turn only shortens a sample, a spurious one would teach the draft to end turns early.
ENDED_FINISH_REASONS = frozenset({"stop", "tool_calls", "function_call", "eos"})
_TOOL_MARKER_ALIASES = {
    SECTION_BEGIN: SECTION_BEGIN,
    "<|tool_call_section_begin|>": SECTION_BEGIN,
    SECTION_END: SECTION_END,
    "<|tool_call_section_end|>": SECTION_END,
    CALL_BEGIN: CALL_BEGIN,
    ARGUMENT_BEGIN: ARGUMENT_BEGIN,
    CALL_END: CALL_END,
}


@dataclass(frozen=True, slots=True)
class Reconstruction:
    """``loss_mask`` is 1 exactly on the response (``</think>`` and ``<|im_end|>`` included)."""

    input_ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    completion_len: int


def _get(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def _template_kwargs(record: Any) -> dict[str, Any]:
    return dict(_get(record, "chat_template_kwargs") or {})


def _history_tool_call_count(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def _is_native_tool_id(tool_id: Any) -> bool:
    # vLLM's kimi_k2 parser accepts ``[functions.]NAME:IDX``; anything else was invented by a provider.
    if not isinstance(tool_id, str):
        return False
    head, sep, idx = tool_id.rpartition(":")
    return bool(sep and head.strip() and idx.isdigit())


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    # What the template's ``tojson`` (HF semantics) renders for non-string arguments.
    return json.dumps(arguments, ensure_ascii=False)


def effective_tool_calls(tool_calls: Sequence[Mapping[str, Any]], prior_calls: int) -> list[dict[str, Any]]:
    """The calls as the model wrote them: string arguments, and Kimi ``functions.NAME:IDX`` ids.

    Providers may replace the model's ids (``call_abc123``); the model itself writes
    ``functions.NAME:IDX`` with IDX counting calls across the conversation (vLLM's convention), so
    such ids are rebuilt from that counter.
    """
    out = []
    for i, call in enumerate(tool_calls):
        fn = call.get("function") or {}
        tool_id = call.get("id")
        if not _is_native_tool_id(tool_id):
            tool_id = f"functions.{fn.get('name', '')}:{prior_calls + i}"
        out.append(
            {
                "id": tool_id if isinstance(tool_id, str) else "",
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name", ""), "arguments": _arguments_text(fn.get("arguments", ""))},
            }
        )
    return out


def tool_text_segments(tokenizer: KimiTokenizer, text: str) -> list[Segment]:
    """Raw tool-call text with only its markers as ids, everything else ordinary (faithful, for fragments)."""
    out: list[Segment] = []
    pos = 0
    while pos < len(text):
        hits = [(text.find(m, pos), m) for m in _TOOL_MARKER_ALIASES]
        hits = [(i, m) for i, m in hits if i >= 0]
        if not hits:
            break
        i, m = min(hits)
        if i > pos:
            out.append(text[pos:i])
        out.append(tokenizer.special_id(_TOOL_MARKER_ALIASES[m]))
        pos = i + len(m)
    if pos < len(text):
        out.append(text[pos:])
    return out


def _call_segments(tokenizer: KimiTokenizer, calls: Sequence[Mapping[str, Any]]) -> list[Segment]:
    sid = tokenizer.special_id
    out: list[Segment] = []
    for call in calls:
        out.append(sid(CALL_BEGIN))
        if call["id"]:
            out.append(call["id"])
        out.append(sid(ARGUMENT_BEGIN))
        if call["function"]["arguments"]:
            out.append(call["function"]["arguments"])
        out.append(sid(CALL_END))
    return out


def raw_tool_section(content: str | None, finish_reason: str | None) -> ParsedToolText | None:
    """The tool-call section a provider left in ``content`` as text, or None if it holds none.

    Marker text alone is not enough (a model may write about its own format): there must be a
    complete call with nothing but whitespace after the section (or ``finish_reason`` says tool
    calls), or a call cut off at the very end of a truncated response (``finish_reason == "length"``).
    """
    if not contains_tool_markup(content):
        return None
    parsed = parse_tool_text(content or "")
    if finish_reason not in ENDED_FINISH_REASONS and parsed.truncated:
        return parsed
    if parsed.tool_calls and (not parsed.rest.strip() or finish_reason == "tool_calls"):
        return parsed
    return None


def response_segments(tokenizer: KimiTokenizer, record: Any) -> list[Segment]:
    """The response as ordinary-text pieces and special ids, in generation order."""
    sid = tokenizer.special_id
    finish = _get(record, "finish_reason")
    cut_off = finish not in ENDED_FINISH_REASONS
    thinking_off = _template_kwargs(record).get("thinking") is False
    reasoning = _get(record, "reasoning") or ""
    content = _get(record, "content") or ""
    structured = list(_get(record, "tool_calls") or [])

    tool_part: list[Segment] = []
    if structured:
        prior = _history_tool_call_count(_get(record, "messages") or [])
        calls = effective_tool_calls(structured, prior)
        tool_part = [sid(SECTION_BEGIN), *_call_segments(tokenizer, calls), sid(SECTION_END)]
    elif (parsed := raw_tool_section(content, finish)) is not None:
        content = parsed.content
        # The section is written canonically, as the template renders it (both section markers, no
        # whitespace between or after calls); an unfinished call is kept as it came, markers as ids.
        tool_part = [sid(SECTION_BEGIN), *_call_segments(tokenizer, parsed.tool_calls)]
        if not parsed.truncated and (parsed.had_section_end or not cut_off):
            tool_part.append(sid(SECTION_END))
        rest = parsed.rest.lstrip() if parsed.truncated else parsed.rest
        if rest.strip():
            tool_part += tool_text_segments(tokenizer, rest)

    out: list[Segment] = []
    if not thinking_off:
        if reasoning:
            out.append(reasoning)
        if cut_off and not content and not tool_part:
            return out  # cut off inside the reasoning: no </think> was generated
        out.append(sid(THINK_END))
    if content:
        out.append(content)
    out += tool_part
    if not cut_off:
        out.append(sid(IM_END))
    return out


def prompt_segments(tokenizer: KimiTokenizer, record: Any, *, data_specials: DataSpecials = "special") -> list[Segment]:
    """The prompt exactly as the target received it: rendered with the generation prompt."""
    return chat_segments(
        tokenizer,
        _get(record, "messages") or [],
        _get(record, "tools") or None,
        add_generation_prompt=True,
        data_specials=data_specials,
        **_template_kwargs(record),
    )


def prompt_token_ids(
    tokenizer: KimiTokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    data_specials: DataSpecials = "special",
) -> list[int]:
    """The prompt ids of a request; ``len`` of it is what the serving stack bills as ``prompt_tokens``."""
    record = {"messages": messages, "tools": tools, "chat_template_kwargs": chat_template_kwargs}
    return encode_segments(tokenizer, prompt_segments(tokenizer, record, data_specials=data_specials))


def _assemble(
    prompt: Sequence[Segment], response: Sequence[Segment], encode: Callable[[str], list[int]]
) -> Reconstruction:
    # One output list, extended in place: at 10M tokens the intermediate lists and copies of a
    # prompt+response concatenation cost more than the Python bookkeeping around them.
    ids: list[int] = []
    for seg in prompt:
        if isinstance(seg, int):
            ids.append(seg)
        else:
            ids += encode(seg)
    p = len(ids)
    for seg in response:
        if isinstance(seg, int):
            ids.append(seg)
        else:
            ids += encode(seg)
    c = len(ids) - p
    mask = [1] * (p + c)
    mask[:p] = bytes(p)  # zeros, without a temporary list of p ints
    return Reconstruction(input_ids=ids, loss_mask=mask, prompt_len=p, completion_len=c)


def reconstruct(
    record: Any, tokenizer: KimiTokenizer | None = None, *, data_specials: DataSpecials = "special"
) -> Reconstruction:
    """One sample's ids and loss mask; ``completion_len`` is comparable to ``usage.completion_tokens``,
    ``prompt_len`` to ``usage.prompt_tokens``."""
    tok = tokenizer or load_kimi_tokenizer()
    prompt = prompt_segments(tok, record, data_specials=data_specials)
    response = response_segments(tok, record)
    return _assemble(prompt, response, tok.encoding.encode_ordinary)


def _encode_texts(tokenizer: KimiTokenizer, texts: list[str], num_threads: int) -> list[list[int]]:
    """Encode many texts, each distinct text once (system prompts and tool declarations repeat across a
    dataset); the returned lists may be shared, so callers copy from them."""
    index: dict[str, int] = {}
    slots = [index.setdefault(t, len(index)) for t in texts]
    encoded = _encode_distinct(tokenizer, list(index), num_threads)
    return [encoded[i] for i in slots]


def _encode_distinct(tokenizer: KimiTokenizer, texts: list[str], num_threads: int) -> list[list[int]]:
    """Encode many texts; threads only pay off when there is enough text per thread (tiktoken drops the GIL)."""
    enc = tokenizer.encoding.encode_ordinary
    total = sum(map(len, texts))
    if num_threads <= 1 or total < 1_000_000:
        return [enc(t) for t in texts]
    # Contiguous chunks of similar size keep per-task overhead low (one task per text is slower).
    n_chunks = num_threads * 4
    target = total / n_chunks
    bounds, acc, start = [], 0, 0
    for i, t in enumerate(texts):
        acc += len(t)
        if acc >= target:
            bounds.append((start, i + 1))
            start, acc = i + 1, 0
    if start < len(texts):
        bounds.append((start, len(texts)))

    def run(b: tuple[int, int]) -> list[list[int]]:
        return [enc(t) for t in texts[b[0] : b[1]]]

    with ThreadPoolExecutor(num_threads) as pool:
        return [ids for chunk in pool.map(run, bounds) for ids in chunk]


def reconstruct_batch(
    records: Sequence[Any],
    tokenizer: KimiTokenizer | None = None,
    *,
    num_threads: int | None = None,
    data_specials: DataSpecials = "special",
) -> list[Reconstruction]:
    """``[reconstruct(r) for r in records]``, with all ordinary text encoded in one threaded pass."""
    tok = tokenizer or load_kimi_tokenizer()
    threads = num_threads if num_threads is not None else min(4, os.cpu_count() or 1)
    gc_was_enabled = gc.isenabled()
    # Millions of freshly allocated id lists trigger repeated full collections that only rescan
    # them (measured: up to ~1.5x slower); nothing here creates reference cycles.
    gc.disable()
    try:
        plans: list[tuple[list[Segment], list[Segment]]] = []
        texts: list[str] = []
        for record in records:
            prompt = prompt_segments(tok, record, data_specials=data_specials)
            response = response_segments(tok, record)
            plans.append((prompt, response))
            texts.extend(s for s in prompt if isinstance(s, str))
            texts.extend(s for s in response if isinstance(s, str))
        encoded = iter(_encode_texts(tok, texts, threads))

        def next_encoded(_: str) -> list[int]:
            return next(encoded)

        return [_assemble(prompt, response, next_encoded) for prompt, response in plans]
    finally:
        if gc_was_enabled:
            gc.enable()
