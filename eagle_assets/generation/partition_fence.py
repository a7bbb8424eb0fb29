"""One writer per partition across hosts: a lease in the ledger's database, checked before every append.

``flock`` on the journal file keeps two runs on one machine apart, but NFS does not always honour it
(``nolock`` or ``local_lock`` mounts make it per client). So the journal is also fenced by the database:

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

import time
from typing import TYPE_CHECKING

from eagle_assets.errors import LeaseLost
from eagle_assets.generation.journal import JournalError, JournalLockedError
from eagle_assets.generation.liveness import why_dead

if TYPE_CHECKING:
    from eagle_assets.generation.ledger import BudgetLedger
    from eagle_assets.generation.ledger_db import Cursor

FENCE_SCHEMA = """
CREATE TABLE IF NOT EXISTS partition_leases (
  partition TEXT PRIMARY KEY, holder TEXT, token INTEGER NOT NULL DEFAULT 0, acquired REAL NOT NULL DEFAULT 0);
"""


class PartitionBusyError(JournalLockedError):
    """A live run elsewhere holds this partition's lease."""


class FenceLostError(JournalError, LeaseLost):
    """This run no longer holds its partition's lease: it must not append."""


class PartitionFence:
    """The lease on one partition's journal, held by one ledger owner (a context manager: take, then release)."""

    def __init__(self, ledger: "BudgetLedger", partition: str, wait_s: float | None = None) -> None:
        self.ledger, self.partition = ledger, partition
        # Long enough for a SIGKILLed holder's lease to run out, with two heartbeats to spare.
        self.wait_s = ledger.lease_s * (1 + 2 / 6) + 1.0 if wait_s is None else wait_s
        self.margin_s = ledger.lease_s / 3
        self.token: int | None = None
        self.took_over: str | None = None  # who held it before, if a dead holder's lease was taken over

    # --- taking and giving back ---------------------------------------------------------------
    def acquire(self) -> "PartitionFence":
        led = self.ledger
        deadline = time.monotonic() + self.wait_s
        first_beat: tuple[str, float] | None = None
        while True:
            with led._tx() as cur:
                led._assert_alive(cur)
                row = cur.execute(
                    "SELECT holder, token FROM partition_leases WHERE partition = ?", (self.partition,)
                ).fetchone()
                holder, token = (row[0], row[1]) if row else (None, 0)
                owners, now = led._owners(cur)
                rec = next((r for r in owners if r.owner == holder), None)
                if holder not in (None, led.owner) and rec is not None:
                    why = why_dead(rec, here=led.host, now=now)
                    if why is None:
                        busy = rec
                    else:
                        led._orphan_owner(cur, rec.owner)  # charge what it had open before anyone writes
                        self.took_over, busy = f"{rec.owner} on {rec.host} ({why})", None
                else:
                    busy = None
                if busy is None:
                    self.token = token + 1
                    cur.execute(
                        "INSERT INTO partition_leases (partition, holder, token, acquired)"
                        f" VALUES (?,?,?,{led.db.now_sql}) ON CONFLICT(partition) DO UPDATE SET"
                        " holder = excluded.holder, token = excluded.token, acquired = excluded.acquired",
                        (self.partition, led.owner, self.token),
                    )
                    return self
            who = (
                f"partition {self.partition} is being written by another run: ledger owner {busy.owner}"
                f" (pid {busy.pid} on {busy.host}), heartbeat {now - busy.heartbeat:.1f} s ago"
            )
            if busy.host == led.host:
                raise PartitionBusyError(f"{who}, alive on this machine. Wait for it to finish or stop it.")
            if first_beat is not None and first_beat[0] == busy.owner and busy.heartbeat > first_beat[1]:
                raise PartitionBusyError(f"{who}, and renewing its lease. Wait for it to finish or stop it.")
            if time.monotonic() > deadline:
                raise PartitionBusyError(
                    f"{who}; its lease did not expire within {self.wait_s:.0f} s. Wait for it to finish or stop it."
                )
            if first_beat is None or first_beat[0] != busy.owner:
                first_beat = (busy.owner, busy.heartbeat)
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

    def release(self) -> None:
        if self.token is None:
            return
        token = self.token

        def give_back() -> None:
            with self.ledger._tx() as cur:
                cur.execute(
                    "UPDATE partition_leases SET holder = NULL WHERE partition = ? AND holder = ? AND token = ?",
                    (self.partition, self.ledger.owner, token),
                )

        self.ledger.db.retrying(give_back, idempotent=True, what=f"release of partition {self.partition}")
        self.token = None

    @staticmethod
    def release_all(cur: "Cursor", owner: str) -> None:
        """An owner found dead (or closing) holds no partition any more."""
        cur.execute("UPDATE partition_leases SET holder = NULL WHERE holder = ?", (owner,))

    def __enter__(self) -> "PartitionFence":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # --- the check before every append --------------------------------------------------------
    def _held_now(self) -> tuple[int, str | None, float | None] | None:
        """The partition's token, its holder, and the seconds left on the holder's lease (database clock)."""
        led = self.ledger
        with led.db.read() as cur:
            row = cur.execute(
                f"SELECT p.token, p.holder, o.heartbeat + o.lease_s - {led.db.now_sql} FROM partition_leases p"
                " LEFT JOIN owners o ON o.owner = p.holder WHERE p.partition = ?",
                (self.partition,),
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def check(self) -> None:
        """Raise unless this run still holds the partition with time left on its lease."""
        led = self.ledger
        if self.token is None:
            raise FenceLostError(f"partition {self.partition}: the lease was not taken or was given back")
        if led.heartbeat.lost:
            raise FenceLostError(f"partition {self.partition}: this run's ledger owner was declared dead")
        stale = led.heartbeat.since_ok()
        if stale > led.lease_s - self.margin_s:
            raise FenceLostError(
                f"partition {self.partition}: no heartbeat confirmed for {stale:.1f} s (lease {led.lease_s:.0f} s):"
                " another host may take the partition over; not appending"
            )
        row = led.db.retrying(self._held_now, idempotent=True, what=f"fence check of {self.partition}")
        if row is None or row[0] != self.token or row[1] != led.owner:
            now_held = "nobody" if row is None or row[1] is None else f"{row[1]} (token {row[0]})"
            raise FenceLostError(
                f"partition {self.partition}: fencing token {self.token} is no longer current (held by {now_held});"
                " not appending"
            )
        if row[2] is None or row[2] < self.margin_s:
            raise FenceLostError(
                f"partition {self.partition}: this run's lease has {row[2] or 0:.1f} s left; not appending"
            )
