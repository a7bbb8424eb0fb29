"""A named single-writer lease in the ledger's database, for writers that ``flock`` alone cannot keep apart.

An NFS mount with ``nolock`` or ``local_lock`` makes ``flock`` per client, so every writer that must be alone on a
shared folder (a partition's journal, the corpus merge, a hidden-state store's index) also takes a lease by name,
held by a ledger owner (it lives as long as that owner's heartbeat). Each take-over bumps the name's *fencing
token*, and ``check`` confirms before a write that the token is still ours with time left on our lease. A second
writer waits for the lease to be given back (``wait_for_live``: short critical sections) or fails; a holder whose
heartbeat stopped (a SIGKILLed host) is taken over once its lease ran out. A refusal names the holder.
"""

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar, Self

from eagle_assets.errors import GenerationError, LeaseLost
from eagle_assets.generation.liveness import why_dead

if TYPE_CHECKING:
    from eagle_assets.generation.ledger.owners import OwnersRole
    from eagle_assets.generation.liveness import OwnerRecord

DEFAULT_WAIT_S = 600.0


class LeaseBusyError(GenerationError, RuntimeError):
    """A live writer elsewhere holds this lease and did not give it back in time."""


class LeaseLostError(LeaseLost, RuntimeError):
    """This writer no longer holds its lease: it must not write."""


class DatabaseLease:
    """The lease on one name, held by one ledger owner (a context manager: take, then give back)."""

    busy_error: ClassVar[type[Exception]] = LeaseBusyError
    lost_error: ClassVar[type[Exception]] = LeaseLostError
    held_phrase: ClassVar[str] = "is held by another writer"

    def __init__(
        self,
        ledger: "OwnersRole",
        name: str,
        *,
        what: str,
        wait_s: float | None = None,
        wait_for_live: bool = True,
    ) -> None:
        self.ledger, self.name, self.what = ledger, name, what
        # Waiting for a live holder: as long as asked. Otherwise long enough for a SIGKILLed holder's lease to run
        # out, with two heartbeats to spare.
        default_wait = DEFAULT_WAIT_S if wait_for_live else ledger.lease_s * (1 + 2 / 6) + 1.0
        self.wait_s = default_wait if wait_s is None else wait_s
        self.wait_for_live = wait_for_live
        self.margin_s = ledger.lease_s / 3
        self.token: int | None = None
        self.took_over: str | None = None  # who held it before, if a dead holder's lease was taken over

    # --- taking and giving back ---------------------------------------------------------------
    def _try_take(self) -> tuple["OwnerRecord", float, float] | None:
        """Take the lease if it is free or its holder is dead; else the live holder, since when, and now."""
        led = self.ledger
        with led.db.tx() as cur:
            led._assert_alive(cur)
            row = cur.execute(
                "SELECT holder, token, acquired FROM partition_leases WHERE partition = ?", (self.name,)
            ).fetchone()
            holder, token, acquired = (row[0], row[1], row[2]) if row else (None, 0, 0.0)
            owners, now = led._owners(cur)
            rec = next((r for r in owners if r.owner == holder), None)
            if holder not in (None, led.owner) and rec is not None:
                why = why_dead(rec, here=led.host, now=now)
                if why is None:
                    return rec, float(acquired), now
                led._orphan_owner(cur, rec.owner)  # charge what it had open before anyone writes
                self.took_over = f"{rec.owner} on {rec.host} ({why})"
            self.token = token + 1
            cur.execute(
                "INSERT INTO partition_leases (partition, holder, token, acquired)"
                f" VALUES (?,?,?,{led.db.now_sql}) ON CONFLICT(partition) DO UPDATE SET"
                " holder = excluded.holder, token = excluded.token, acquired = excluded.acquired",
                (self.name, led.owner, self.token),
            )
            return None

    def _holder_text(self, busy: "OwnerRecord", since: float, now: float) -> str:
        stamp = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if since else "an unknown time"
        return (
            f"{self.what} {self.held_phrase}: ledger owner {busy.owner} (pid {busy.pid} on {busy.host}),"
            f" holding it since {stamp}, heartbeat {now - busy.heartbeat:.1f} s ago"
        )

    def acquire(self) -> Self:
        deadline = time.monotonic() + self.wait_s
        first_beat: tuple[str, float] | None = None
        while (found := self._try_take()) is not None:
            busy, since, now = found
            who = self._holder_text(busy, since, now)
            if not self.wait_for_live:
                if busy.host == self.ledger.host:
                    raise self.busy_error(f"{who}, alive on this machine. Wait for it to finish or stop it.")
                if first_beat is not None and first_beat[0] == busy.owner and busy.heartbeat > first_beat[1]:
                    raise self.busy_error(f"{who}, and renewing its lease. Wait for it to finish or stop it.")
            if time.monotonic() > deadline:
                given = "given back" if self.wait_for_live else "expired"
                raise self.busy_error(
                    f"{who}; its lease was not {given} within {self.wait_s:.0f} s. Wait for it to finish or stop it."
                )
            if first_beat is None or first_beat[0] != busy.owner:
                first_beat = (busy.owner, busy.heartbeat)
            pause = 0.2 if self.wait_for_live else 1.0
            time.sleep(min(pause, max(0.05, deadline - time.monotonic())))
        return self

    def release(self) -> None:
        if self.token is None:
            return
        token = self.token

        def give_back() -> None:
            with self.ledger.db.tx() as cur:
                cur.execute(
                    "UPDATE partition_leases SET holder = NULL WHERE partition = ? AND holder = ? AND token = ?",
                    (self.name, self.ledger.owner, token),
                )

        self.ledger.db.retrying(give_back, idempotent=True, what=f"release of {self.what}")
        self.token = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # --- the check before every write ---------------------------------------------------------
    def _held_now(self) -> tuple[int, str | None, float | None] | None:
        """The name's token, its holder, and the seconds left on the holder's lease (database clock)."""
        led = self.ledger
        with led.db.read() as cur:
            row = cur.execute(
                f"SELECT p.token, p.holder, o.heartbeat + o.lease_s - {led.db.now_sql} FROM partition_leases p"
                " LEFT JOIN owners o ON o.owner = p.holder WHERE p.partition = ?",
                (self.name,),
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def check(self) -> None:
        """Raise ``lost_error`` unless this writer still holds the lease with time left on it."""
        led = self.ledger
        if self.token is None:
            raise self.lost_error(f"{self.what}: the lease was not taken or was given back")
        if led.heartbeat.lost:
            raise self.lost_error(f"{self.what}: this writer's ledger owner was declared dead")
        stale = led.heartbeat.since_ok()
        if stale > led.lease_s - self.margin_s:
            raise self.lost_error(
                f"{self.what}: no heartbeat confirmed for {stale:.1f} s (lease {led.lease_s:.0f} s):"
                " another host may take it over; not writing"
            )
        row = led.db.retrying(self._held_now, idempotent=True, what=f"lease check of {self.what}")
        if row is None or row[0] != self.token or row[1] != led.owner:
            now_held = "nobody" if row is None or row[1] is None else f"{row[1]} (token {row[0]})"
            raise self.lost_error(
                f"{self.what}: fencing token {self.token} is no longer current (held by {now_held}); not writing"
            )
        if row[2] is None or row[2] < self.margin_s:
            raise self.lost_error(f"{self.what}: this writer's lease has {row[2] or 0:.1f} s left; not writing")
