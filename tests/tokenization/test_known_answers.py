"""Every known answer of the real Kimi K2.5 tokenizer code (``tokenization_kimi.py`` + ``tool_declaration_ts.py``).

``tests/fixtures/kimi/tools_ts.jsonl``: tool lists and chats with the exact ``tools_ts_str`` (null
where the real encoder fell back to JSON), the rendered ``prompt_text`` and the ``prompt_ids``, with
thinking on and the generation prompt added; the last three lines carry special-token look-alikes
in user text. Each line must come out identically from every path that builds prompt ids: the
tokenizer-level encoder and reconstruction of a generated sample (whose response must be unaffected).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from eagle_assets.tokenization.chat_encoding import encode_chat, render_kimi_chat
from eagle_assets.tokenization.reconstruction import prompt_token_ids, reconstruct
from eagle_assets.tokenization.tool_declaration import declare_tools

FIXTURE = Path(__file__).parents[1] / "fixtures" / "kimi" / "tools_ts.jsonl"
LINES: list[dict[str, Any]] = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


def test_the_fixture_is_complete():
    assert len(LINES) == 19
    assert sum(1 for d in LINES if d["tools"] and d["tools_ts_str"] is None) == 3  # JSON fallbacks
    assert sum(1 for d in LINES if not d["tools"]) == 3  # special-token look-alikes, no tools


@pytest.mark.parametrize("line", LINES, ids=[f"line{i}" for i in range(len(LINES))])
def test_known_answer(tok, line):
    messages, tools, thinking = line["messages"], line["tools"], line["thinking"]
    declaration = declare_tools(tools)
    # tools_ts_str: null where upstream's conversion failed; "" (no function tool) prints JSON too.
    assert (declaration.tools_ts_str or None) == line["tools_ts_str"]

    text = render_kimi_chat(tok.chat_template, messages, tools, add_generation_prompt=True, thinking=thinking)
    assert text == line["prompt_text"]
    ids = encode_chat(tok, messages, tools, add_generation_prompt=True, thinking=thinking)
    assert ids == line["prompt_ids"]
    kwargs = {"thinking": thinking}
    assert prompt_token_ids(tok, messages, tools, chat_template_kwargs=kwargs) == line["prompt_ids"]

    # A generated sample on this prompt: the prompt part is the known ids, the response is unaffected.
    call = None
    if tools:
        name = tools[0]["function"]["name"]
        call = {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": "{}"}}
    record = {
        "messages": messages,
        "tools": tools,
        "chat_template_kwargs": kwargs,
        "reasoning": "Look at <|im_end|> literally.",
        "content": "Done [EOS]",
        "tool_calls": [call] if call else None,
        "finish_reason": "tool_calls" if call else "stop",
    }
    r = reconstruct(record, tok)
    assert r.input_ids[: r.prompt_len] == line["prompt_ids"]
    expected_response = [
        *tok.encode_ordinary(record["reasoning"]),
        tok.special_id("</think>"),
        *tok.encode_ordinary(record["content"]),
    ]
    if call:
        expected_response += [
            tok.special_id("<|tool_calls_section_begin|>"),
            tok.special_id("<|tool_call_begin|>"),
            *tok.encode_ordinary(call["id"]),
            tok.special_id("<|tool_call_argument_begin|>"),
            *tok.encode_ordinary("{}"),
            tok.special_id("<|tool_call_end|>"),
            tok.special_id("<|tool_calls_section_end|>"),
        ]
    assert r.input_ids[r.prompt_len :] == [*expected_response, tok.eos_id]
    # The explicit "ordinary" option keeps the response too, and differs only where user text looks special.
    kept = reconstruct(record, tok, data_specials="ordinary")
    assert kept.input_ids[kept.prompt_len :] == r.input_ids[r.prompt_len :]
    has_special_text = any(name in m["content"] for m in messages for name in tok.special_tokens)
    assert (kept.input_ids[: kept.prompt_len] != line["prompt_ids"]) == has_special_text
