"""Hypothesis strategies for chats and generated records, shared by the tokenization tests.

Text is built from fragments chosen to stress BPE and the template: whitespace runs, leading and
trailing newlines, CJK, emoji, code, digits, contractions, partial special-token text (``<|im_``),
and, when ``specials=True``, whole special-token strings that must stay ordinary text.

Every strategy factory here is cached (``functools.cache``), and the strategies drawn inside the
composites are module constants: a strategy object is immutable, so one per argument tuple serves
every example, whereas Hypothesis validates each new object (walking its whole tree) on its first
draw. Built afresh inside every draw, as they once were, they made an example of
``test_default_is_the_serving_path`` cost about 85 ms CPU to draw for 2 ms of code under test; now
about 20 ms. The same values are drawn with the same odds. Since strategies are shared, a drawn dict
or list must be a fresh object (``_fresh_sample``, ``st.builds``), never one a strategy holds.
"""

import copy
import json
import re
from functools import cache
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

# Every code point but the surrogates: what UTF-8 can carry. Not ``codec="utf-8"``, the same set, which makes each
# worker of a fresh checkout scan all of Unicode once (~4.7 CPU-s) before hypothesis caches it under .hypothesis/.
_chars = st.characters(exclude_categories=("Cs",))
_bools = st.booleans()
_one_in = {n: st.integers(0, n - 1) for n in (3, 4, 5, 6, 10)}  # _one_in[n]: a draw of 0 happens one time in n


@cache
def texts(specials: bool = False, max_parts: int = 8) -> st.SearchStrategy[str]:
    parts = [st.text(_chars, max_size=12), st.sampled_from(PLAIN_FRAGMENTS)]
    if specials:
        parts.append(st.sampled_from(SPECIAL_LOOKING))
    return st.lists(st.one_of(*parts), max_size=max_parts).map("".join)


@cache
def _names() -> st.SearchStrategy[str]:
    return st.sampled_from(["get_weather", "search", "run_code", "読む", "calc_v2"])


@cache
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


@cache
def arguments(specials: bool = False) -> st.SearchStrategy[Any]:
    as_dict = st.builds(lambda q, n: {"query": q, "n": n, "ok": True}, texts(specials, 3), st.integers(-5, 10**6))
    # Providers return a JSON string; some return a dict (rendered by the template's tojson).
    return st.one_of(as_dict.map(lambda d: json.dumps(d, ensure_ascii=False)), as_dict, texts(specials, 3))


_n_calls = st.integers(1, 3)
_provider_ids = st.integers(0, 10**9)


@cache
@st.composite
def tool_calls(draw: st.DrawFn, start_index: int, specials: bool = False, native_ids: bool = True) -> list[dict]:
    n = draw(_n_calls)
    calls = []
    for i in range(n):
        name = draw(_names())
        native = native_ids or draw(_bools)
        call_id = f"functions.{name}:{start_index + i}" if native else f"call_{draw(_provider_ids)}"
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": draw(arguments(specials))}}
        )
    return calls


@cache
def user_content(specials: bool = False) -> st.SearchStrategy[Any]:
    """Plain text, or OpenAI content parts (text, and an image the template renders as media markers)."""
    part = st.one_of(
        texts(specials).map(lambda t: {"type": "text", "text": t}),
        st.builds(lambda: {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),  # fresh each
    )
    return st.one_of(texts(specials), st.lists(part, min_size=1, max_size=3))


_n_turns = st.integers(0, 2)
_user_names = st.sampled_from(["alice", "bob_2"])


@cache
def _maybe_texts(specials: bool) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), texts(specials))


