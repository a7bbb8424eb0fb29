"""Token-exact encoding of a rendered chat: template specials become ids, data text never does.

Encoding the rendered string with every special allowed would turn a user's (or the model's)
literal ``<|im_end|>`` into the end-of-turn id; encoding it ordinarily would break the template's
own markers. Splitting the string at data boundaries instead is not exact either: tiktoken runs its
regex pre-tokenizer over each special-free stretch, so the text around a boundary (``"## Return of "``
then the tool id, ``"\\n"`` then content) would tokenize differently.

So the rendered string is cut only at special tokens, exactly as ``encode(allowed_special="all")``
cuts it, and a special-token match is skipped when it overlaps text that came from the data. Data
strings are located by rendering a copy in which each string that *could* contribute to a special
(it contains a first or last character of one, e.g. ``<``/``>``/``[``/``]``) is wrapped in two Unicode
noncharacters. That copy is checked against the plain render (it must be identical once the
markers are removed), so a template that transforms data (slicing, escaping) fails loudly instead of
silently mis-tokenizing. Chats whose data contains none of those characters (most of them) skip the
second render and are, by construction, ``encode_with_special(render_chat(...))``.
"""

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eagle_assets.tokenization.chat_template import Message, normalize_messages, render_normalized
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer

Segment = str | int
"""A piece of an encoded chat: ``str`` is ordinary text (encode with ``encode_ordinary``), ``int`` a special id."""

# Values the template compares against literals ("role" == "user", content "type" == "text"); marking
# them would break those comparisons, and they never carry free text.
_STRUCTURAL_KEYS = frozenset({"role", "type"})
# Noncharacters: never assigned, so real text essentially never holds them; a pair absent from the data is chosen.
_MARKER_PAIRS = tuple((chr(0xFDD0 + 2 * i), chr(0xFDD1 + 2 * i)) for i in range(16))


class ChatEncodingError(ValueError):
    """The template changed data text, so data specials could not be told apart from template specials."""


@dataclass(frozen=True)
class _Specials:
    pattern: re.Pattern[str]
    ids: dict[str, int]
    edge_chars: re.Pattern[str]


def _trie_pattern(words: Sequence[str]) -> str:
    """One regex for a set of literals, factored by common prefix.

    A flat 256-way alternation makes Python's ``re`` try every branch at each ``<``; the trie form
    fails on the first differing character (about 13x faster on prompts). No Kimi special is a
    prefix of another, so at any position at most one can match: the same cut points as tiktoken.
    """
    trie: dict[str, dict] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = "(?:" + "|".join(alts) + ")" if len(alts) > 1 else alts[0]
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


_SPECIALS_CACHE: dict[int, tuple[KimiTokenizer, _Specials]] = {}


def _specials(tokenizer: KimiTokenizer) -> _Specials:
    cached = _SPECIALS_CACHE.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    names = list(tokenizer.special_tokens)
    edges = sorted({n[0] for n in names} | {n[-1] for n in names})
    value = _Specials(
        pattern=re.compile(_trie_pattern(names)),
        ids=dict(tokenizer.special_tokens),
        edge_chars=re.compile("[" + "".join(map(re.escape, edges)) + "]"),
    )
    _SPECIALS_CACHE[id(tokenizer)] = (tokenizer, value)
    return value


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


def split_at_specials(tokenizer: KimiTokenizer, text: str, data_spans: Sequence[tuple[int, int]] = ()) -> list[Segment]:
    """Cut ``text`` where ``encode(allowed_special="all")`` would, except at matches overlapping ``data_spans``."""
    sp = _specials(tokenizer)
    starts = [s for s, _ in data_spans]
    out: list[Segment] = []
    pos = 0
    for m in sp.pattern.finditer(text):
        a, b = m.span()
        i = bisect.bisect_left(starts, b) - 1
        if i >= 0 and data_spans[i][1] > a:
            continue  # this special-looking text is (partly) data: it stays ordinary
        if a > pos:
            out.append(text[pos:a])
        out.append(sp.ids[m.group()])
        pos = b
    if pos < len(text):
        out.append(text[pos:])
    return out


def encode_segments(tokenizer: KimiTokenizer, segments: Sequence[Segment]) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        if isinstance(seg, int):
            ids.append(seg)
        else:
            ids.extend(tokenizer.encode_ordinary(seg))
    return ids


def chat_segments(
    tokenizer: KimiTokenizer,
    messages: Sequence[Message],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    *,
    chat_template: str | None = None,
    template_vars: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> list[Segment]:
    """The rendered chat as ordinary-text pieces and special ids (see module docstring).

    ``kwargs`` are template variables treated as data (e.g. ``tools_ts_str``); ``template_vars`` are
    trusted ones whose specials count as the template's (e.g. ``bos_token``).
    """
    template = chat_template or tokenizer.chat_template
    if template is None:
        raise ValueError("the tokenizer has no chat template; pass chat_template=")
    normalized = normalize_messages(messages)
    trusted = dict(template_vars or {})
    sp = _specials(tokenizer)
    for open_, close in _MARKER_PAIRS:
        marker = _Marker(sp.edge_chars, open_, close)
        marked_messages = marker.value(normalized)
        marked_tools = None if tools is None else marker.value(list(tools))
        marked_kwargs = marker.value(kwargs)
        if not marker.collision:
            break
    else:
        raise ChatEncodingError("the data contains every candidate marker character")
    plain = render_normalized(template, normalized, tools, add_generation_prompt, {**kwargs, **trusted})
    if not marker.marked:
        return split_at_specials(tokenizer, plain)
    marked = render_normalized(
        template, marked_messages, marked_tools, add_generation_prompt, {**marked_kwargs, **trusted}
    )
    clean, spans = _unmark(marked, marker.open, marker.close)
    if clean != plain:
        raise ChatEncodingError("the chat template transforms data text; cannot locate data specials exactly")
    return split_at_specials(tokenizer, clean, spans)


def encode_chat(
    tokenizer: KimiTokenizer,
    messages: Sequence[Message],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    *,
    chat_template: str | None = None,
    template_vars: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> list[int]:
    """Token ids of the rendered chat; equals ``encode_with_special(render_chat(...))`` unless data holds specials."""
    segments = chat_segments(
        tokenizer,
        messages,
        tools,
        add_generation_prompt,
        chat_template=chat_template,
        template_vars=template_vars,
        **kwargs,
    )
    return encode_segments(tokenizer, segments)
