"""One pass of a prompt set through a serving engine: ``batch_size`` conversations in flight, turns in order.

As SpecForge's ``run_batch(num_threads=batch_size)`` does, a conversation holds its slot through all of its turns.
Each finished request is appended to a JSONL journal at once, so a server that dies mid-run loses nothing already
answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle_assets.benchmarks.formatting import Render, prompt_ids
from eagle_assets.benchmarks.prompt_sets import Conversation
from eagle_assets.errors import EngineError
from resources.serving.acceptance import AcceptanceTally


class AnswersEngine(Protocol):
    """What a pass needs of a client (``resources/serving/clients.py``)."""

    engine: str

    async def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float) -> Any: ...


@dataclass
class RequestRecord:
    """One answered request, as journaled."""

    pass_name: str  # "draft" or "baseline"
    set_name: str
    conversation: str
    turn: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    latency_s: float
    verifications: int | None = None
    accepted: int | None = None
    reached: list[int] | None = None


@dataclass
class SetPass:
    set_name: str
    pass_name: str
    conversations: int
    records: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    tally: AcceptanceTally | None = None
    complete: bool = True
    warnings: dict[str, int] = field(default_factory=dict)  # message -> answers it applied to

    def note(self, messages: Sequence[str]) -> None:
        for m in messages:
            self.warnings[m] = self.warnings.get(m, 0) + 1

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.records)

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.wall_s if self.wall_s > 0 and self.records else None


class Journal:
    """Append-only JSONL of answered requests; flushed per line so a crash keeps every answer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: RequestRecord) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(record)) + "\n")

    def read(self) -> list[RequestRecord]:
        if not self.path.is_file():
            return []
        return [RequestRecord(**json.loads(line)) for line in self.path.read_text().splitlines() if line.strip()]


class PassInterrupted(EngineError):
    """A pass stopped before every request was answered; ``partial`` holds what was."""

    def __init__(self, cause: BaseException, partial: SetPass) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.partial = partial


async def run_pass(
    client: AnswersEngine,
    set_name: str,
    pass_name: str,
    conversations: Sequence[Conversation],
    render: Render,
    *,
    batch_size: int,
    max_new_tokens: int,
    temperature: float,
    journal: Journal,
    progress: Callable[[int, int], None] | None = None,
) -> SetPass:
    """Send every turn of every conversation; raise :class:`PassInterrupted` (with the answers so far) on failure."""
    result = SetPass(set_name, pass_name, len(conversations))
    total = sum(c.turns for c in conversations)
    slots = asyncio.Semaphore(batch_size)

    async def converse(conv: Conversation) -> None:
        async with slots:
            answers: list[str] = []
            for turn in range(conv.turns):
                ids = prompt_ids(conv, turn, answers, render)
                t0 = time.perf_counter()
                answer = await client.generate(ids, max_new_tokens, temperature)
                tally = answer.tally
                record = RequestRecord(
                    pass_name,
                    set_name,
                    conv.id,
                    turn,
                    len(ids),
                    answer.completion_tokens,
                    answer.finish_reason,
                    time.perf_counter() - t0,
                    None if tally is None else tally.verifications,
                    None if tally is None else tally.accepted,
                    None if tally is None else tally.reached,
                )
                journal.append(record)
                result.records.append(record)
                if tally is not None:
                    result.tally = tally if result.tally is None else result.tally + tally
                result.note(answer.warnings)
                if progress is not None:
                    progress(len(result.records), total)
                answers.append(answer.text)

    start = time.perf_counter()
    tasks = [asyncio.create_task(converse(c)) for c in conversations]
    try:
        await asyncio.gather(*tasks)
    except BaseException as exc:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        result.wall_s = time.perf_counter() - start
        result.complete = False
        raise PassInterrupted(exc, result) from exc
    result.wall_s = time.perf_counter() - start
    return result
