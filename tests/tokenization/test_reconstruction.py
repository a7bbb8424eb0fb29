"""Reconstruction equals the chat template's own rendering of the finished conversation."""

import json
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eagle_assets.tokenization.chat_encoding import encode_chat, encode_segments, render_kimi_chat
from eagle_assets.tokenization.reconstruction import (
    Reconstruction,
    reconstruct,
    reconstruct_batch,
    response_segments,
)
from eagle_assets.tokenization.toolcall_text import ARGUMENT_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END
from tests.tokenization.strategies import has_special_text, records, special_pattern, texts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def final_message(record: dict[str, Any]) -> dict[str, Any]:
    """The assistant turn built straight from the record, independently of the module under test."""
    msg: dict[str, Any] = {"role": "assistant", "content": record["content"], "reasoning_content": record["reasoning"]}
    if record["tool_calls"]:
        prior = sum(len(m.get("tool_calls") or []) for m in record["messages"] if m["role"] == "assistant")
        calls = []
        for i, c in enumerate(record["tool_calls"]):
            tool_id = c["id"] if c["id"].startswith("functions.") else f"functions.{c['function']['name']}:{prior + i}"
            calls.append({**c, "id": tool_id})
        msg["tool_calls"] = calls
    return msg


def expected_sample(tok, record: dict[str, Any]) -> tuple[str, list[int], int]:
    """The K2.5 training sample built without reconstruction's code: (text, ids, prompt length).

    The target generated its answer right after the generation prompt's ``<think>``, so the sample is
    ``render(prompt, add_generation_prompt=True) + reasoning + "</think>" + content + tool calls + "<|im_end|>"``,
    and its prompt ids are the serving path's: the rendered text encoded with every special allowed.
    Where K2.5's template renders the answer itself, the answer comes from the template: a tool-call
    turn after the last plain assistant turn keeps its reasoning, so the finished conversation's render
    continues the prompt's with exactly that turn (its data specials located by marking, so they stay
    text). A plain turn is history to K2.5 (its reasoning dropped), so there the template only fixes
    the end ``</think>{content}<|im_end|>`` and the reasoning goes right after the prompt's ``<think>``.
    """
    messages, tools = record["messages"], record["tools"]
    final = final_message(record)
    prompt_text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=True)
    full_text = render_kimi_chat(tok.chat_template, [*messages, final], tools)
    reasoning, content = record["reasoning"] or "", record["content"] or ""
    if final.get("tool_calls"):
        assert full_text.startswith(prompt_text)
        turn_text = full_text[len(prompt_text) :]
        whole = encode_chat(tok, [*messages, final], tools, data_specials="ordinary")
        head = encode_chat(tok, messages, tools, add_generation_prompt=True, data_specials="ordinary")
        assert whole[: len(head)] == head
        turn_ids = whole[len(head) :]
    else:
        assert full_text.endswith(f"<think></think>{content}<|im_end|>")
        turn_text = f"{reasoning}</think>{content}<|im_end|>"
        turn_ids = [*tok.encode_ordinary(reasoning), tok.special_id("</think>"), *tok.encode_ordinary(content)]
        turn_ids.append(tok.eos_id)
    prompt_ids = tok.encode_with_special(prompt_text)
    return prompt_text + turn_text, prompt_ids + turn_ids, len(prompt_ids)


def check_against_template(tok, record: dict[str, Any]) -> Reconstruction:
    r = reconstruct(record, tok)
    text, ids, prompt_len = expected_sample(tok, record)
    assert r.input_ids == ids
    assert r.prompt_len == prompt_len
    assert r.loss_mask == [0] * r.prompt_len + [1] * r.completion_len
    assert len(r.input_ids) == r.prompt_len + r.completion_len
    assert r.input_ids[-1] == tok.eos_id
    # Lossless: decoding gives the rendered conversation text.
    assert tok.decode(r.input_ids) == text
    # The "ordinary" option changes the prompt's data specials only; the response is the model's either way.
    kept = reconstruct(record, tok, data_specials="ordinary")
    head = encode_chat(tok, record["messages"], record["tools"], add_generation_prompt=True, data_specials="ordinary")
    assert kept.input_ids[: kept.prompt_len] == head
    assert kept.input_ids[kept.prompt_len :] == r.input_ids[r.prompt_len :]
    assert tok.decode(kept.input_ids) == text
    return r


@SETTINGS
@given(record=records(native_ids=False))
def test_matches_template_plain_text(tok, record):
    r = check_against_template(tok, record)
    assume(not has_special_text(record, special_pattern(tok)))
    # With no special-looking text the naive whole-string encoding agrees too, and so do both options.
    text, _, _ = expected_sample(tok, record)
    assert r.input_ids == tok.encode_with_special(text)
    assert reconstruct(record, tok, data_specials="ordinary") == r


@SETTINGS
@given(record=records(specials=True))
def test_matches_template_with_special_looking_text(tok, record):
    check_against_template(tok, record)


