"""Rebuilt prompt lengths equal the simulator's ``usage.prompt_tokens`` (real HTTP on 127.0.0.1).

The simulator counts prompts with the serving stack's renderer, and the tokenized partitions rebuild
prompts with it, so on tool datasets (TypeScript declarations, and the JSON fallback), multi-turn
chats and special-token look-alikes the two agree exactly: the prompt-token difference is 0.
"""

import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from eagle_assets.corpus.tokenize_partition import tokenize_generated
from eagle_assets.datasets.prompts import Prompt
from eagle_assets.datasets.samples import sample_rows
from eagle_assets.generation.records import records_to_frame, success_record
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.simulator.harness import run_simulator_in_thread

KNOWN = Path(__file__).parents[1] / "fixtures" / "kimi" / "tools_ts.jsonl"


def prompt_rows() -> list[dict[str, Any]]:
    rows = [r for name in ("B4", "B7", "B8", "B5") for r in sample_rows(name, 6)]
    known = [json.loads(line) for line in KNOWN.read_text(encoding="utf-8").splitlines()]
    rows += [{"id": f"known-{i}", "messages": d["messages"], "tools": d["tools"]} for i, d in enumerate(known)]
    call = {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    rows.append(
        {
            "id": "tool-result",
            "tools": rows[0]["tools"],
            "messages": [
                {"role": "user", "content": "Weather in Paris? Reply with [EOS] at the end."},
                {"role": "assistant", "content": None, "reasoning_content": "look it up", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny <think>"},
            ],
        }
    )
    return rows


async def test_prompt_token_difference_is_zero_against_the_simulator(tok, tmp_path):
    rows = prompt_rows()
    records = []
    config = SimulatorConfig(latency=LatencyConfig.fixed(0.0), mean_completion_tokens=40, tokenizer_dir=tok.directory)
    with run_simulator_in_thread(config) as sim:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-or-test"}) as session:
            for i, row in enumerate(rows):
                body: dict[str, Any] = {"model": "moonshotai/kimi-k2.5", "max_tokens": 256, "messages": row["messages"]}
                if row.get("tools"):
                    body["tools"] = row["tools"]
                async with session.post(f"{sim.base_url}/chat/completions", data=orjson.dumps(body)) as r:
                    assert r.status == 200, await r.text()
                    answer = orjson.loads(await r.read())
                prompt = Prompt(row["id"], row["messages"], row.get("tools"), line=i + 1, index=i)
                records.append(
                    success_record(prompt, answer, attempts=1, latency_s=0.0, reservation_id=f"r{i}", cost=0.0)
                )
    path = tmp_path / "0000.parquet"
    records_to_frame(records).write_parquet(path)
    out, summary = tokenize_generated(path, "T", "0000", tok)

    assert summary.samples == len(rows)
    assert summary.prompt_nonzero_diffs == 0 and summary.prompt_tokens == summary.api_prompt_tokens > 0
    assert summary.nonzero_diffs == 0 and summary.completion_tokens == summary.api_completion_tokens
    by_id = {r["prompt_id"]: r for r in out}
    # The tool datasets carry TypeScript declarations in their ids; the JSON fallback stays JSON.
    for row in rows:
        prompt = tok.decode(by_id[row["id"]]["input_ids"][: by_id[row["id"]]["prompt_len"]])
        if row.get("tools") and row["id"] not in ("known-5", "known-7", "known-13"):
            assert "namespace functions {\n" in prompt and '"type":"function"' not in prompt
        elif row.get("tools"):
            assert prompt.startswith('<|im_system|>tool_declare<|im_middle|>[{"function":{"description":')
    # A special-token look-alike in user text is its id in the prompt (B8 asks to print <|im_end|>).
    b8 = next(r for r in rows if r["id"].startswith("b8") and "<|im_end|>" in r["messages"][0]["content"])
    ids = by_id[b8["id"]]["input_ids"][: by_id[b8["id"]]["prompt_len"]]
    assert ids.count(tok.eos_id) == 2  # the user's and the turn's own
