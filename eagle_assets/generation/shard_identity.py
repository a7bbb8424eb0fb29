"""What a partition's shard was cut from, kept beside its journal: a shard must not move under a journal.

A shard is positions of the asking order over the source's row count, so a source that gained or lost rows
reshuffles every shard, and a journal filled before would mix in another shard's rows (prompts bought twice,
others never). A later run that finds the count or the order changed while the journal holds records stops.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.errors import DataError


class ShardMovedError(DataError, RuntimeError):
    """The source's rows or the order settings changed since this partition's journal was started."""


@dataclass(frozen=True)
class ShardIdentity:
    rows: int
    shard_size: int
    order: str
    seed: int
    source: str  # for the message only: a local file may be edited in place without moving the shards


def identity_path(journal: Path) -> Path:
    return journal.with_name(journal.name + ".shard.json")


def check_shard_identity(journal: Path, now: ShardIdentity) -> None:
    """Record ``now`` for a fresh partition; raise if a started partition was cut differently."""
    path = identity_path(journal)
    started = journal.is_file() and journal.stat().st_size > 0
    try:
        was = ShardIdentity(**json.loads(path.read_text()))
    except FileNotFoundError:
        was = None
    if was is not None and started:
        moved = [k for k in ("rows", "shard_size", "order", "seed") if getattr(was, k) != getattr(now, k)]
        if moved:
            raise ShardMovedError(
                f"{journal}: this partition was started on {was.source} with {was.rows:,} rows (shard_size"
                f" {was.shard_size}, order {was.order}, seed {was.seed}); now {now.source} has {now.rows:,}"
                f" (shard_size {now.shard_size}, order {now.order}, seed {now.seed}): its shard would hold other"
                " rows. Pin the source (revision: <commit>), restore the settings, or give the dataset a new name."
            )
    if was != now:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, (json.dumps(asdict(now)) + "\n").encode())
