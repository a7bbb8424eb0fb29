"""Reconstruction throughput: synthetic generated records, ~10M response tokens by default.

Records mix prose, code, CJK and emoji, multi-turn prompts, tools and tool calls, and a few
length-truncated samples. Measured in the same run:

- baseline: per record, render the whole finished conversation and ``encode_with_special`` it
  (the naive approach; also wrong when the text contains special-looking strings);
- ``reconstruct`` called per record;
- ``reconstruct_batch`` (all ordinary text encoded in one threaded pass).

Printed: response tokens/s, projected seconds for 10M response tokens, and the ratio to the
baseline. The ids of all three are checked equal on this special-free data.

    python benchmarks/bench_reconstruction.py                 # ~10M response tokens
    python benchmarks/bench_reconstruction.py --tokens 500000 # smaller, for a smoke run
"""

import argparse
import gc
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.tokenization.chat_template import render_chat  # noqa: E402
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer  # noqa: E402
from eagle_assets.tokenization.reconstruction import (  # noqa: E402
    assistant_message,
    reconstruct,
    reconstruct_batch,
)

_WORD_TEXT = """
the of and to in is that for it as with was on be by this are or from at which an but not have has we can
model token training data draft speculative decoding attention layer hidden state gradient loss batch
however therefore because function return value list dict string integer error result example
"""
WORDS = _WORD_TEXT.split()
CODE = [
    "def f(x):\n    return x + 1\n",
    "for i in range(10):\n    print(i)\n",
    "import numpy as np\n",
    "if (a && b) { return -1; }\n",
    "    ",
    "\n\n",
]
OTHER = [
    "你好",
    "世界",
    "模型",
    "训练",
    "数据",
    "。",
    "，",
    "😀",
    "🚀",
    "é",
    "123",
    "4096",
    "3.14",
    "(",
    ")",
    ":",
    "-",
    "**",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def synthetic_text(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        r = rng.random()
        if r < 0.85:
            piece = " ".join(rng.choices(WORDS, k=12)) + rng.choice([". ", ", ", "\n", "? "])
        elif r < 0.95:
            piece = rng.choice(CODE)
        else:
            piece = "".join(rng.choices(OTHER, k=6))
        out.append(piece)
        size += len(piece)
    return "".join(out)


def make_records(n_response_tokens: int, chars_per_token: float, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    total_chars = int(n_response_tokens * chars_per_token)
    made = 0
    i = 0
    while made < total_chars:
        resp_chars = rng.randint(800, 14_000)
        reasoning = synthetic_text(rng, int(resp_chars * 0.6))
        content = synthetic_text(rng, int(resp_chars * 0.4))
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
        if i % 3 == 0:
            messages += [
                {"role": "user", "content": synthetic_text(rng, 300)},
                {"role": "assistant", "content": synthetic_text(rng, 400)},
            ]
        messages.append({"role": "user", "content": synthetic_text(rng, rng.randint(50, 1500))})
        record: dict[str, Any] = {
            "messages": messages,
            "tools": TOOLS if i % 5 == 0 else None,
            "reasoning": reasoning,
            "content": content,
            "tool_calls": None,
            "finish_reason": "length" if i % 50 == 0 else "stop",
        }
        if i % 5 == 0:
            record["tool_calls"] = [
                {
                    "id": "functions.search:0",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "x"}'},
                }
            ]
            record["finish_reason"] = "tool_calls"
        records.append(record)
        made += len(reasoning) + len(content)
        i += 1
    return records


def baseline(tok: KimiTokenizer, records: list[dict[str, Any]]) -> list[list[int]]:
    out = []
    for r in records:
        full = [*r["messages"], assistant_message(r)]
        out.append(tok.encode_with_special(render_chat(tok.chat_template, full, r["tools"], preserve_thinking=True)))
    return out


def timed(fn: Any) -> tuple[Any, float, float]:
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000, help="approximate response tokens to generate")
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds; the best wall time of each is kept")
    args = ap.parse_args()

    tok = load_kimi_tokenizer()
    sample = synthetic_text(random.Random(1), 200_000)
    chars_per_token = len(sample) / len(tok.encode_ordinary(sample))
    records, gen_s, _ = timed(lambda: make_records(args.tokens, chars_per_token))
    print(f"records: {len(records)} (generated in {gen_s:.1f}s), {chars_per_token:.2f} chars/token")
    print(f"cpus: {os.cpu_count()}, threads: {args.threads}, load average: {os.getloadavg()[0]:.2f}")

    variants = {
        "baseline (render+encode)": lambda: baseline(tok, records),
        "reconstruct (per record)": lambda: [reconstruct(r, tok) for r in records],
        f"reconstruct_batch (t={args.threads})": lambda: reconstruct_batch(records, tok, num_threads=args.threads),
    }
    best: dict[str, tuple[float, float]] = {}
    outputs: dict[str, Any] = {}
    for _ in range(args.repeat):
        for name, fn in variants.items():
            outputs[name] = None  # free the previous round's output before timing again
            outputs[name], wall, cpu = timed(fn)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)

    base_ids, single, batch = outputs.values()
    # Sanity: the same ids everywhere, except that "length" samples lack the template's endings.
    complete = [i for i, r in enumerate(records) if r["finish_reason"] != "length"]
    assert all(single[i].input_ids == base_ids[i] for i in complete), "reconstruct != baseline"
    assert [b.input_ids for b in batch] == [s.input_ids for s in single], "batch != single"
    response_tokens = sum(r.completion_len for r in batch)
    all_tokens = sum(len(r.input_ids) for r in batch)
    print(f"response tokens: {response_tokens:,}  (all tokens incl. prompts: {all_tokens:,})")

    base_wall = best["baseline (render+encode)"][0]
    for name, (wall, cpu) in best.items():
        rate = response_tokens / wall
        print(
            f"{name:<28} {wall:6.2f}s wall {cpu:6.2f}s cpu  {rate / 1e6:5.2f}M resp tok/s  "
            f"10M tokens in {10_000_000 / rate:6.2f}s  vs baseline x{base_wall / wall:.2f}"
        )


if __name__ == "__main__":
    main()
