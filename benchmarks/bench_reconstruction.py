"""Reconstruction throughput: synthetic generated records, ~10M response tokens by default.

Records mix prose, code, CJK and emoji, multi-turn prompts, tool calls, and a few length-truncated
samples; 60% carry one of ``--tool-lists`` distinct tool lists with realistic schemas (nested
objects, enums, arrays, ``$defs``, defaults; one list falls back to JSON), declared in TypeScript
as Kimi K2.5's tokenizer does, the conversion cached per distinct list. Measured in the same run:

- baseline: per record, render the prompt with the generation prompt, append the response text and
  ``encode_with_special`` the whole string (the naive approach; also wrong when the response
  contains special-looking strings);
- ``reconstruct`` called per record;
- ``reconstruct_batch`` (all ordinary text encoded in one threaded pass, each distinct text once).

Printed: response tokens/s, projected seconds for 10M response tokens, the ratio to the baseline,
the tool-declaration cache's hits and misses, and what converting every record's tools without the
cache would have cost. The ids of all three are checked equal on this special-free data.

    python benchmarks/bench_reconstruction.py                 # ~10M response tokens
    python benchmarks/bench_reconstruction.py --tokens 500000 # smaller, for a smoke run
    taskset -c 0,1 python benchmarks/bench_reconstruction.py --threads 2   # the 2-core budget: < 30 s
"""

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle_assets.tokenization.chat_encoding import render_kimi_chat  # noqa: E402
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer  # noqa: E402
from eagle_assets.tokenization.reconstruction import (  # noqa: E402
    effective_tool_calls,
    reconstruct,
    reconstruct_batch,
)
from eagle_assets.tokenization.tool_declaration import DECLARATIONS, _declare  # noqa: E402

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


