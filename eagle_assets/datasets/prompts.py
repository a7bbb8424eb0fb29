"""Read prompt files (JSONL or Parquet of OpenAI-style ``messages``) into validated prompt rows.

A bad row must not sink a 500k-prompt file: it is reported with file and line and the rest is
kept. Prompt ids are given by the file or derived from the content, so they stay stable across
reruns, which is what makes skipping finished prompts safe.
"""

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl

VALID_ROLES = {"system", "user", "assistant", "tool", "developer"}


class PromptFileError(ValueError):
    """The prompt file is missing or unreadable as a whole."""


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    line: int
    index: int  # ordinal among the file's non-blank rows: shards are cut on it, so a bad row never shifts them


@dataclass(frozen=True)
class RowProblem:
    file: str
    line: int
    problem: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.problem}"


def content_prompt_id(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    canonical = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:20]


def validate_row(row: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str | None]:
    """Return (messages, tools, id) or raise ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError("row is not a JSON object")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] is not an object")
        if m.get("role") not in VALID_ROLES:
            raise ValueError(f"messages[{i}].role {m.get('role')!r} is not one of {sorted(VALID_ROLES)}")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ValueError(f"messages[{i}].content must be a string, a list of parts or null")
    if messages[-1].get("role") == "assistant":
        raise ValueError("the last message is from the assistant: nothing to generate")
    tools = row.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ValueError("'tools' must be a list of objects")
    pid = row.get("id", row.get("prompt_id"))
    return messages, tools or None, (str(pid) if pid is not None else None)


def _rows(path: Path) -> list[tuple[int, Any]]:
    if path.suffix == ".parquet":
        df = pl.read_parquet(path)
        out = []
        for i, rec in enumerate(df.iter_rows(named=True), start=1):
            for key in ("messages", "tools"):
                if isinstance(rec.get(key), str):
                    with contextlib.suppress(orjson.JSONDecodeError):
                        rec[key] = orjson.loads(rec[key])
            out.append((i, rec))
        return out
    rows = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, orjson.loads(line)))
            except orjson.JSONDecodeError as exc:
                rows.append((lineno, exc))
    return rows


def load_prompts(path: str | Path) -> tuple[list[Prompt], list[RowProblem]]:
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file not found: {path}")
    prompts: list[Prompt] = []
    problems: list[RowProblem] = []
    seen: set[str] = set()
    for index, (lineno, row) in enumerate(_rows(path)):
        if isinstance(row, Exception):
            problems.append(RowProblem(str(path), lineno, f"invalid JSON: {row}"))
            continue
        try:
            messages, tools, pid = validate_row(row)
        except ValueError as exc:
            problems.append(RowProblem(str(path), lineno, str(exc)))
            continue
        pid = pid or content_prompt_id(messages, tools)
        if pid in seen:
            problems.append(RowProblem(str(path), lineno, f"duplicate prompt id {pid!r} (kept the first)"))
            continue
        seen.add(pid)
        prompts.append(Prompt(pid, messages, tools, lineno, index))
    return prompts, problems


def count_rows(path: Path) -> int:
    """Cheap row count for partition planning (no validation)."""
    if path.suffix == ".parquet":
        return pl.scan_parquet(path).select(pl.len()).collect().item()
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())
