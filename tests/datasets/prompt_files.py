"""Every prompt of a small local file at once, for the tests (the assets read shards lazily instead)."""

from pathlib import Path

from eagle_assets.datasets.formats import RowError, detect_format
from eagle_assets.datasets.prompts import Prompt, RowProblem, conversation_of
from eagle_assets.datasets.regeneration import DEFAULT_MODE
from eagle_assets.datasets.sources import SourceSpec, resolve_source


def load_prompts(
    path: str | Path, mode: str = DEFAULT_MODE, format: str | None = None
) -> tuple[list[Prompt], list[RowProblem]]:
    """One prompt per row (single-request modes only: ``Conversation.prompt`` refuses every_turn), bad and
    repeated rows reported with file and line."""
    source = resolve_source(SourceSpec(path=Path(path)))
    fmt = detect_format(*source.columns(), format)
    prompts: list[Prompt] = []
    problems: list[RowProblem] = []
    seen: set[str] = set()
    for row in source.iter_rows():
        try:
            conv = conversation_of(row, fmt, mode)
        except RowError as exc:
            problems.append(RowProblem(row.file, row.line, str(exc), exc.reason, source.where(row)))
            continue
        if conv.conversation_id in seen:
            problem = f"duplicate prompt id {conv.conversation_id!r} (kept the first)"
            problems.append(RowProblem(row.file, row.line, problem, "duplicate_id", source.where(row)))
            continue
        seen.add(conv.conversation_id)
        prompts.append(conv.prompt())
    return prompts, problems