def tool_lists(n: int, seed: int = 0) -> list[list[dict[str, Any]]]:
    """``n`` distinct tool lists of 1-4 functions with schemas like real ones; the last uses ``oneOf``,
    which the real tokenizer cannot convert (so it is declared as JSON)."""
    rng = random.Random(seed)

    def function(name: str, k: int) -> dict[str, Any]:
        props: dict[str, Any] = {
            "query": {"type": "string", "description": "What to look for.\nBe specific.", "maxLength": 200},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "mode": {"type": "string", "enum": ["fast", "thorough", "auto"], "default": "auto"},
            "filters": {
                "type": "object",
                "description": "Optional filters",
                "properties": {
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                    "since": {"type": ["string", "null"], "format": "date"},
                    "where": {"$ref": "#/$defs/Place"},
                },
                "additionalProperties": False,
            },
            "extra": {"type": "object", "additionalProperties": {"type": "number"}},
            "ids": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
        }
        chosen = dict(rng.sample(sorted(props.items()), k=rng.randint(2, len(props))))
        params: dict[str, Any] = {"type": "object", "properties": chosen, "required": [next(iter(chosen))]}
        params["$defs"] = {
            "Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        }
        return {
            "type": "function",
            "function": {"name": name, "description": f"Tool {name} ({k}).", "parameters": params},
        }

    lists = []
    for i in range(n):
        names = rng.sample(["search", "get_weather", "run_sql", "open_url", "send_mail", "calc", "translate"], k=4)
        lists.append([function(name, i) for name in names[: rng.randint(1, 4)]])
    if lists:
        lists[-1][0]["function"]["parameters"]["properties"]["shape"] = {
            "oneOf": [{"type": "string"}, {"type": "number"}]
        }
    return lists


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


def make_records(
    n_response_tokens: int, chars_per_token: float, tools: list[list[dict[str, Any]]], seed: int = 0
) -> list[dict[str, Any]]:
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
        # Each record's tools are its own parsed copy, as rows read from Parquet are.
        record_tools = json.loads(json.dumps(tools[i % len(tools)])) if tools and i % 5 < 3 else None
        record: dict[str, Any] = {
            "messages": messages,
            "tools": record_tools,
            "reasoning": reasoning,
            "content": content,
            "tool_calls": None,
            "finish_reason": "length" if i % 50 == 0 else "stop",
        }
        if record_tools and i % 5 == 0:
            name = record_tools[0]["function"]["name"]
            record["tool_calls"] = [
                {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": '{"q": "x"}'}}
            ]
            record["finish_reason"] = "tool_calls"
        records.append(record)
        made += len(reasoning) + len(content)
        i += 1
    return records


def response_text(r: dict[str, Any]) -> str:
    """The finished turn as the target generated it after the prompt's ``<think>``."""
    section = ""
    if r["tool_calls"]:
        calls = effective_tool_calls(r["tool_calls"], 0)
        body = "".join(
            f"<|tool_call_begin|>{c['id']}<|tool_call_argument_begin|>{c['function']['arguments']}<|tool_call_end|>"
            for c in calls
        )
        section = f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
    return f"{r['reasoning']}</think>{r['content']}{section}<|im_end|>"


def baseline(tok: KimiTokenizer, records: list[dict[str, Any]]) -> list[list[int]]:
    template = tok.chat_template
    if template is None:
        raise SystemExit("the bundled Kimi tokenizer has no chat template: nothing to render the baseline with")
    out = []
    for r in records:
        prompt = render_kimi_chat(template, r["messages"], r["tools"], add_generation_prompt=True)
        out.append(tok.encode_with_special(prompt + response_text(r)))
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
    ap.add_argument("--tool-lists", type=int, default=12, help="distinct tool lists across the records")
    args = ap.parse_args()

    tok = load_kimi_tokenizer()
    sample = synthetic_text(random.Random(1), 200_000)
    chars_per_token = len(sample) / len(tok.encode_ordinary(sample))
    tools = tool_lists(args.tool_lists)
    records, gen_s, _ = timed(lambda: make_records(args.tokens, chars_per_token, tools))
    with_tools = sum(1 for r in records if r["tools"])
    print(f"records: {len(records)} (generated in {gen_s:.1f}s), {chars_per_token:.2f} chars/token")
    print(f"with tools: {with_tools} records, {len(tools)} distinct tool lists")
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

    # What the cache saves: converting each record's tools (deep sort + TypeScript) with no cache at all.
    t0 = time.perf_counter()
    for r in records:
        if r["tools"]:
            _declare(r["tools"])
    uncached_s = time.perf_counter() - t0
    DECLARATIONS.clear()
    _, cached_s, _ = timed(lambda: [DECLARATIONS.get(r["tools"]) for r in records if r["tools"]])
    declared = [_declare(t) for t in tools]
    print(
        f"tool declarations: {sum(d.tools_ts_str is not None for d in declared)} TypeScript, "
        f"{sum(d.tools_ts_str is None for d in declared)} JSON fallback; cache {DECLARATIONS.misses} misses, "
        f"{DECLARATIONS.hits} hits; {cached_s:.3f}s cached vs {uncached_s:.3f}s converting every record's tools"
    )

    base_ids, single, batch = outputs.values()
    # Sanity: the same ids everywhere, except that "length" samples lack the template's endings.
    complete = [i for i, r in enumerate(records) if r["finish_reason"] != "length"]
    assert all(single[i].input_ids == base_ids[i] for i in complete), "reconstruct != baseline"
    assert [b.input_ids for b in batch] == [s.input_ids for s in single], "batch != single"
    response_tokens = sum(r.completion_len for r in batch)
    all_tokens = sum(len(r.input_ids) for r in batch)
    print(f"response tokens: {response_tokens:,}  (all tokens incl. prompts: {all_tokens:,})")
    ts_records = [b for b, r in zip(batch, records, strict=True) if r["tools"]]
    mean_prompt = sum(b.prompt_len for b in ts_records) / max(1, len(ts_records))
    print(f"prompt tokens of records with tools: mean {mean_prompt:.0f}")

    base_wall = best["baseline (render+encode)"][0]
    for name, (wall, cpu) in best.items():
        rate = response_tokens / wall
        print(
            f"{name:<28} {wall:6.2f}s wall {cpu:6.2f}s cpu  {rate / 1e6:5.2f}M resp tok/s  "
            f"10M tokens in {10_000_000 / rate:6.2f}s  vs baseline x{base_wall / wall:.2f}"
        )


if __name__ == "__main__":
    main()
