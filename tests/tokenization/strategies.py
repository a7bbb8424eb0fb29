"""Hypothesis strategies for chats and generated records, shared by the tokenization tests.

Text is built from fragments chosen to stress BPE and the template: whitespace runs, leading and
trailing newlines, CJK, emoji, code, digits, contractions, partial special-token text (``<|im_``),
and, when ``specials=True``, whole special-token strings that must stay ordinary text.
"""

import json
import re
from typing import Any

from hypothesis import strategies as st

SPECIAL_LOOKING = (
    "<|im_end|>",
    "</think>",
    "<think>",
    "<|im_start|>",
    "<|im_middle|>",
    "<|im_assistant|>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "[EOS]",
    "[PAD]",
    "<|reserved_token_163700|>",
)
PLAIN_FRAGMENTS = (
    "\n",
    "\n\n",
    "\r\n",
    " ",
    "   ",
    "\t",
    " \n ",
    "Hello",
    " world",
    "it's",
    "I'LL",
    "123456",
    "3.14",
    "你好，世界！",
    "日本語のテキスト",
    "😀",
    "👍🏽",
    "🇫🇷",
    "é",
    "e\u0301",
    "def f(x):\n    return x + 1\n",
    "```python\n",
    '{"a": [1, 2]}',
    "<b>bold</b>",
    "<|im_",
    "end|>",
    "|>",
    "<|",
    "[",
    "]",
    "<",
    ">",
    "think>",
    "## Return of ",
    "functions.get_weather:0",
)

_chars = st.characters(codec="utf-8", exclude_categories=("Cs",))


def texts(specials: bool = False, max_parts: int = 8) -> st.SearchStrategy[str]:
    parts = [st.text(_chars, max_size=12), st.sampled_from(PLAIN_FRAGMENTS)]
    if specials:
        parts.append(st.sampled_from(SPECIAL_LOOKING))
    return st.lists(st.one_of(*parts), max_size=max_parts).map("".join)


def _names() -> st.SearchStrategy[str]:
    return st.sampled_from(["get_weather", "search", "run_code", "読む", "calc_v2"])


def tools_strategy(specials: bool = False) -> st.SearchStrategy[list[dict[str, Any]] | None]:
    tool = st.builds(
        lambda name, desc, pdesc: {
            "type": "function",
            "function": {
                "name": name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": pdesc}},
                    "required": ["query"],
                },
            },
        },
        _names(),
        texts(specials, 4),
        texts(specials, 3),
    )
    return st.one_of(st.none(), st.lists(tool, min_size=1, max_size=2), tool_lists(specials))


def arguments(specials: bool = False) -> st.SearchStrategy[Any]:
    as_dict = st.builds(lambda q, n: {"query": q, "n": n, "ok": True}, texts(specials, 3), st.integers(-5, 10**6))
    # Providers return a JSON string; some return a dict (rendered by the template's tojson).
    return st.one_of(as_dict.map(lambda d: json.dumps(d, ensure_ascii=False)), as_dict, texts(specials, 3))


@st.composite
def tool_calls(draw: st.DrawFn, start_index: int, specials: bool = False, native_ids: bool = True) -> list[dict]:
    n = draw(st.integers(1, 3))
    calls = []
    for i in range(n):
        name = draw(_names())
        native = native_ids or draw(st.booleans())
        call_id = f"functions.{name}:{start_index + i}" if native else f"call_{draw(st.integers(0, 10**9))}"
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": draw(arguments(specials))}}
        )
    return calls


