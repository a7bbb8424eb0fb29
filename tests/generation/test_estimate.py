"""Prompt-token estimates: the exact serving-path length, and a rough bound when the template cannot render."""

import json
from pathlib import Path

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.estimate import rough_prompt_tokens, tokenizer_estimator
from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer

KNOWN = Path(__file__).parents[1] / "fixtures" / "kimi" / "tools_ts.jsonl"


def test_estimate_is_the_real_prompt_length():
    tok = load_kimi_tokenizer("bundled")
    estimate = tokenizer_estimator(tok)
    for i, line in enumerate(KNOWN.read_text(encoding="utf-8").splitlines()):
        d = json.loads(line)
        prompt = Prompt(f"k{i}", d["messages"], d["tools"], line=i + 1, index=i)
        assert estimate(prompt) == len(d["prompt_ids"])  # the real tokenizer's count (thinking on)
        assert tokenizer_estimator(tok, "ordinary")(prompt) >= estimate(prompt)  # look-alikes cost more as text


def test_unrenderable_prompt_falls_back_to_a_rough_bound():
    tok = load_kimi_tokenizer("bundled")
    broken = Prompt("b", [{"role": "assistant", "content": "x" * 50, "tool_calls": [5]}], None, line=1, index=0)
    rough = rough_prompt_tokens(tok, broken)
    assert tokenizer_estimator(tok)(broken) == rough >= 8 + len(tok.encode_ordinary("x" * 50))