@settings(max_examples=100, deadline=None)
@given(reasoning=texts(specials=True), content=texts(specials=True))
def test_model_special_text_stays_ordinary(tok, reasoning, content):
    record = {"messages": [{"role": "user", "content": "hi"}], "reasoning": reasoning, "content": content}
    assume("tool_call" not in content)
    r = reconstruct({**record, "finish_reason": "stop"}, tok)
    response = r.input_ids[r.prompt_len :]
    # Exactly two special ids in the response: the template's </think> and <|im_end|>.
    specials = [i for i in response if i in tok.id_to_special]
    assert specials == [tok.special_id("</think>"), tok.eos_id]
    assert tok.decode(response) == f"{reasoning}</think>{content}<|im_end|>"
    think_end = response.index(tok.special_id("</think>"))
    assert response[:think_end] == tok.encode_ordinary(reasoning)
    assert response[think_end + 1 : -1] == tok.encode_ordinary(content)


@SETTINGS
@given(record=records(specials=True))
def test_length_drops_only_what_was_not_generated(tok, record):
    done = reconstruct({**record, "finish_reason": "stop"}, tok)
    cut = reconstruct({**record, "finish_reason": "length"}, tok)
    assert cut.prompt_len == done.prompt_len and cut.loss_mask == [0] * cut.prompt_len + [1] * cut.completion_len
    if record["content"] or record["tool_calls"]:
        assert cut.input_ids == done.input_ids[:-1]  # no <|im_end|>
    else:
        assert cut.input_ids == done.input_ids[: done.prompt_len] + tok.encode_ordinary(record["reasoning"] or "")


def test_known_sample(tok):
    record = {
        "messages": [{"role": "user", "content": "Hello, world! 你好，世界！"}],
        "reasoning": "Greet back.",
        "content": "Hi!",
        "finish_reason": "stop",
    }
    r = reconstruct(record, tok)
    assert r.input_ids[3:12] == [19180, 11, 2695, 0, 220, 33845, 378, 2243, 856]
    assert tok.decode(r.input_ids) == (
        "<|im_user|>user<|im_middle|>Hello, world! 你好，世界！<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Greet back.</think>Hi!<|im_end|>"
    )
    # usage.completion_tokens counts reasoning, </think>, content and <|im_end|>.
    assert r.completion_len == len(tok.encode_ordinary("Greet back.")) + 1 + len(tok.encode_ordinary("Hi!")) + 1


def base(**kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "q"}], "tools": None, "tool_calls": None, **kw}


def response_text(tok, record) -> str:
    r = reconstruct(record, tok)
    return tok.decode(r.input_ids[r.prompt_len :])


def test_length_inside_reasoning(tok):
    for content in (None, ""):
        r = reconstruct(base(reasoning="Let me think about", content=content, finish_reason="length"), tok)
        assert r.input_ids[r.prompt_len :] == tok.encode_ordinary("Let me think about")
        assert r.input_ids[r.prompt_len - 1] == tok.special_id("<think>")


def test_length_inside_content(tok):
    r = reconstruct(base(reasoning="R", content="The answer is", finish_reason="length"), tok)
    assert r.input_ids[r.prompt_len :] == [
        *tok.encode_ordinary("R"),
        tok.special_id("</think>"),
        *tok.encode_ordinary("The answer is"),
    ]
    assert tok.eos_id not in r.input_ids[r.prompt_len :]


def test_other_finish_reasons(tok):
    for finish in ("content_filter", "error", None):
        assert response_text(tok, base(reasoning="r", content="A", finish_reason=finish)) == "r</think>A"
    assert response_text(tok, base(reasoning="r", content="A", finish_reason="eos")) == "r</think>A<|im_end|>"


def test_empty_response_and_missing_reasoning(tok):
    assert response_text(tok, base(reasoning=None, content="A", finish_reason="stop")) == "</think>A<|im_end|>"
    assert response_text(tok, base(reasoning=None, content=None, finish_reason="stop")) == "</think><|im_end|>"
    assert reconstruct(base(reasoning=None, content=None, finish_reason="length"), tok).completion_len == 0


def test_thinking_disabled(tok):
    record = base(reasoning=None, content="A", finish_reason="stop", chat_template_kwargs={"thinking": False})
    r = reconstruct(record, tok)
    assert tok.decode(r.input_ids).endswith("<think></think>A<|im_end|>")
    assert tok.decode(r.input_ids[r.prompt_len :]) == "A<|im_end|>"
    full = encode_chat(tok, [*record["messages"], {"role": "assistant", "content": "A"}], thinking=False)
    assert r.input_ids == full


def raw_call(tool_id: str, args: str) -> str:
    return f"{CALL_BEGIN}{tool_id}{ARGUMENT_BEGIN}{args}{CALL_END}"


