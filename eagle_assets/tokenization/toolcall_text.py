"""Parse Kimi tool calls that a provider left as raw text inside ``content``.

When a provider's tool parser fails (or is off), the model's tool-call section reaches us as text:
``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}
<|tool_call_end|>...<|tool_calls_section_end|>``. The model generated those markers as special ids,
so reconstruction must turn them back into ids instead of encoding the marker text. Parsing follows
vLLM's ``kimi_k2`` parser in what it tolerates: missing section markers, the singular
``<|tool_call_section_begin|>`` spelling, whitespace between calls, ids without the ``functions.``
prefix. A call cut off by ``finish_reason == "length"`` is returned unparsed in ``rest``.
"""

import re
from dataclasses import dataclass, field
from typing import Any

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

# Singular spellings appear in the wild (vLLM accepts them); they map to the real special tokens.
_SECTION_BEGIN_ALIASES = (SECTION_BEGIN, "<|tool_call_section_begin|>")
_SECTION_END_ALIASES = (SECTION_END, "<|tool_call_section_end|>")
_FIRST_MARKER = re.compile("|".join(map(re.escape, (*_SECTION_BEGIN_ALIASES, CALL_BEGIN))))
_TOOL_ID = re.compile(r"^\s*(?:functions\.)?(?P<name>.+?):(?P<index>\d+)\s*$", re.DOTALL)


@dataclass(frozen=True)
class ParsedToolText:
    """``content`` is the text before the first tool marker; ``rest`` what follows the parsed section."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    rest: str = ""
    had_section_begin: bool = False
    had_section_end: bool = False

    @property
    def truncated(self) -> bool:
        """A call was started but not finished (typically ``finish_reason == "length"``)."""
        return self.rest.lstrip().startswith(CALL_BEGIN)


def contains_tool_markup(text: str | None) -> bool:
    return text is not None and _FIRST_MARKER.search(text) is not None


def function_name_from_id(tool_id: str) -> str:
    """``functions.get_weather:0`` → ``get_weather``; ids in other shapes are returned stripped."""
    m = _TOOL_ID.match(tool_id)
    return m.group("name") if m else tool_id.strip()


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _starts_with_any(text: str, pos: int, options: tuple[str, ...]) -> str | None:
    return next((o for o in options if text.startswith(o, pos)), None)


def parse_tool_text(text: str) -> ParsedToolText:
    """Split ``text`` into leading content, structured OpenAI-style tool calls, and what is left."""
    first = _FIRST_MARKER.search(text)
    if first is None:
        return ParsedToolText(content=text)
    content = text[: first.start()]
    pos = first.start()
    had_begin = False
    if (alias := _starts_with_any(text, pos, _SECTION_BEGIN_ALIASES)) is not None:
        had_begin = True
        pos += len(alias)
    calls: list[dict[str, Any]] = []
    while True:
        start = _skip_ws(text, pos)
        if not text.startswith(CALL_BEGIN, start):
            break
        id_start = start + len(CALL_BEGIN)
        arg_marker = text.find(ARGUMENT_BEGIN, id_start)
        end_marker = text.find(CALL_END, id_start)
        if arg_marker < 0 or end_marker < 0 or end_marker < arg_marker:
            break  # truncated or malformed call: left in ``rest`` for faithful encoding
        tool_id = text[id_start:arg_marker]
        arguments = text[arg_marker + len(ARGUMENT_BEGIN) : end_marker]
        calls.append(
            {
                "id": tool_id,
                "type": "function",
                "function": {"name": function_name_from_id(tool_id), "arguments": arguments},
            }
        )
        pos = end_marker + len(CALL_END)
    had_end = False
    after = _skip_ws(text, pos)
    if (alias := _starts_with_any(text, after, _SECTION_END_ALIASES)) is not None:
        had_end = True
        pos = after + len(alias)
    return ParsedToolText(
        content=content,
        tool_calls=calls,
        rest=text[pos:],
        had_section_begin=had_begin,
        had_section_end=had_end,
    )
