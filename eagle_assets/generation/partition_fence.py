"""One writer per partition across hosts: a lease in the ledger's database, checked before every append.

``flock`` on the journal file keeps two runs on one machine apart, but NFS does not always honour it
(``nolock`` or ``local_lock`` mounts make it per client). So the journal is also fenced by the database, with
the named lease of ``database_lease`` (the partition key is its name):

- a run takes the partition's lease before it opens the journal (before it even truncates a torn tail);
  the lease is held by its ledger owner, so it lives exactly as long as that owner's heartbeat;
- each take-over bumps the partition's *fencing token*; before every append the writer checks, in the
  database, that its token is still the partition's and that its owner lease has time left, and refuses
  to write otherwise (``FenceLostError``): a run that was declared dead never appends after a successor began;
- a second run finds the lease held: if the holder is in this pid space and alive, or its heartbeat moves
  while we watch, it fails at once (``PartitionBusyError``) naming the holder; if the heartbeat stands still,
  it waits for the lease to expire (a SIGKILLed host), charges what the dead holder had open, and takes over.

What remains assumed: that a writer is not paused for longer than the safety margin (a third of the lease)
between its check and its write. No file system offers more without its own fencing.
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

    def __init__(self, ledger: "OwnersRole", partition: str, wait_s: float | None = None) -> None:
        super().__init__(ledger, partition, what=f"partition {partition}", wait_s=wait_s, wait_for_live=False)
        self.partition = partition

    def acquire(self) -> "PartitionFence":
        super().acquire()
        return self

    def __enter__(self) -> "PartitionFence":
        return self.acquire()