def test_raw_tool_call_text_in_content(tok):
    args = '{"city": "<|im_end|> Paris"}'
    structured = base(
        reasoning="need weather",
        content="Checking.",
        tool_calls=[
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
        ],
        finish_reason="tool_calls",
    )
    expected = reconstruct(structured, tok).input_ids
    variants = [
        "Checking." + SECTION_BEGIN + raw_call("functions.get_weather:0", args) + SECTION_END,
        "Checking." + raw_call("functions.get_weather:0", args),  # section markers lost
        "Checking." + "<|tool_call_section_begin|>" + raw_call("functions.get_weather:0", args) + " ",
    ]
    for content in variants:
        raw = {**structured, "tool_calls": None, "content": content, "finish_reason": "stop"}
        assert reconstruct(raw, tok).input_ids == expected, content
    # The id and arguments are text; the <|im_end|> inside the arguments stays text as well.
    r = reconstruct(structured, tok)
    response = r.input_ids[r.prompt_len :]
    assert response.count(tok.eos_id) == 1 and response[-1] == tok.eos_id
    names = [tok.id_to_special[i] for i in response if i in tok.id_to_special]
    assert names == ["</think>", SECTION_BEGIN, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END, SECTION_END, "<|im_end|>"]


def test_raw_tool_call_truncated_by_length(tok):
    content = (
        "x" + SECTION_BEGIN + raw_call("functions.a:0", "{}") + CALL_BEGIN + "functions.b:1" + ARGUMENT_BEGIN + '{"q'
    )
    r = reconstruct(base(reasoning="r", content=content, finish_reason="length"), tok)
    response = r.input_ids[r.prompt_len :]
    assert tok.decode(response) == "r</think>" + content
    names = [tok.id_to_special[i] for i in response if i in tok.id_to_special]
    assert names == ["</think>", SECTION_BEGIN, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END, CALL_BEGIN, ARGUMENT_BEGIN]


def test_marker_text_that_is_not_a_tool_call_stays_text(tok):
    content = f"Kimi marks calls with {CALL_BEGIN} and {CALL_END}, like {raw_call('functions.f:0', '{}')} here."
    r = reconstruct(base(reasoning=None, content=content, finish_reason="stop"), tok)
    response = r.input_ids[r.prompt_len :]
    assert response == [tok.special_id("</think>"), *tok.encode_ordinary(content), tok.eos_id]


def test_provider_ids_are_normalised_with_a_conversation_counter(tok):
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "functions.a:0", "type": "function", "function": {"name": "a", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "functions.a:0", "content": "1"},
    ]
    calls = [{"id": "call_9f", "type": "function", "function": {"name": "b", "arguments": {"k": "ü"}}}]
    record = {
        "messages": messages,
        "reasoning": "r",
        "content": None,
        "tool_calls": calls,
        "finish_reason": "tool_calls",
    }
    text = response_text(tok, record)
    assert text == (
        f"r</think>{SECTION_BEGIN}{CALL_BEGIN}functions.b:1{ARGUMENT_BEGIN}{json.dumps({'k': 'ü'}, ensure_ascii=False)}"
        f"{CALL_END}{SECTION_END}<|im_end|>"
    )


def test_history_reasoning_is_dropped_in_the_prompt(tok):
    # The target saw its earlier turns without their reasoning (K2.5 renders history that way).
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "old thoughts"},
        {"role": "user", "content": "q2"},
    ]
    r = reconstruct({"messages": messages, "reasoning": "new", "content": "a2", "finish_reason": "stop"}, tok)
    text = tok.decode(r.input_ids)
    assert (
        "old thoughts" not in text and "<think></think>a1" in text and text.endswith("<think>new</think>a2<|im_end|>")
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(records(specials=True, finish=("stop", "tool_calls", "length")), min_size=1, max_size=8))
def test_batch_equals_single(tok, batch):
    singles = [reconstruct(r, tok) for r in batch]
    assert reconstruct_batch(batch, tok, num_threads=1) == singles
    assert reconstruct_batch(batch, tok, num_threads=3) == singles


def test_batch_threads_on_large_input(tok):
    # Above the size where threads are used, results must not change (ordering across chunks).
    big = [base(reasoning="word " * 2000 + str(i), content="x" * (i % 7), finish_reason="stop") for i in range(200)]
    assert reconstruct_batch(big, tok, num_threads=2) == [reconstruct(r, tok) for r in big]


def test_response_pieces_equal_rendered_assistant_turn(tok):
    # BPE never merges across </think> or the tool markers: each is a special token, so the
    # pieces encoded separately equal the encoding of the rendered turn.
    record = base(
        reasoning="a\n\n",
        content="\n b",
        tool_calls=[{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": " {} \n"}}],
        finish_reason="tool_calls",
    )
    segments = response_segments(tok, record)
    ids = encode_segments(tok, segments)
    turn = "a\n\n</think>\n b" + SECTION_BEGIN + raw_call("functions.f:0", " {} \n") + SECTION_END + "<|im_end|>"
    assert ids == tok.encode_with_special(turn)
