"""Rows of a prompt source → validated conversations and the prompts sent for them.

A bad row must not sink a 500k-prompt file: it is reported with file and line and the rest is
kept. Prompt ids are given by the file or derived from the content, so they stay stable across
reruns, which is what makes skipping finished prompts safe.
"""

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from eagle_assets.datasets.file_readers import RawRow
from eagle_assets.datasets.formats import RowFormat, read_row
from eagle_assets.datasets.regeneration import DEFAULT_MODE, RegenerationModeError, single_request, turn_inputs


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    line: int
    index: int  # ordinal among the source's non-blank rows: shards are cut on it, so a bad row never shifts them


@dataclass(frozen=True)
class RowProblem:
    file: str
    line: int
    problem: str
    reason: str = "invalid"
    where: str = ""  # the row's place as the source names it (file:line, or split and row index)

    def __str__(self) -> str:
        return f"{self.where or f'{self.file}:{self.line}'}: {self.problem}"


@dataclass(frozen=True)
class Conversation:
    """One usable row: what is asked for it under the dataset's mode.

    ``request`` is the single request of ``last_user``/``first_turn``; ``turns`` the per-turn inputs of
    ``every_turn`` (see :func:`eagle_assets.datasets.regeneration.turn_inputs`)."""

    conversation_id: str
    tools: list[dict[str, Any]] | None
    line: int
    index: int
    request: list[dict[str, Any]] | None = None
    turns: list[list[dict[str, Any]]] | None = None

    @property
    def turn_count(self) -> int:
        return len(self.turns) if self.turns is not None else 1

    def prompt(self) -> Prompt:
        if self.request is None:
            raise RegenerationModeError(f"{self.conversation_id}: an every_turn conversation has no single prompt")
        return Prompt(self.conversation_id, self.request, self.tools, self.line, self.index)


def content_prompt_id(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    canonical = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:20]


def conversation_of(
    row: RawRow, fmt: RowFormat, mode: str = DEFAULT_MODE, max_turns: int | None = None
) -> Conversation:
    """A stored row → the conversation asked for it, or :class:`RowError` saying why it cannot be used."""
    read = read_row(row.value, fmt)
    cid = read.given_id or content_prompt_id(read.messages, read.tools)
    if mode == "every_turn":
        return Conversation(cid, read.tools, row.line, row.index, turns=turn_inputs(read.messages, max_turns))
    return Conversation(cid, read.tools, row.line, row.index, request=single_request(read.messages, mode))
