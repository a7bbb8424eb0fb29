"""Prompt-token estimates for worst-case reservations, from the real tokenizer.

The estimate only has to be an upper bound in practice (the runner adds a margin): it counts every
text field with the Kimi encoder plus a few tokens of chat-template framing per message.
"""

from collections.abc import Callable
from typing import Any

import orjson

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer

FRAMING_TOKENS_PER_MESSAGE = 8


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return []


def tokenizer_estimator(tokenizer: KimiTokenizer) -> Callable[[Prompt], int]:
    def estimate(prompt: Prompt) -> int:
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

    return estimate
