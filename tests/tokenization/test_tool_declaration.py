"""The TypeScript tool declaration: upstream's rules one by one, and properties over generated schemas.

Expected texts below are written from the rules of the upstream ``tool_declaration_ts.py`` (the
known answers of the real tokenizer are in ``test_known_answers.py``).
"""

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_assets.tokenization.chat_encoding import encode_chat, render_kimi_chat
from eagle_assets.tokenization.tool_declaration import (
    DECLARATIONS,
    ToolDeclarationError,
    _declare,
    declare_tools,
    deep_sort,
    encode_tools_typescript,
)
from tests.tokenization.strategies import object_schemas, prompts, shuffled_keys, tool_lists

HEAD = "# Tools\n\n## functions\nnamespace functions {\n"


def fn(params: Any = None, name: str = "f", description: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if params is not None:
        function["parameters"] = params
    return {"type": "function", "function": function}


def ts(*tools: dict[str, Any]) -> str | None:
    return declare_tools(list(tools)).tools_ts_str


def body(params: dict[str, Any]) -> str:
    """The parameter block of a single function ``f`` without description."""
    out = ts(fn(params))
    assert out is not None and out.startswith(HEAD + "type f = (_: ") and out.endswith(") => any;\n}\n")
    return out[len(HEAD + "type f = (_: ") : -len(") => any;\n}\n")]


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required is not None:
        schema["required"] = required
    return schema


def test_required_fields_first_each_group_by_name():
    params = obj({"z": {"type": "string"}, "b": {"type": "integer"}, "a": {"type": "boolean"}}, ["z", "b"])
    assert body(params) == "{\n  b: number,\n  z: string,\n  a?: boolean\n}"


def test_descriptions_constraints_and_defaults_are_comments():
    params = obj(
        {
            "s": {"type": "string", "description": "first\n\nthird", "pattern": "^a", "maxLength": 3, "default": "x"},
            "n": {"type": "number", "minimum": 0.5, "maximum": 2, "default": 1.0, "format": "float"},
            "b": {"type": "boolean", "default": True},
            "l": {"type": "array", "items": {"type": "string"}, "maxItems": 2, "default": ["a", "ü"]},
        },
        ["s", "n", "b", "l"],
    )
    assert body(params) == (
        "{\n"
        "  // Default: True\n  b: boolean,\n"
        '  // maxItems: 2\n  // Default: ["a", "ü"]\n  l: Array<string>,\n'
        "  // maximum: 2, minimum: 0.5\n  // Default: 1.0\n  n: number,\n"
        '  // first\n\n  // third\n  // maxLength: 3, pattern: ^a\n  // Default: "x"\n  s: string\n'
        "}"
    )


def test_enums_unions_and_nullable():
    params = obj(
        {
            "e": {"enum": ["a", 1, None, True, 2.5]},
            "u": {"type": ["string", "null", "array", "object"]},
            "any": {"anyOf": [{"type": "integer"}, {"enum": ["x"]}, {"type": "array", "items": {"type": "number"}}]},
            "n": {"type": "string", "nullable": True},  # OpenAPI's nullable: ignored, as upstream
            "typed": {"type": ["string", "null"], "enum": ["x", None]},
        },
        ["e", "u", "any", "n", "typed"],
    )
    assert body(params) == (
        "{\n"
        '  any: number | "x" | Array<number>,\n'
        '  e: "a" | 1 | None | True | 2.5,\n'
        "  n: string,\n"
        '  typed: "x" | None,\n'
        "  u: string | null | Array<any> | {}\n"
        "}"
    )


def test_nested_objects_and_arrays_of_documented_items():
    inner = obj({"x": {"type": "number"}}, ["x"], description="a point")
    params = obj(
        {"p": inner, "ps": {"type": "array", "items": inner}, "free": {"type": "array"}, "plain": {"type": "object"}},
        ["p"],
    )
    assert body(params) == (
        "{\n"
        "  // a point\n  p: {\n    x: number\n  },\n"
        "  free?: Array<any>,\n"
        "  plain?: {},\n"
        "  ps?: Array<\n    // a point\n    {\n      x: number\n    }\n  >\n"
        "}"
    )


def test_additional_properties():
    params = obj(
        {"m": {"type": "object", "additionalProperties": {"type": "integer"}}, "o": {"type": "object"}},
        additionalProperties=False,
    )
    params["properties"]["o"]["additionalProperties"] = True
    assert body(params) == (
        "{\n  m?: {\n    [k: string]: number\n  },\n  o?: {\n    [k: string]: any\n  },\n  [k: string]: never\n}"
    )
    assert ts(fn(obj({}, additionalProperties="yes"))) is None  # neither a boolean nor a schema


def test_defs_become_interfaces_and_refs_print_their_name():
    params = obj(
        {"p": {"$ref": "#/$defs/Point", "description": "where"}},
        ["p"],
        **{"$defs": {"Point": obj({"x": {"type": "number"}}, ["x"], description="2D\npoint")}},
    )
    assert ts(fn(params, description="Uses defs.")) == (
        HEAD + "// 2D\n// point\ninterface Point {\n  x: number\n}\n// Uses defs.\n"
        "type f = (_: {\n  // where\n  p: Point\n}) => any;\n}\n"
    )


def test_self_reference_makes_the_parameters_an_interface():
    params = obj({"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, ["name"])
    assert ts(fn(params)) == (
        HEAD + "interface parameters {\n  children?: Array<parameters>,\n  name: string\n}\n"
        "type f = (_: parameters) => any;\n}\n"
    )


@pytest.mark.parametrize(
    "params",
    [
        obj({"c": {"const": "fast"}}),  # no const support
        obj({"s": {"oneOf": [{"type": "string"}, {"type": "number"}]}}),
        obj({"s": {"allOf": [{"type": "string"}]}}),
        obj({"p": {"$ref": "#/definitions/X"}}, definitions={"X": {"type": "string"}}),
        obj({"p": {"$ref": "#/$defs/Missing"}}),
        obj({"t": {"type": ["string", "uuid"]}}),
        obj({"e": {"enum": [1, "a"], "type": "integer"}}),
        obj({"e": {"enum": ["a"], "type": ["string", "integer", "null"]}}),
        obj({"d": {"type": "string", "description": 5}}),
        obj({"x": "string"}),
        {**obj({"x": {"type": "string"}}), "required": None},
    ],
)
def test_unconvertible_schemas_fall_back_to_sorted_json(tok, params):
    tools = [fn(params, description="Fallback.")]
    assert declare_tools(tools).tools_ts_str is None
    with pytest.raises(ToolDeclarationError):
        encode_tools_typescript(deep_sort(tools))
    text = render_kimi_chat(tok.chat_template, [{"role": "user", "content": "q"}], tools)
    declared = text[len("<|im_system|>tool_declare<|im_middle|>") : text.index("<|im_end|>")]
    assert declared == json.dumps(tools, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def test_tool_list_shapes():
    retrieval = {"type": "retrieval", "retrieval": {"id": "kb"}}
    assert ts(retrieval) == ""  # nothing to declare: the template prints JSON
    assert ts(retrieval, fn(None, name="g")) == HEAD + "type g = (_: {}) => any;\n}\n"
    assert (
        ts({"type": "function", "function": {"description": "x"}})
        == HEAD + "// x\ntype function = (_: {}) => any;\n}\n"
    )
    assert ts(fn(obj({})), fn({}, name="h")) == HEAD + "type f = (_: {}) => any;\ntype h = (_: {}) => any;\n}\n"
    assert declare_tools(None).tools is None and declare_tools([]).tools == []
    assert ts("not a tool") is None


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), tools=tool_lists(odd=True))
def test_deterministic_and_insensitive_to_dict_order(data, tools):
    first = _declare(tools)
    assert _declare(tools) == first
    shuffled = data.draw(shuffled_keys(tools))
    again = _declare(shuffled)
    assert again.tools_ts_str == first.tools_ts_str
    assert json.dumps(again.tools) == json.dumps(first.tools)  # same keys in the same order, at every depth
    assert declare_tools(shuffled) == declare_tools(tools) == first  # the cache keys on content, not order


@SETTINGS
@given(tools=tool_lists(specials=True))
def test_declaration_shape(tools):
    sorted_tools = deep_sort(tools)
    assert json.dumps(sorted_tools, sort_keys=True) == json.dumps(sorted_tools)
    text = declare_tools(tools).tools_ts_str
    functions = [t for t in tools if t["type"] == "function"]
    if text is None or not functions:
        return
    assert text.startswith(HEAD) and text.endswith("\n}\n")
    assert text.count(" = (_: ") >= len(functions)  # one signature per function, however nested
    for t in functions:
        assert f"type {t['function']['name']} = (_: " in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), messages=prompts(specials=True), tools=tool_lists(specials=True))
