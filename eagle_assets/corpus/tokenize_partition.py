"""Generated Parquet partition → tokenized rows: exact ids, loss mask, and the API's token counts.

The comparison with ``usage.completion_tokens`` is what proves the reconstruction: a drift means
our ids are not what the target produced. ``usage.prompt_tokens`` proves the prompt the same way
(template, TypeScript tool declaration, special-token handling): it is compared with ``prompt_len``.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from eagle_assets.corpus.tokenized_schema import tokenized_row
from eagle_assets.tokenization.chat_encoding import DataSpecials, configured_data_specials
from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer
from eagle_assets.tokenization.reconstruction import reconstruct_batch


def _json(value: str | None) -> Any:
    return None if value is None else orjson.loads(value)


@dataclass(frozen=True)
class TokenizeSummary:
    samples: int
    tokens: int
    completion_tokens: int
    api_completion_tokens: int
    nonzero_diffs: int
    prompt_tokens: int
    api_prompt_tokens: int
    prompt_nonzero_diffs: int  # samples whose rebuilt prompt length differs from usage.prompt_tokens

    @property
    def relative_diff(self) -> float:
        return abs(self.completion_tokens - self.api_completion_tokens) / max(1, self.api_completion_tokens)

    @property
    def prompt_relative_diff(self) -> float:
        return abs(self.prompt_tokens - self.api_prompt_tokens) / max(1, self.api_prompt_tokens)


def tokenize_generated(
    generated: Path,
    dataset: str,
    shard: str,
    tokenizer: KimiTokenizer,
    native_counts: dict[str, int] | None = None,
    data_specials: DataSpecials | None = None,
) -> tuple[list[dict[str, Any]], TokenizeSummary]:
    """``native_counts``: prompt id → the provider's native completion count, where it was fetched;
    ``data_specials``: prompt special-token handling (default: ``configured_data_specials()``)."""
    native_counts = native_counts or {}
    frame = pl.read_parquet(generated)
    records = [
        {**r, "messages": _json(r["messages"]), "tools": _json(r["tools"]), "tool_calls": _json(r["tool_calls"])}
        for r in frame.iter_rows(named=True)
    ]
    recons = reconstruct_batch(records, tokenizer, data_specials=data_specials or configured_data_specials())
    rows = [
        tokenized_row(
            rc,
            prompt_id=r["prompt_id"],
            dataset=dataset,
            shard=shard,
            api_completion_tokens=int(r["completion_tokens"] or 0),
            finish_reason=r["finish_reason"],
            provider=r["provider"],
            native_completion_tokens=native_counts.get(r["prompt_id"]),
        )
        for rc, r in zip(recons, records, strict=True)
    ]
    summary = TokenizeSummary(
        samples=len(rows),
        tokens=sum(r["n_tokens"] for r in rows),
        completion_tokens=sum(r["completion_len"] for r in rows),
        api_completion_tokens=sum(r["api_completion_tokens"] for r in rows),
        nonzero_diffs=sum(1 for r in rows if r["token_diff"]),
        prompt_tokens=sum(rc.prompt_len for rc in recons),
        api_prompt_tokens=sum(int(r["prompt_tokens"] or 0) for r in records),
        prompt_nonzero_diffs=sum(
            1 for rc, r in zip(recons, records, strict=True) if rc.prompt_len != int(r["prompt_tokens"] or 0)
        ),
    )
    return rows, summary
