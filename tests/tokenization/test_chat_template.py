"""The renderer matches transformers' own ``render_jinja_template`` and the documented template quirks."""

import json

import jinja2
import pytest
import transformers.tokenization_utils_base
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.utils.chat_template_utils import render_jinja_template

from eagle_assets.tokenization.chat_encoding import render_kimi_chat
from eagle_assets.tokenization.chat_template import compile_template, normalize_messages, render_normalized
from eagle_assets.tokenization.tool_declaration import declare_tools
from tests.tokenization.strategies import prompts, records, tool_lists, tools_strategy

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def render_chat(template, messages, tools=None, add_generation_prompt=False, **kwargs):
    # HF's generic rendering (no Kimi tool declaration): normalise, then render.
    return render_normalized(template, normalize_messages(messages), tools, add_generation_prompt, kwargs)


# transformers 5.24's apply_chat_template normalises the messages, then calls render_jinja_template; 5.19's has no
# such step (no ``_normalize_chat_messages``) and hands render_jinja_template the messages as given.
hf_normalize = getattr(transformers.tokenization_utils_base, "_normalize_chat_messages", None)


def hf_render(template, messages, tools=None, add_generation_prompt=False, **kwargs):
    # What apply_chat_template renders (its own call order). Where transformers has no normalisation (5.19 renders
    # a None value as the text "None"), it is given the messages in our normal form: the normalisation is then
    # checked against HF's only where HF has one, and the rendering itself always is.
    normalized = hf_normalize(messages) if hf_normalize is not None else normalize_messages(messages)
    rendered, _ = render_jinja_template(
        conversations=[normalized],
        tools=tools,
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    return rendered[0]


@SETTINGS
@given(messages=prompts(specials=True), tools=tools_strategy(specials=True), gen=st.booleans(), think=st.booleans())
def test_matches_transformers_renderer(tok, messages, tools, gen, think):
    ours = render_chat(tok.chat_template, messages, tools, add_generation_prompt=gen, thinking=think)
    assert ours == hf_render(tok.chat_template, messages, tools, add_generation_prompt=gen, thinking=think)


@settings(max_examples=60, deadline=None)
@given(record=records(specials=True))
def test_matches_transformers_renderer_with_final_assistant(tok, record):
    final = {"role": "assistant", "content": record["content"], "reasoning_content": record["reasoning"]}
    if record["tool_calls"]:
        final["tool_calls"] = record["tool_calls"]
    messages = [*record["messages"], final]
    for kwargs in ({}, {"thinking": True}, {"thinking": False}):
        ours = render_chat(tok.chat_template, messages, record["tools"], **kwargs)
        assert ours == hf_render(tok.chat_template, messages, record["tools"], **kwargs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=prompts(specials=True), tools=tool_lists(specials=True), gen=st.booleans())
def test_kimi_render_is_transformers_given_the_release_inputs(tok, messages, tools, gen):
    # The release's apply_chat_template hands transformers deep-sorted tools and tools_ts_str.
    declared = declare_tools(tools)
    expected = hf_render(tok.chat_template, messages, declared.tools, gen, **declared.template_kwargs())
    assert render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=gen) == expected


def test_tojson_keeps_order_and_unicode_and_accepts_options():
    t = (
        "{{ x | tojson }}|{{ x | tojson(separators=(',', ':')) }}|"
        "{{ x | tojson(indent=2) }}|{{ x | tojson(sort_keys=true) }}"
    )
    x = {"b": "天气 <é>", "a": [1, None]}
    out = render_chat(t, [], x=x).split("|")
    assert out[0] == json.dumps(x, ensure_ascii=False)
    assert out[1] == '{"b":"天气 <é>","a":[1,null]}'
    assert out[2] == json.dumps(x, ensure_ascii=False, indent=2)
    assert out[3] == json.dumps(x, ensure_ascii=False, sort_keys=True)