def user_content(specials: bool = False) -> st.SearchStrategy[Any]:
    """Plain text, or OpenAI content parts (text, and an image the template renders as media markers)."""
    part = st.one_of(
        texts(specials).map(lambda t: {"type": "text", "text": t}),
        st.just({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
    )
    return st.one_of(texts(specials), st.lists(part, min_size=1, max_size=3))


@st.composite
def prompts(draw: st.DrawFn, specials: bool = False) -> list[dict[str, Any]]:
    """A prompt ending where the assistant speaks next (after a user or tool message).

    History assistant turns carry reasoning only after the last plain assistant turn, the only place
    the K2.5 template renders it.
    """
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts(specials))})
    n_calls = 0
    for _ in range(draw(st.integers(0, 2))):
        user: dict[str, Any] = {"role": "user", "content": draw(user_content(specials))}
        if draw(st.integers(0, 4)) == 0:
            user["name"] = draw(st.sampled_from(["alice", "bob_2"]))
        messages.append(user)
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(st.none(), texts(specials)))}
        if draw(st.booleans()):
            calls = draw(tool_calls(n_calls, specials))
            n_calls += len(calls)
            assistant["tool_calls"] = calls
            if draw(st.booleans()):
                assistant["reasoning_content"] = draw(texts(specials))
            messages.append(assistant)
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(texts(specials))})
            if draw(st.booleans()):
                messages.append({"role": "assistant", "content": draw(texts(specials))})
        else:
            messages.append(assistant)
    if not messages or messages[-1]["role"] != "tool" or draw(st.booleans()):
        messages.append({"role": "user", "content": draw(texts(specials))})
    last_plain = max(
        (i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")), default=-1
    )
    for m in messages[: last_plain + 1]:
        m.pop("reasoning_content", None)
    return messages


@st.composite
def records(
    draw: st.DrawFn, specials: bool = False, native_ids: bool = True, finish: tuple[str, ...] = ("stop", "tool_calls")
) -> dict[str, Any]:
    messages = draw(prompts(specials))
    prior = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
    calls = draw(st.one_of(st.none(), tool_calls(prior, specials, native_ids)))
    content = draw(st.one_of(st.none(), texts(specials)))
    if content and not calls:
        # Tool-call markup in content means "unparsed tool calls"; that path has its own tests.
        content = _TOOL_MARKUP.sub("x", content)
    return {
        "messages": messages,
        "tools": draw(tools_strategy(specials)),
        "reasoning": draw(st.one_of(st.none(), texts(specials))),
        "content": content,
        "tool_calls": calls,
        "finish_reason": draw(st.sampled_from(finish)),
    }


_TOOL_MARKUP = re.compile(r"<\|tool_calls?_(?:section_)?(?:begin|end)\|>|<\|tool_call_argument_begin\|>")


def strip_specials(obj: Any, pattern: re.Pattern[str]) -> Any:
    """The same data with every special-token string defused (for comparing special-id layouts)."""
    if isinstance(obj, str):
        while pattern.search(obj):
            obj = pattern.sub("x", obj)
        return obj
    if isinstance(obj, dict):
        return {k: strip_specials(v, pattern) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strip_specials(v, pattern) for v in obj]
    return obj


def special_pattern(tok: Any) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, sorted(tok.special_tokens, key=len, reverse=True))))


def has_special_text(obj: Any, pattern: re.Pattern[str]) -> bool:
    if isinstance(obj, str):
        return pattern.search(obj) is not None
    if isinstance(obj, dict):
        return any(has_special_text(v, pattern) or has_special_text(k, pattern) for k, v in obj.items())
    if isinstance(obj, list):
        return any(has_special_text(v, pattern) for v in obj)
    return False


# --------------------------------------------------------------------------------------------
# JSON-schema tool lists, for the TypeScript tool declaration

_PROP_NAMES = ("city", "unit", "q", "top_k", "a", "b", "Z", "城市", "_x", "tags", "user-id")
_DEF_NAMES = ("Point", "Node", "Addr", "X")
_SCALARS = ("string", "number", "integer", "boolean", "null")


def _descriptions(specials: bool) -> st.SearchStrategy[str]:
    lines = st.one_of(texts(specials, 3), st.sampled_from(["", "Line one", "  indented", "a\tb", "ünïcödé 天气"]))
    return st.lists(lines, min_size=1, max_size=3).map("\n".join)


def _json_values(max_leaves: int = 4) -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**6), 10**6),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(_chars, max_size=6),
    )
    return st.recursive(
        leaf,
        lambda kids: st.one_of(
            st.lists(kids, max_size=3), st.dictionaries(st.text(_chars, max_size=4), kids, max_size=3)
        ),
        max_leaves=max_leaves,
    )


@st.composite
def _annotate(draw: st.DrawFn, schema: dict[str, Any], specials: bool, odd: bool) -> dict[str, Any]:
    """Description, default, constraints and the keywords upstream ignores (format, nullable, title)."""
    if draw(st.integers(0, 2)) == 0:
        schema["description"] = draw(_descriptions(specials))
    if draw(st.integers(0, 3)) == 0:
        schema["default"] = draw(_json_values())
    for key in draw(st.sets(st.sampled_from(["maxLength", "minLength", "pattern", "maximum", "minimum"]), max_size=2)):
        schema[key] = draw(st.one_of(st.integers(0, 100), st.just("^[a-z]+$"), st.floats(0, 1, width=16)))
    for key in draw(st.sets(st.sampled_from(["format", "nullable", "title", "examples"]), max_size=2)):
        schema[key] = draw(st.sampled_from(["uri", True, "Title", ["e"]]))
    if odd and draw(st.integers(0, 9)) == 0:
        schema["description"] = draw(st.sampled_from([5, ["x"], True, {"d": 1}]))
    return schema


@st.composite
def _scalar_schema(draw: st.DrawFn, specials: bool, odd: bool) -> Any:
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        schema: dict[str, Any] = {"type": draw(st.sampled_from(_SCALARS))}
    elif kind == 5:
        values = draw(
            st.lists(st.one_of(st.text(_chars, max_size=5), st.integers(-3, 3), st.none(), st.booleans()), max_size=4)
        )
        schema = {"enum": values}
        if draw(st.booleans()):
            schema["type"] = draw(
                st.sampled_from(["string", "integer", "number", "boolean", ["string", "null"], ["integer"], "object"])
            )
    elif kind == 6:
        types = draw(st.lists(st.sampled_from([*_SCALARS, "object", "array"]), min_size=1, max_size=3, unique=True))
        schema = {"type": types}
    elif kind == 7:
        schema = {"const": draw(_json_values(2))}  # upstream has no const: the whole list falls back to JSON
    elif kind == 8:
        return draw(st.sampled_from([{}, True, False]))
    else:
        schema = {"type": draw(st.sampled_from(["string", "integer"]))}
        if odd:
            schema = draw(
                st.sampled_from(
                    [
                        {"type": 5},
                        {"type": ["string", "uuid"]},
                        {"enum": "abc"},
                        {"enum": 3},
                        {"enum": [1, "a"], "type": "integer"},
                        {"enum": [1], "type": ["integer", "string", "null"]},
                        {"nullable": True},
                        "string",
                        None,
                    ]
                )
            )
            if not isinstance(schema, dict):
                return schema
            schema = dict(schema)
    return draw(_annotate(schema, specials, odd))


