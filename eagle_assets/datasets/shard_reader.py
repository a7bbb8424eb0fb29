"""One shard of a dataset: its rows picked by the shuffled order, read lazily, turned into conversations.

Only the shard's rows are decoded (a 1M-row set is streamed past, not loaded), and they come out in
the asking order of :mod:`.sampling`, so a token target reached mid-shard has bought a uniform
sample. Rows the whole-set scan found repeating an earlier id are dropped here too, so a repeated
id is bought once however the shards fall.
"""

from collections.abc import Container
from dataclasses import dataclass, field

from eagle_assets.datasets.formats import RowError, RowFormat
from eagle_assets.datasets.prompts import Conversation, RowProblem, conversation_of
from eagle_assets.datasets.sampling import RowOrder
from eagle_assets.datasets.sources import ResolvedSource


@dataclass
class ShardContents:
    conversations: list[Conversation]  # in asking order
    problems: list[RowProblem] = field(default_factory=list)
    rows: int = 0  # rows of the source that fall in this shard, usable or not

    def rejected(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.problems:
            out[p.reason] = out.get(p.reason, 0) + 1
        return out


def read_shard(
    source: ResolvedSource,
    fmt: RowFormat,
    order: RowOrder,
    shard: int,
    size: int,
    mode: str,
    max_turns: int | None = None,
    duplicates: Container[int] = (),
) -> ShardContents:
    """The conversations of shard ``shard`` (``size`` rows per shard) and the problems of its bad rows."""
    positions = order.shard_rows(shard, size)
    wanted = set(positions)
    found: dict[int, Conversation] = {}
    problems: list[RowProblem] = []
    seen_ids: set[str] = set()
    for row in source.iter_rows(wanted, fmt.source_columns or None):
        where = source.where(row)
        if row.index in duplicates:
            problems.append(
                RowProblem(row.file, row.line, "repeats an earlier row's id (kept the first)", "duplicate_id", where)
            )
            continue
        try:
            conv = conversation_of(row, fmt, mode, max_turns)
        except RowError as exc:
            problems.append(RowProblem(row.file, row.line, str(exc), exc.reason, where))
            continue
        if conv.conversation_id in seen_ids:  # the scan normally removed these; a cache from elsewhere may not
            problems.append(
                RowProblem(row.file, row.line, f"duplicate prompt id {conv.conversation_id!r}", "duplicate_id", where)
            )
            continue
        seen_ids.add(conv.conversation_id)
        found[row.index] = conv
    return ShardContents([found[i] for i in positions if i in found], problems, len(positions))
