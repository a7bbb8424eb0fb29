"""One writer per partition across hosts: the named lease of ``database_lease`` (the partition key is its name).

A run takes it before it opens the journal (which may truncate a torn tail) and checks it before every append. A
second run fails at once while the holder is alive in this pid space or its heartbeat moves while we watch; if the
heartbeat stands still, it waits for the lease to expire, charges what the dead holder had open, and takes over.
Still assumed: no writer pauses longer than a third of the lease between its check and its write.
"""

from typing import TYPE_CHECKING, ClassVar

from eagle_assets.errors import LeaseLost
from eagle_assets.generation.database_lease import DatabaseLease
from eagle_assets.generation.journal import JournalError, JournalLockedError

if TYPE_CHECKING:
    from eagle_assets.generation.ledger.owners import OwnersRole


class PartitionBusyError(JournalLockedError):
    """A live run elsewhere holds this partition's lease."""


class FenceLostError(JournalError, LeaseLost):
    """This run no longer holds its partition's lease: it must not append."""


class PartitionFence(DatabaseLease):
    """The lease on one partition's journal: fails rather than waits while a live run holds it."""

    busy_error: ClassVar[type[Exception]] = PartitionBusyError
    lost_error: ClassVar[type[Exception]] = FenceLostError
    held_phrase: ClassVar[str] = "is being written by another run"

    def __init__(self, ledger: "OwnersRole", partition: str) -> None:
        super().__init__(ledger, partition, what=f"partition {partition}", wait_for_live=False)
