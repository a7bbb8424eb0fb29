"""Benchmark conversations as the token ids the serving stack builds from them, turn after turn.

The engines are sent token ids rendered exactly as this project renders its training data (Kimi K2.5 chat
template, generation prompt, the target's thinking setting). A later turn carries the target's own earlier
answers as history, split at ``</think>`` into ``reasoning_content`` and ``content`` as the template expects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eagle_assets.benchmarks.prompt_sets import Conversation

THINK_END = "</think>"
_END_MARKERS = ("<|im_end|>", "[EOS]")

Render = Callable[[Sequence[dict[str, Any]]], list[int]]


def assistant_turn(text: str) -> dict[str, Any]:
    """An answer's text (special tokens kept) as the assistant message of the next turn's history."""
    body = text
    for marker in _END_MARKERS:
        if body.endswith(marker):
            body = body[: -len(marker)]
    msg: dict[str, Any] = {"role": "assistant"}
    if THINK_END in body:
        reasoning, content = body.split(THINK_END, 1)
        msg["reasoning_content"] = reasoning.removeprefix("<think>")
        msg["content"] = content
    else:
        msg["content"] = body
    return msg


def turn_messages(conv: Conversation, turn: int, answers: Sequence[str]) -> list[dict[str, Any]]:
    """The chat for ``turn`` (0-based): system, earlier turns with the target's answers, this user turn."""
    if len(answers) < turn:
        raise ValueError(f"turn {turn} of {conv.id} needs {turn} earlier answers, got {len(answers)}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": conv.system}] if conv.system else []
    for i in range(turn):
        messages += [{"role": "user", "content": conv.user_turns[i]}, assistant_turn(answers[i])]
    messages.append({"role": "user", "content": conv.user_turns[turn]})
    return messages


def kimi_renderer(thinking: bool, tokenizer: Any = None) -> Render:
    """Token ids of a chat with the generation prompt, through the bundled (or configured) Kimi tokenizer."""
    from eagle_assets.tokenization.chat_encoding import configured_data_specials, encode_chat
    from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer

    tok = tokenizer or load_kimi_tokenizer()
    specials = configured_data_specials()

    def render(messages: Sequence[dict[str, Any]]) -> list[int]:
        return encode_chat(tok, list(messages), add_generation_prompt=True, data_specials=specials, thinking=thinking)

    return render


def prompt_ids(conv: Conversation, turn: int, answers: Sequence[str], render: Render) -> list[int]:
    if conv.prompt_ids is not None:
        if turn:
            raise ValueError(f"{conv.id} is a single pre-tokenized turn")
        return list(conv.prompt_ids)
    return render(turn_messages(conv, turn, answers))
