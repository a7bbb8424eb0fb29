"""Token ids of a rendered Kimi chat, with a choice of what special-token text in the data becomes.

The chat is rendered as the real tokenizer's ``apply_chat_template`` renders it (the tools
deep-sorted and declared in TypeScript, see :mod:`eagle_assets.tokenization.tool_declaration`),
then cut into ordinary pieces and special ids (:mod:`eagle_assets.tokenization.segments`). What a
literal ``<|im_end|>``, ``<think>`` or ``[EOS]`` typed into a message or a tool becomes is the
``data_specials`` choice:

- ``"special"`` (the default): its special id. This is what vLLM and SGLang do: they tokenize the
  rendered prompt with every special allowed, so the target saw the id, and its hidden states and
  the draft must be computed on it.
- ``"ordinary"``: ordinary text, for data sent to a server that sanitizes such text itself. Encoding
  the rendered string ordinarily would break the template's own markers, and splitting it at data
  boundaries would not be exact either (tiktoken pre-tokenizes each special-free stretch as a whole,
  so ``"## Return of "`` then the tool id, ``"\\n"`` then content must stay one stretch). So the
  string is cut only at special tokens, exactly as ``encode(allowed_special="all")`` cuts it, and a
  match is skipped when it overlaps text that came from the data. Data strings are located by
  rendering a copy in which each string that *could* contribute to a special (it contains a first
  or last character of one, e.g. ``<``/``>``/``[``/``]``) is wrapped in two Unicode noncharacters.
  That copy is checked against the plain render (identical once the markers are removed), so a
  template that transforms data (slicing, escaping) fails loudly instead of silently mis-tokenizing.
  Chats whose data holds none of those characters skip the second render.

Both choices give the same ids when no data string contains special-token text.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast, get_args

from eagle_assets.errors import TargetError
from eagle_assets.settings import DataSpecials, current_settings
from eagle_assets.tokenization.chat_template import Message, normalize_messages, render_normalized
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer
from eagle_assets.tokenization.segments import (
    Segment,
    chunk_ordinary,
    encode_segments,
    serving_segments,
    specials_of,
    split_at_specials,
)
from eagle_assets.tokenization.tool_declaration import declare_tools

__all__ = [
    "DATA_SPECIALS",
    "ChatEncodingError",
    "DataSpecials",
    "Segment",
    "chat_segments",
    "check_data_specials",
    "configured_data_specials",
    "encode_chat",
    "encode_segments",
    "render_kimi_chat",
    "split_at_specials",
]

DATA_SPECIALS: tuple[str, ...] = get_args(DataSpecials)

# Values the template compares against literals ("role" == "user", content "type" == "text"); marking
# them would break those comparisons, and they never carry free text.
_STRUCTURAL_KEYS = frozenset({"role", "type"})
# Noncharacters: never assigned, so real text essentially never holds them; a pair absent from the data is chosen.
_MARKER_PAIRS = tuple((chr(0xFDD0 + 2 * i), chr(0xFDD1 + 2 * i)) for i in range(16))


class ChatEncodingError(TargetError, ValueError):
    """The template changed data text, so data specials could not be told apart from template specials."""


class _Marker:
    """Wraps data strings that could take part in a special token; remembers whether any did."""

    def __init__(self, edge_chars: re.Pattern[str], open_: str, close: str) -> None:
        self.edge_chars = edge_chars
        self.open = open_
        self.close = close
        self.marked = False
        self.collision = False

    def string(self, s: str) -> str:
        if self.open in s or self.close in s:
            self.collision = True
        if self.edge_chars.search(s):
            self.marked = True
            return f"{self.open}{s}{self.close}"
        return s

    def value(self, obj: Any, names_are_data: bool = False) -> Any:
        if isinstance(obj, str):
            return self.string(obj)
        if isinstance(obj, Mapping):
            out = {}
            for key, val in obj.items():
                new_key = self.string(key) if names_are_data and isinstance(key, str) else key
                if key in _STRUCTURAL_KEYS and isinstance(val, str):
                    out[new_key] = val
                else:
                    # JSON-schema property names are user text, rendered by tojson like any value.
                    out[new_key] = self.value(val, names_are_data=key == "properties" and isinstance(val, Mapping))
            return out
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


def _unmark(marked: str, open_: str, close: str) -> tuple[str, list[tuple[int, int]]]:
    """Strip the markers; return the clean text and the data spans in clean coordinates."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    depth = 0
    clean_len = 0
    span_start = 0
    pos = 0
    for m in re.finditer(f"[{open_}{close}]", marked):
        chunk = marked[pos : m.start()]
        parts.append(chunk)
        clean_len += len(chunk)
        pos = m.end()
        if m.group() == open_:
            if depth == 0:
                span_start = clean_len
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                raise ChatEncodingError("the chat template split a data string (unbalanced markers)")
            if depth == 0 and clean_len > span_start:
                spans.append((span_start, clean_len))
    if depth != 0:
        raise ChatEncodingError("the chat template cut a data string short (unbalanced markers)")
    parts.append(marked[pos:])
    return "".join(parts), spans


