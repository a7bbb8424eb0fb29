"""The shape of one generated sample, as journaled and as written to Parquet."""

import time
from typing import Any

import orjson
import polars as pl

from eagle_assets.datasets.prompts import Prompt

PARQUET_SCHEMA: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "messages": pl.String(),
    "tools": pl.String(),
    "reasoning": pl.String(),
    "content": pl.String(),
    "tool_calls": pl.String(),
    "finish_reason": pl.String(),
    "truncated": pl.Boolean(),
    "provider": pl.String(),
    "model": pl.String(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "reasoning_tokens": pl.Int64(),
    "cost": pl.Float64(),
    "generation_id": pl.String(),
    "latency_s": pl.Float64(),
    "attempts": pl.Int32(),
}


def success_record(
    prompt: Prompt, body: dict[str, Any], *, attempts: int, latency_s: float, reservation_id: str, cost: float
) -> dict[str, Any]:
    choice = body["choices"][0]
    msg = choice.get("message") or {}
    usage = body.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    finish = choice.get("finish_reason") or "unknown"
    return {
        "prompt_id": prompt.prompt_id,
        "status": "ok",
        "messages": prompt.messages,
        "tools": prompt.tools,
        "reasoning": msg.get("reasoning") if msg.get("reasoning") is not None else msg.get("reasoning_content"),
        "content": msg.get("content"),
        "tool_calls": msg.get("tool_calls") or None,
        "finish_reason": finish,
        "truncated": finish == "length",
        "provider": body.get("provider"),
        "model": body.get("model"),
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
        "reasoning_tokens": int(details.get("reasoning_tokens") or 0),
        "cost": cost,
        "generation_id": body.get("id"),
        "latency_s": round(latency_s, 4),
        "attempts": attempts,
        "reservation_id": reservation_id,
        "at": time.time(),
    }


def skipped_record(prompt: Prompt, error_class: str, message: str, attempts: int) -> dict[str, Any]:
    """A prompt the API will never answer (400/403): journaled so that reruns do not re-ask it, unless the runner
    marks it not ``final`` (no success in the partition said the request itself was fine)."""
    return {
        "prompt_id": prompt.prompt_id,
        "status": "skipped",
        "error_class": error_class,
        "message": message[:300],
        "attempts": attempts,
        "final": True,
        "at": time.time(),
    }


def _json_or_none(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def records_to_frame(records: list[dict[str, Any]]) -> pl.DataFrame:
    rows = [
        {
            **{k: r.get(k) for k in PARQUET_SCHEMA},
            "messages": _json_or_none(r["messages"]),
            "tools": _json_or_none(r.get("tools")),
            "tool_calls": _json_or_none(r.get("tool_calls")),
        }
        for r in records
        if r.get("status") == "ok"
    ]
    return pl.DataFrame(rows, schema=PARQUET_SCHEMA)
