"""Small synthetic generated and tokenized partitions, written the way the pipeline writes them."""

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl

from eagle_assets.corpus.tokenized_schema import EOT_ID, TOKENIZED_SCHEMA, tokenized_row, write_tokenized
from eagle_assets.generation.records import PARQUET_SCHEMA
from tests.corpus.synthetic import synthetic_tokenized_table

PROVIDER = "moonshotai"
ALLOWED = {"moonshotai", "groq"}


def generated_row(prompt_id: str, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "prompt_id": prompt_id,
        "messages": orjson.dumps([{"role": "user", "content": f"question {prompt_id}"}]).decode(),
        "tools": None,
        "reasoning": "Let me think.",
        "content": "The answer.",
        "tool_calls": None,
        "finish_reason": "stop",
        "truncated": False,
        "provider": PROVIDER,
        "model": "moonshotai/kimi-k2.5",
        "prompt_tokens": 12,
        "completion_tokens": 40,
        "reasoning_tokens": 10,
        "cost": 0.0001,
        "generation_id": f"gen-{prompt_id}",
        "latency_s": 1.5,
        "attempts": 1,
    }
    row.update(overrides)
    return row


def write_generated(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows, schema=PARQUET_SCHEMA).write_parquet(path)
    return path


def good_generated(root: Path, dataset: str = "B1", shards: int = 2, n: int = 6) -> list[Path]:
    return [
        write_generated(
            root / "generated" / dataset / f"{s:05d}.parquet",
            [generated_row(f"{dataset}-{s}-{i}") for i in range(n)],
        )
        for s in range(shards)
    ]


class Recon:
    """A ``Reconstruction`` look-alike: prompt with a history turn's ``<|im_end|>``, then the response."""

    def __init__(self, prompt_len: int, completion_len: int, ended: bool, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        prompt = rng.integers(0, 160_000, prompt_len).tolist()
        if prompt_len >= 5:
            prompt[-4] = EOT_ID
        completion = rng.integers(0, 160_000, completion_len).tolist()
        if ended:
            completion[-1] = EOT_ID
        self.input_ids = prompt + completion
        self.loss_mask = [0] * prompt_len + [1] * completion_len
        self.prompt_len = prompt_len
        self.completion_len = completion_len


def tok_row(prompt_id: str, finish_reason: str = "stop", **overrides: Any) -> dict[str, Any]:
    ended = finish_reason in ("stop", "tool_calls")
    recon = overrides.pop("recon", None) or Recon(10, 20, ended, seed=zlib.crc32(prompt_id.encode()))
    row = tokenized_row(
        recon,
        prompt_id=prompt_id,
        dataset=overrides.pop("dataset", "B1"),
        shard=overrides.pop("shard", "00000"),
        api_completion_tokens=overrides.pop("api_completion_tokens", recon.completion_len),
        finish_reason=finish_reason,
        provider=overrides.pop("provider", PROVIDER),
    )
    row.update(overrides)
    return row


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    write_tokenized(path, rows)
    return path


def tokenized_dataset(
    root: Path,
    datasets: tuple[str, ...] = ("B1", "B2", "B3"),
    shards: int = 2,
    n: int = 40,
    seed: int = 0,
    lengths: tuple[int, int] = (20, 200),
    row_group_rows: int = 16,
) -> list[Path]:
    """``tokenized/<dataset>/<shard>.parquet`` files of valid rows; small row groups to exercise batching."""
    rng = np.random.default_rng(seed)
    paths = []
    for ds in datasets:
        for s in range(shards):
            shard = f"{s:05d}"
            table = synthetic_tokenized_table(
                rng, n, dataset=ds, shard=shard, lengths=rng.integers(lengths[0], lengths[1], n)
            )
            path = root / "tokenized" / ds / f"{shard}.parquet"
            write_tokenized(path, table, row_group_rows=row_group_rows)
            paths.append(path)
    return paths


def read_tokenized(path: Path) -> pl.DataFrame:
    """A whole partition as polars, with ``TOKENIZED_SCHEMA``."""
    # polars types the mapping's keys as column names or selectors, and a Mapping is invariant in its key type.
    return pl.read_parquet(path).cast(TOKENIZED_SCHEMA)  # type: ignore[arg-type]