def check_data_specials(value: str) -> DataSpecials:
    """``value`` if it names a ``DataSpecials`` choice; a typo must not silently pick the other one."""
    if value not in DATA_SPECIALS:
        raise ValueError(f"data_specials must be one of {DATA_SPECIALS}, got {value!r}")
    return cast(DataSpecials, value)  # proven by the membership test above


def configured_data_specials() -> DataSpecials:
    """The pipeline's choice: ``$EAGLE_FORGE_DATA_SPECIALS``, else ``"special"`` (what vLLM/SGLang do).

    One setting read by the tokenized assets and the simulator alike, so that a pipeline set up for
    a sanitizing server rebuilds and counts prompts the same way everywhere.
    """
    return current_settings().data_specials


def _kimi_inputs(
    messages: Sequence[Message], tools: Sequence[Any] | None, kwargs: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[Any] | None, dict[str, Any]]:
    """Messages, tools and template variables as the real tokenizer's ``apply_chat_template`` passes them."""
    declaration = declare_tools(tools)
    return normalize_messages(messages), declaration.tools, {**kwargs, **declaration.template_kwargs()}


def render_kimi_chat(
    template: str,
    messages: Sequence[Message],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """The text the serving stack tokenizes: HF rendering of the tools' TypeScript declaration and the chat."""
    normalized, declared, variables = _kimi_inputs(messages, tools, kwargs)
    return render_normalized(template, normalized, declared, add_generation_prompt, variables)


def chat_segments(
    tokenizer: KimiTokenizer,
    messages: Sequence[Message],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    *,
    chat_template: str | None = None,
    data_specials: DataSpecials = "special",
    **kwargs: Any,
) -> list[Segment]:
    """The rendered chat as ordinary-text pieces and special ids (see module docstring); ``kwargs`` are template
    variables treated as data (like ``tools_ts_str``, set from ``tools`` when they convert)."""
    check_data_specials(data_specials)
    template = chat_template or tokenizer.chat_template
    if template is None:
        raise ValueError("the tokenizer has no chat template; pass chat_template=")
    normalized, declared, variables = _kimi_inputs(messages, tools, kwargs)
    plain = render_normalized(template, normalized, declared, add_generation_prompt, variables)
    if data_specials == "special":
        return serving_segments(tokenizer, plain)
    sp = specials_of(tokenizer)
    for open_, close in _MARKER_PAIRS:
        marker = _Marker(sp.edge_chars, open_, close)
        marked_messages = marker.value(normalized)
        marked_tools = None if declared is None else marker.value(declared)
        marked_variables = marker.value(variables)
        if not marker.collision:
            break
    else:
        raise ChatEncodingError("the data contains every candidate marker character")
    if not marker.marked:
        return chunk_ordinary(split_at_specials(tokenizer, plain))
    marked = render_normalized(template, marked_messages, marked_tools, add_generation_prompt, marked_variables)
    clean, spans = _unmark(marked, marker.open, marker.close)
    if clean != plain:
        raise ChatEncodingError("the chat template transforms data text; cannot locate data specials exactly")
    return chunk_ordinary(split_at_specials(tokenizer, clean, spans))


def encode_chat(tokenizer: KimiTokenizer, *args: Any, **kwargs: Any) -> list[int]:
    """Token ids of the rendered chat (``chat_segments``'s arguments); with the default ``data_specials`` they are
    what the serving stack's tokenizer produces for ``render_kimi_chat(...)``."""
    return encode_segments(tokenizer, chat_segments(tokenizer, *args, **kwargs))