@cache
@st.composite
def prompts(draw: st.DrawFn, specials: bool = False) -> list[dict[str, Any]]:
    """A prompt ending where the assistant speaks next (after a user or tool message).

    History assistant turns carry reasoning only after the last plain assistant turn, the only place
    the K2.5 template renders it.
    """
    messages: list[dict[str, Any]] = []
    if draw(_bools):
        messages.append({"role": "system", "content": draw(texts(specials))})
    n_calls = 0
    for _ in range(draw(_n_turns)):
        user: dict[str, Any] = {"role": "user", "content": draw(user_content(specials))}
        if draw(_one_in[5]) == 0:
            user["name"] = draw(_user_names)
        messages.append(user)
        assistant: dict[str, Any] = {"role": "assistant", "content": draw(_maybe_texts(specials))}
        if draw(_bools):
            calls = draw(tool_calls(n_calls, specials))
            n_calls += len(calls)
            assistant["tool_calls"] = calls
            if draw(_bools):
                assistant["reasoning_content"] = draw(texts(specials))
            messages.append(assistant)
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(texts(specials))})
            if draw(_bools):
                messages.append({"role": "assistant", "content": draw(texts(specials))})
        else:
            messages.append(assistant)
    if not messages or messages[-1]["role"] != "tool" or draw(_bools):
        messages.append({"role": "user", "content": draw(texts(specials))})
    last_plain = max(
        (i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")), default=-1
    )
    for m in messages[: last_plain + 1]:
        m.pop("reasoning_content", None)
    return messages


@cache
@st.composite
def records(
    draw: st.DrawFn, specials: bool = False, native_ids: bool = True, finish: tuple[str, ...] = ("stop", "tool_calls")
) -> dict[str, Any]:
    messages = draw(prompts(specials))
    prior = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
    calls = draw(_maybe_tool_calls(prior, specials, native_ids))
    content = draw(_maybe_texts(specials))
    if content and not calls:
        # Tool-call markup in content means "unparsed tool calls"; that path has its own tests.
        content = _TOOL_MARKUP.sub("x", content)
    return {
        "messages": messages,
        "tools": draw(tools_strategy(specials)),
        "reasoning": draw(_maybe_texts(specials)),
        "content": content,
        "tool_calls": calls,
        "finish_reason": draw(st.sampled_from(finish)),
    }


@cache
def _maybe_tool_calls(start_index: int, specials: bool, native_ids: bool) -> st.SearchStrategy[list[dict] | None]:
    return st.one_of(st.none(), tool_calls(start_index, specials, native_ids))


def _fresh_sample(values: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """One of ``values``, each draw a copy: the strategy is shared, so a drawn dict must not be."""
    return st.sampled_from(values).map(copy.deepcopy)


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
        out = [strip_specials(v, pattern) for v in obj]
        if pattern.search(_joined_text(out)):  # text parts that join into a special: defuse their openers
            out = [{**v, "text": v["text"].replace("<", "x").replace("[", "x")} if _is_text(v) else v for v in out]
        return out
    return obj


def _is_text(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("text"), str)


def _joined_text(parts: list[Any]) -> str:
    """What the template renders of a message's text parts: joined (``["<|im_", "end|>"]`` is ``<|im_end|>``)."""
    return "".join(v["text"] for v in parts if _is_text(v))


def special_pattern(tok: Any) -> re.Pattern[str]:
    return re.compile("|".join(map(re.escape, sorted(tok.special_tokens, key=len, reverse=True))))


def has_special_text(obj: Any, pattern: re.Pattern[str]) -> bool:
    if isinstance(obj, str):
        return pattern.search(obj) is not None
    if isinstance(obj, dict):
        return any(has_special_text(v, pattern) or has_special_text(k, pattern) for k, v in obj.items())
    if isinstance(obj, list):
        return pattern.search(_joined_text(obj)) is not None or any(has_special_text(v, pattern) for v in obj)
    return False


# --------------------------------------------------------------------------------------------
# JSON-schema tool lists, for the TypeScript tool declaration

_PROP_NAMES = ("city", "unit", "q", "top_k", "a", "b", "Z", "城市", "_x", "tags", "user-id")
_DEF_NAMES = ("Point", "Node", "Addr", "X")
_SCALARS = ("string", "number", "integer", "boolean", "null")


@cache
def _descriptions(specials: bool) -> st.SearchStrategy[str]:
    lines = st.one_of(texts(specials, 3), st.sampled_from(["", "Line one", "  indented", "a\tb", "ünïcödé 天气"]))
    return st.lists(lines, min_size=1, max_size=3).map("\n".join)


@cache
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


_constraint_keys = st.sets(st.sampled_from(["maxLength", "minLength", "pattern", "maximum", "minimum"]), max_size=2)
_constraint_values = st.one_of(st.integers(0, 100), st.just("^[a-z]+$"), st.floats(0, 1, width=16))
_ignored_keys = st.sets(st.sampled_from(["format", "nullable", "title", "examples"]), max_size=2)
_ignored_values = _fresh_sample(("uri", True, "Title", ["e"]))
_odd_descriptions = _fresh_sample((5, ["x"], True, {"d": 1}))


def _annotate(draw: st.DrawFn, schema: dict[str, Any], specials: bool, odd: bool) -> dict[str, Any]:
    """Description, default, constraints and the keywords upstream ignores (format, nullable, title).

    A plain helper given ``draw``, not a composite: it takes the schema being built, which no cache can key on."""
    if draw(_one_in[3]) == 0:
        schema["description"] = draw(_descriptions(specials))
    if draw(_one_in[4]) == 0:
        schema["default"] = draw(_json_values())
    for key in draw(_constraint_keys):
        schema[key] = draw(_constraint_values)
    for key in draw(_ignored_keys):
        schema[key] = draw(_ignored_values)
    if odd and draw(_one_in[10]) == 0:
        schema["description"] = draw(_odd_descriptions)
    return schema


_enum_values = st.lists(st.one_of(st.text(_chars, max_size=5), st.integers(-3, 3), st.none(), _bools), max_size=4)
_scalar_types = st.sampled_from(_SCALARS)
_enum_types = _fresh_sample(("string", "integer", "number", "boolean", ["string", "null"], ["integer"], "object"))
_type_lists = st.lists(st.sampled_from([*_SCALARS, "object", "array"]), min_size=1, max_size=3, unique=True)
_any_or_nothing = _fresh_sample(({}, True, False))
_string_or_integer = st.sampled_from(["string", "integer"])
_odd_scalars = _fresh_sample(
    (
        {"type": 5},
        {"type": ["string", "uuid"]},
        {"enum": "abc"},
        {"enum": 3},
        {"enum": [1, "a"], "type": "integer"},
        {"enum": [1], "type": ["integer", "string", "null"]},
        {"nullable": True},
        "string",
        None,
    )
)


@cache
@st.composite
def _scalar_schema(draw: st.DrawFn, specials: bool, odd: bool) -> Any:
    kind = draw(_one_in[10])
    if kind <= 4:
        schema: dict[str, Any] = {"type": draw(_scalar_types)}
    elif kind == 5:
        schema = {"enum": draw(_enum_values)}
        if draw(_bools):
            schema["type"] = draw(_enum_types)
    elif kind == 6:
        schema = {"type": draw(_type_lists)}
    elif kind == 7:
        schema = {"const": draw(_json_values(2))}  # upstream has no const: the whole list falls back to JSON
    elif kind == 8:
        return draw(_any_or_nothing)
    else:
        schema = {"type": draw(_string_or_integer)}
        if odd:
            schema = draw(_odd_scalars)
            if not isinstance(schema, dict):
                return schema
    return _annotate(draw, schema, specials, odd)


_array_bounds = st.sets(st.sampled_from(["minItems", "maxItems"]), max_size=2)
_item_counts = st.integers(0, 5)
_combinators = st.sampled_from(["anyOf", "anyOf", "oneOf", "allOf"])
_refs = st.sampled_from([f"#/$defs/{n}" for n in _DEF_NAMES] + ["#", "#/definitions/X", "#/$defs/Missing"])


@cache
def _items(depth: int, specials: bool, odd: bool) -> st.SearchStrategy[Any]:
    return st.one_of(json_schemas(depth, specials, odd), st.builds(dict))


@cache
def _schema_lists(depth: int, specials: bool, odd: bool) -> st.SearchStrategy[list[Any]]:
    return st.lists(json_schemas(depth, specials, odd), max_size=3)


@cache
@st.composite
def json_schemas(draw: st.DrawFn, depth: int = 2, specials: bool = False, odd: bool = False) -> Any:
    """A JSON schema for one value: what tool authors write, plus (``odd``) shapes upstream rejects."""
    if depth <= 0:
        return draw(_scalar_schema(specials, odd))
    kind = draw(_one_in[10])
    if kind <= 3:
        return draw(_scalar_schema(specials, odd))
    if kind <= 5:
        return draw(object_schemas(depth - 1, specials, odd))
    if kind == 6:
        schema: dict[str, Any] = {"type": "array"}
        if draw(_one_in[4]):
            schema["items"] = draw(_items(depth - 1, specials, odd))
        for key in draw(_array_bounds):
            schema[key] = draw(_item_counts)
        return _annotate(draw, schema, specials, odd)
    if kind == 7:
        word = draw(_combinators)
        return _annotate(draw, {word: draw(_schema_lists(depth - 1, specials, odd))}, specials, odd)
    if kind == 8:
        return _annotate(draw, {"$ref": draw(_refs)}, specials, odd)
    return draw(object_schemas(depth - 1, specials, odd))


_property_names = st.lists(st.sampled_from(_PROP_NAMES), max_size=4, unique=True)
_def_names = st.lists(st.sampled_from(_DEF_NAMES), min_size=1, max_size=2, unique=True)
_odd_objects = _fresh_sample(
    (
        {"required": None},
        {"required": "ab"},
        {"properties": []},
        {"additionalProperties": "yes"},
        {"additionalProperties": None},
        {"$defs": {"Point": True}},
        {"$defs": []},
    )
)


@cache
@st.composite
def object_schemas(draw: st.DrawFn, depth: int = 2, specials: bool = False, odd: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    names = draw(_property_names)
    if names or draw(_bools):
        schema["properties"] = {name: draw(json_schemas(depth, specials, odd)) for name in names}
    required = [n for n in names if draw(_bools)]
    if draw(_one_in[6]) == 0:
        required.append("not_a_property")
    if required or draw(_one_in[4]) == 0:
        schema["required"] = required
    extra = draw(_one_in[6])
    if extra == 0:
        schema["additionalProperties"] = draw(_bools)
    elif extra == 1:
        schema["additionalProperties"] = draw(json_schemas(max(depth - 1, 0), specials, odd))
    if draw(_one_in[5]) == 0:
        defs = draw(_def_names)
        schema["$defs"] = {name: draw(object_schemas(max(depth - 1, 0), specials, odd)) for name in defs}
    if odd and draw(_one_in[10]) == 0:
        schema.update(draw(_odd_objects))
    return _annotate(draw, schema, specials, odd)


_tool_names = st.one_of(_names(), st.just("weird name"))
_no_parameters = _fresh_sample(({}, None, {"type": "object", "properties": {}}))
_odd_parameters = _fresh_sample(([], "x", {"type": "object", "properties": {"a": 1}}))


@cache
@st.composite
def tool_lists(draw: st.DrawFn, specials: bool = False, odd: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style tool lists with arbitrary parameter schemas (and, rarely, a non-function tool)."""
    tools: list[dict[str, Any]] = []
    for _ in range(draw(_n_calls)):
        if draw(_one_in[10]) == 0:
            tools.append({"type": "retrieval", "retrieval": {"id": "kb"}})
            continue
        function: dict[str, Any] = {"name": draw(_tool_names)}
        if draw(_one_in[4]):
            function["description"] = draw(_descriptions(specials))
        params = draw(_one_in[10])
        if params == 0:
            function["parameters"] = draw(_no_parameters)
        elif params == 1 and odd:
            function["parameters"] = draw(_odd_parameters)
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