def test_chat_ids_insensitive_to_tool_dict_order(tok, data, messages, tools):
    ids = encode_chat(tok, messages, tools, add_generation_prompt=True)
    assert encode_chat(tok, messages, data.draw(shuffled_keys(tools)), add_generation_prompt=True) == ids
    assert encode_chat(tok, messages, tools, add_generation_prompt=True) == ids


@SETTINGS
@given(schema=object_schemas(3, specials=True, odd=True))
def test_conversion_either_succeeds_or_says_why(schema):
    # Whatever the schema, the encoder answers with text or ToolDeclarationError, never another exception.
    try:
        text = encode_tools_typescript(deep_sort([fn(schema)]))
    except ToolDeclarationError:
        return
    assert text.startswith(HEAD) and "\ntype f = (_: " in text and text.endswith(") => any;\n}\n")


def test_cache_converts_each_distinct_list_once():
    DECLARATIONS.clear()
    a = [fn(obj({"q": {"type": "string"}}, ["q"]))]
    b = [fn(obj({"q": {"type": "integer"}}, ["q"]))]
    for _ in range(3):
        declare_tools(a)
        declare_tools(json.loads(json.dumps(b)))
    assert (DECLARATIONS.misses, DECLARATIONS.hits) == (2, 4)
    assert declare_tools(a).tools_ts_str != declare_tools(b).tools_ts_str
