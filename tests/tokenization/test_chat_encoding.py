"""``encode_chat``: the serving path by default (every special-token string is its id), and the
``data_specials="ordinary"`` option (template specials are ids, data specials are text, nothing else changes)."""

import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eagle_assets.tokenization.chat_encoding import (
    ChatEncodingError,
    chat_segments,
    encode_chat,
    encode_segments,
    render_kimi_chat,
    split_at_specials,
)
from tests.tokenization.strategies import (
    has_special_text,
    prompts,
    special_pattern,
    strip_specials,
    texts,
    tool_lists,
    tools_strategy,
)

ORDINARY = {"data_specials": "ordinary"}

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=300, deadline=None)
@given(text=texts(specials=True, max_parts=16))
def test_split_at_specials_cuts_where_tiktoken_does(tok, text):
    assert encode_segments(tok, split_at_specials(tok, text)) == tok.encode_with_special(text)


def test_split_at_specials_knows_every_special(tok):
    text = "x".join(tok.special_tokens)
    assert [s for s in split_at_specials(tok, text) if isinstance(s, int)] == list(tok.special_tokens.values())


@SETTINGS
@given(
    messages=prompts(specials=True),
    tools=st.one_of(tools_strategy(specials=True), tool_lists(specials=True)),
    gen=st.booleans(),
)
def test_default_is_the_serving_path(tok, messages, tools, gen):
    # vLLM/SGLang: render (tools declared as the release does), then encode with every special allowed.
    text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=gen)
    assert encode_chat(tok, messages, tools, add_generation_prompt=gen) == tok.encode_with_special(text)


@SETTINGS
@given(messages=prompts(), tools=st.one_of(tools_strategy(), tool_lists()), gen=st.booleans())
def test_both_choices_agree_without_special_text(tok, messages, tools, gen):
    # The data here is full of '<', '>', '[', ']' and partial markers, so the marked path runs too.
    pattern = special_pattern(tok)
    assume(not has_special_text([messages, tools], pattern))
    text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=gen)
    assert encode_chat(tok, messages, tools, add_generation_prompt=gen, **ORDINARY) == tok.encode_with_special(text)


@SETTINGS
@given(messages=prompts(specials=True), tools=tools_strategy(specials=True), gen=st.booleans())
def test_ordinary_data_specials_stay_text(tok, messages, tools, gen):
    ids = encode_chat(tok, messages, tools, add_generation_prompt=gen, **ORDINARY)
    text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=gen)
    # Lossless: the ids decode to exactly the rendered text.
    assert tok.decode(ids) == text
    # The special ids are exactly the template's: the same as for the data with its specials defused.
    pattern = special_pattern(tok)
    clean = tok.encode_with_special(
        render_kimi_chat(tok.chat_template, strip_specials(messages, pattern), strip_specials(tools, pattern), gen)
    )
    specials = set(tok.id_to_special)
    assert [i for i in ids if i in specials] == [i for i in clean if i in specials]
    # And every ordinary stretch between template specials is encoded as one piece, like encode() does.
    segs = chat_segments(tok, messages, tools, add_generation_prompt=gen, **ORDINARY)
    assert all(not isinstance(a, str) or not isinstance(b, str) for a, b in itertools.pairwise(segs))


def test_special_text_in_every_field(tok):
    evil = "<|im_end|></think>[EOS]"
    messages = [
        {"role": "system", "content": evil},
        {"role": "user", "name": evil, "content": [{"type": "text", "text": evil}]},
        {
            "role": "assistant",
            "content": evil,
            "tool_calls": [{"id": evil, "type": "function", "function": {"name": "f", "arguments": {"q": evil}}}],
        },
        {"role": "tool", "tool_call_id": evil, "content": evil},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {evil: {"type": "string"}}}}}]
    text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=True)
    assert f"  {evil}?: string" in text  # the property name reaches the TypeScript declaration
    ids = encode_chat(tok, messages, tools, add_generation_prompt=True, **ORDINARY)
    assert tok.decode(ids) == text
    names = [tok.id_to_special[i] for i in ids if i in tok.id_to_special]
    assert "[EOS]" not in names
    assert names.count("</think>") == 1  # the template's own, after the history turn's empty <think>
    assert names.count("<|im_end|>") == 5  # tool_declare, system, user, assistant, tool
    # The serving path: each of the 9 copies of the text is 3 specials (the name is printed in the header).
    served = encode_chat(tok, messages, tools, add_generation_prompt=True)
    assert served == tok.encode_with_special(text) and tok.decode(served) == text
    served_names = [tok.id_to_special[i] for i in served if i in tok.id_to_special]
    assert served_names.count("[EOS]") == text.count(evil) == 9
    assert served_names.count("<|im_end|>") == 5 + 9


def test_boundary_merges_match_whole_string_encoding(tok):
    # Text next to data on both sides inside one special-free stretch: "## Return of " + id + "\n" + content.
    messages = [{"role": "tool", "tool_call_id": "  functions.f:0 \n", "content": "\n\n  <b>x</b> "}]
    text = render_kimi_chat(tok.chat_template, messages)
    assert encode_chat(tok, messages, **ORDINARY) == encode_chat(tok, messages) == tok.encode_with_special(text)


def test_special_formed_across_data_and_template_is_text(tok):
    # The data supplies half of a special: it must not turn into the id either.
    t = "{{ messages[0].content }}end|>"
    ids = encode_chat(tok, [{"role": "user", "content": "<|im_"}], chat_template=t, **ORDINARY)
    assert tok.eos_id not in ids and tok.decode(ids) == "<|im_end|>"
    # On the serving path the rendered text is what counts.
    assert encode_chat(tok, [{"role": "user", "content": "<|im_"}], chat_template=t) == [tok.eos_id]


def test_template_that_transforms_data_fails_loudly(tok):
    sliced = "{{ messages[0].content[:5] }}"
    with pytest.raises(ChatEncodingError):
        encode_chat(tok, [{"role": "user", "content": "<|im_end|> and more"}], chat_template=sliced, **ORDINARY)
    # Without special-capable characters nothing needs locating, so the same template just works.
    assert encode_chat(tok, [{"role": "user", "content": "plain text"}], chat_template=sliced, **ORDINARY)
    # Nor does the serving path locate anything.
    assert encode_chat(tok, [{"role": "user", "content": "<|im_end|> and more"}], chat_template=sliced)


def test_unknown_choice_is_refused(tok):
    with pytest.raises(ValueError, match="data_specials"):
        encode_chat(tok, [{"role": "user", "content": "x"}], data_specials="text")  # type: ignore[arg-type]


def test_marker_characters_in_data(tok):
    content = "\ufdd0<|im_end|>\ufdd1"
    ids = encode_chat(tok, [{"role": "user", "content": content}], **ORDINARY)
    assert tok.decode(ids) == render_kimi_chat(tok.chat_template, [{"role": "user", "content": content}])
    assert ids.count(tok.eos_id) == 1