@st.composite
def json_schemas(draw: st.DrawFn, depth: int = 2, specials: bool = False, odd: bool = False) -> Any:
    """A JSON schema for one value: what tool authors write, plus (``odd``) shapes upstream rejects."""
    if depth <= 0:
        return draw(_scalar_schema(specials, odd))
    kind = draw(st.integers(0, 9))
    child = json_schemas(depth - 1, specials, odd)
    if kind <= 3:
        return draw(_scalar_schema(specials, odd))
    if kind <= 5:
        return draw(object_schemas(depth - 1, specials, odd))
    if kind == 6:
        schema: dict[str, Any] = {"type": "array"}
        if draw(st.integers(0, 3)):
            schema["items"] = draw(st.one_of(child, st.just({})))
        for key in draw(st.sets(st.sampled_from(["minItems", "maxItems"]), max_size=2)):
            schema[key] = draw(st.integers(0, 5))
        return draw(_annotate(schema, specials, odd))
    if kind == 7:
        word = draw(st.sampled_from(["anyOf", "anyOf", "oneOf", "allOf"]))
        return draw(_annotate({word: draw(st.lists(child, max_size=3))}, specials, odd))
    if kind == 8:
        ref = draw(st.sampled_from([f"#/$defs/{n}" for n in _DEF_NAMES] + ["#", "#/definitions/X", "#/$defs/Missing"]))
        return draw(_annotate({"$ref": ref}, specials, odd))
    return draw(object_schemas(depth - 1, specials, odd))


@st.composite
def object_schemas(draw: st.DrawFn, depth: int = 2, specials: bool = False, odd: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    names = draw(st.lists(st.sampled_from(_PROP_NAMES), max_size=4, unique=True))
    if names or draw(st.booleans()):
        schema["properties"] = {name: draw(json_schemas(depth, specials, odd)) for name in names}
    required = [n for n in names if draw(st.booleans())]
    if draw(st.integers(0, 5)) == 0:
        required.append("not_a_property")
    if required or draw(st.integers(0, 3)) == 0:
        schema["required"] = required
    extra = draw(st.integers(0, 5))
    if extra == 0:
        schema["additionalProperties"] = draw(st.booleans())
    elif extra == 1:
        schema["additionalProperties"] = draw(json_schemas(max(depth - 1, 0), specials, odd))
    if draw(st.integers(0, 4)) == 0:
        defs = draw(st.lists(st.sampled_from(_DEF_NAMES), min_size=1, max_size=2, unique=True))
        schema["$defs"] = {name: draw(object_schemas(max(depth - 1, 0), specials, odd)) for name in defs}
    if odd and draw(st.integers(0, 9)) == 0:
        schema.update(
            draw(
                st.sampled_from(
                    [
                        {"required": None},
                        {"required": "ab"},
                        {"properties": []},
                        {"additionalProperties": "yes"},
                        {"additionalProperties": None},
                        {"$defs": {"Point": True}},
                        {"$defs": []},
                    ]
                )
            )
        )
    return draw(_annotate(schema, specials, odd))


@st.composite
def tool_lists(draw: st.DrawFn, specials: bool = False, odd: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style tool lists with arbitrary parameter schemas (and, rarely, a non-function tool)."""
    tools: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 9)) == 0:
            tools.append({"type": "retrieval", "retrieval": {"id": "kb"}})
            continue
        function: dict[str, Any] = {"name": draw(st.one_of(_names(), st.just("weird name")))}
        if draw(st.integers(0, 3)):
            function["description"] = draw(_descriptions(specials))
        params = draw(st.integers(0, 9))
        if params == 0:
            function["parameters"] = draw(st.sampled_from([{}, None, {"type": "object", "properties": {}}]))
        elif params == 1 and odd:
            function["parameters"] = draw(st.sampled_from([[], "x", {"type": "object", "properties": {"a": 1}}]))
        else:
            function["parameters"] = draw(object_schemas(2, specials, odd))
        tools.append({"type": "function", "function": function})
    return tools


@st.composite
def shuffled_keys(draw: st.DrawFn, obj: Any) -> Any:
    """The same JSON value with every dict's keys in a drawn order (lists keep theirs)."""
    if isinstance(obj, dict):
        keys = draw(st.permutations(list(obj)))
        return {k: draw(shuffled_keys(obj[k])) for k in keys}
    if isinstance(obj, list):
        return [draw(shuffled_keys(v)) for v in obj]
    return obj