def test_environment_features():
    t = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    assert render_chat(t, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a"
    with pytest.raises(jinja2.exceptions.TemplateError, match="nope"):
        render_chat("{{ raise_exception('nope') }}", [])
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat("{{ messages.append(1) }}", [])
    # trim_blocks + lstrip_blocks: block lines leave no newline/indent behind.
    assert render_chat("  {% if true %}\nX\n  {% endif %}\n", []) == "X\n"


def test_compiles_once():
    template = "{{ messages | length }}"
    compile_template.cache_clear()
    for _ in range(3):
        render_chat(template, [{"role": "user", "content": "x"}])
    info = compile_template.cache_info()
    assert info.misses == 1 and info.hits == 2


def test_none_values_are_dropped_and_reasoning_aliased():
    msgs = normalize_messages([{"role": "assistant", "content": None, "reasoning": "r", "tool_calls": None}])
    assert msgs == [{"thinking": "r", "role": "assistant", "reasoning": "r", "reasoning_content": "r"}]


def test_kimi_quirks(tok):
    t = tok.chat_template
    # ``{{ c }}`` is emitted verbatim: surrounding whitespace control never eats the content's own whitespace.
    content = "\n\n  x  \n\t"
    out = render_chat(t, [{"role": "user", "content": content}])
    assert out == f"<|im_user|>user<|im_middle|>{content}<|im_end|>"
    # The tool turn keeps its literal newline between the id and the content.
    out = render_chat(t, [{"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"}])
    assert out == "<|im_system|>tool<|im_middle|>## Return of functions.f:0\nok<|im_end|>"
    # ``name`` replaces the role in the header.
    out = render_chat(t, [{"role": "user", "name": "alice", "content": "hi"}])
    assert out.startswith("<|im_user|>alice<|im_middle|>")
    # K2.5: reasoning of every turn up to the last plain assistant turn is dropped; there is no
    # preserve_thinking switch (a later revision's), so passing it changes nothing.
    convo = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "q2"},
    ]
    assert "<think></think>a" in render_chat(t, convo) and "old thoughts" not in render_chat(t, convo)
    assert render_chat(t, convo, preserve_thinking=True) == render_chat(t, convo)
    # Tool-call turns after it keep their reasoning (the model is still working on the same request).
    call = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    working = [*convo, {"role": "assistant", "content": "", "reasoning_content": "r2", "tool_calls": [call]}]
    working.append({"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"})
    assert "<think>r2</think><|tool_calls_section_begin|>" in render_chat(t, working)
    # Only reasoning_content is read by the template; HF's normalisation aliases ``reasoning`` to it.
    raw = compile_template(t).render(messages=[{**working[3], "reasoning_content": None, "reasoning": "r3"}])
    assert "<think>None</think>" in raw  # without HF's None-dropping the template prints the literal "None"
    aliased = [*working[:3], {**working[3], "reasoning_content": None, "reasoning": "r3"}]
    assert "<think>r3</think>" in render_chat(t, aliased)
    # Generation prompt, with and without thinking; tools are declared compactly, in key order.
    assert render_chat(t, [], add_generation_prompt=True) == "<|im_assistant|>assistant<|im_middle|><think>"
    assert render_chat(t, [], add_generation_prompt=True, thinking=False).endswith("<think></think>")
    tools = [{"type": "function", "function": {"name": "f", "description": "天气"}}]
    assert render_chat(t, [], tools).startswith(
        '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"f","description":"天气"}}]'
    )
    # A TypeScript declaration, when given, replaces the JSON verbatim.
    declared = render_chat(t, [], tools, tools_ts_str="# Tools\n<x>")
    assert declared == "<|im_system|>tool_declare<|im_middle|># Tools\n<x><|im_end|>"
    # An empty tool_calls list renders no section.
    out = render_chat(t, [{"role": "assistant", "content": "a", "tool_calls": []}])
    assert "tool_calls_section" not in out
