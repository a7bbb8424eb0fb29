from hypothesis import given, settings

from eagle_assets.tokenization.toolcall_text import (
    ARGUMENT_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    contains_tool_markup,
    function_name_from_id,
    parse_tool_text,
)
from tests.tokenization.strategies import texts


def call(tool_id: str, args: str) -> str:
    return f"{CALL_BEGIN}{tool_id}{ARGUMENT_BEGIN}{args}{CALL_END}"


def test_full_section():
    text = "Let me look." + SECTION_BEGIN + call("functions.get_weather:0", '{"city": "Paris"}')
    text += call("functions.search:1", '{"q": "x"}') + SECTION_END
    p = parse_tool_text(text)
    assert p.content == "Let me look."
    weather = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert p.tool_calls == [
        {"id": "functions.get_weather:0", "type": "function", "function": weather},
        {"id": "functions.search:1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
    ]
    assert p.rest == "" and p.had_section_begin and p.had_section_end and not p.truncated


def test_missing_section_markers_whitespace_and_singular_spelling():
    p = parse_tool_text("x " + call("functions.a:0", "{}") + "\n " + call("b:1", "{}"))
    assert p.content == "x " and [c["function"]["name"] for c in p.tool_calls] == ["a", "b"]
    assert not p.had_section_begin and not p.had_section_end and p.rest == ""
    p = parse_tool_text("<|tool_call_section_begin|>" + call("functions.a:0", "{}") + "<|tool_call_section_end|>\n")
    assert p.had_section_begin and p.had_section_end and p.rest == "\n" and len(p.tool_calls) == 1


def test_truncated_call_is_left_in_rest():
    text = SECTION_BEGIN + call("functions.a:0", "{}") + CALL_BEGIN + "functions.b:1" + ARGUMENT_BEGIN + '{"q": "par'
    p = parse_tool_text(text)
    assert len(p.tool_calls) == 1 and p.truncated and not p.had_section_end
    assert p.rest == CALL_BEGIN + "functions.b:1" + ARGUMENT_BEGIN + '{"q": "par'


def test_no_markup():
    assert not contains_tool_markup("plain <|im_end|>") and not contains_tool_markup(None)
    assert parse_tool_text("plain").content == "plain"


def test_function_names():
    assert function_name_from_id("functions.get_weather:12") == "get_weather"
    assert function_name_from_id("ns.tool:3") == "ns.tool"
    assert function_name_from_id("call_abc") == "call_abc"


@settings(max_examples=100, deadline=None)
@given(prefix=texts(), args=texts(specials=True))
def test_roundtrip_arbitrary_text(prefix, args):
    if contains_tool_markup(prefix) or CALL_END in args:
        return
    p = parse_tool_text(prefix + SECTION_BEGIN + call("functions.f:0", args) + SECTION_END)
    assert p.content == prefix and p.tool_calls[0]["function"]["arguments"] == args and p.rest == ""
