"""Prompt-token estimates for worst-case reservations, from the real tokenizer.

The estimate is the prompt's exact length as the serving stack builds it (the ids the provider bills as
``usage.prompt_tokens``), so a reservation is neither short on tool-heavy prompts nor inflated by raw JSON. A
prompt the chat template cannot render (the provider will refuse it) falls back to a rough upper bound.
"""

from collections.abc import Callable
from typing import Any

import orjson

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.tokenization.chat_encoding import DataSpecials, configured_data_specials
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer
from eagle_assets.tokenization.reconstruction import prompt_token_ids

FRAMING_TOKENS_PER_MESSAGE = 8


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return []


def rough_prompt_tokens(tokenizer: KimiTokenizer, prompt: Prompt) -> int:
    """An upper bound without the template: every text field encoded, tools as JSON, framing per message."""
    pieces: list[str] = []
    for m in prompt.messages:
        pieces += _texts(m.get("content"))
        pieces += _texts(m.get("reasoning_content") or m.get("reasoning"))
        if m.get("tool_calls"):
            pieces.append(orjson.dumps(m["tool_calls"]).decode())
    if prompt.tools:
        pieces.append(orjson.dumps(prompt.tools).decode())
    tokens = sum(len(x) for x in tokenizer.encoding.encode_ordinary_batch(pieces, num_threads=1)) if pieces else 0
    return tokens + FRAMING_TOKENS_PER_MESSAGE * (len(prompt.messages) + 1)


def tokenizer_estimator(tokenizer: KimiTokenizer, data_specials: DataSpecials | None = None) -> Callable[[Prompt], int]:
    """``estimate(prompt)``: the exact prompt length, or ``rough_prompt_tokens`` when it cannot be rendered."""
    mode = data_specials or configured_data_specials()

    def estimate(prompt: Prompt) -> int:
        try:
            return len(prompt_token_ids(tokenizer, prompt.messages, prompt.tools, data_specials=mode))
        except Exception:  # jinja errors, malformed messages: the request will be refused; reserve generously
            return rough_prompt_tokens(tokenizer, prompt)

    return estimate
