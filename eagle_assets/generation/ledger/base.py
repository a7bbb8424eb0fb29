"""What every role of the ledger stands on: the connection it holds, each method retried on a new connection
when the connection broke under it, the running totals every role updates, and the owners on the ledger."""

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Concatenate, ParamSpec, TypeVar, cast

from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.ledger.database import Cursor, LedgerDatabase
from eagle_assets.generation.ledger.records import AccountSettings
from eagle_assets.generation.liveness import Heartbeat, OwnerRecord

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="LedgerBase")
_running = threading.local()  # whether this thread is inside a ledger method already (the outermost retries)


def reconnecting(
    idempotent: bool,
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Run the method again on a new connection when the connection broke under it (``LedgerDatabase.retrying``).

    ``idempotent``: running it twice writes what running it once does (settling skips what is closed, updates
    set values), so even a commit that may have happened is safe to repeat; the others (a reservation, a
    spend row) are repeated only when they certainly did not commit. Arguments that are iterators are read
    into lists first, so that a second run sees them whole.
    """

    def wrap(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def run(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            if getattr(_running, "inside", False):
                return method(self, *args, **kwargs)
            whole = [list(a) if isinstance(a, Iterator) else a for a in args]
            named = {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()}
            call = cast(Callable[..., R], method)

            def once() -> R:
                _running.inside = True
                try:
                    return call(self, *whole, **named)
                finally:
                    _running.inside = False

            return self.db.retrying(once, idempotent=idempotent, what=f"ledger.{method.__name__}")

        return run

    return wrap


class LedgerBase:
    """The state every role reads (set by ``BudgetLedger.__init__``) and the plumbing they share."""

    db: LedgerDatabase
    location: str  # where the tables are, safe to log
    policy: AdmissionPolicy
    lease_s: float
    host: str
    owner: str
    account: AccountSettings | None
    heartbeat: Heartbeat

    @staticmethod
    def _bump(cur: Cursor, scope: str, **deltas: float) -> None:
        """Add ``deltas`` to a scope's totals, creating the row: one statement (a round trip on PostgreSQL)."""
        names = ", ".join(deltas)
        marks = ",".join("?" * len(deltas))
        sets = ", ".join(f"{k} = totals.{k} + excluded.{k}" for k in deltas)
        cur.execute(
            f"INSERT INTO totals (scope, {names}) VALUES (?,{marks}) ON CONFLICT(scope) DO UPDATE SET {sets}",
            (scope, *deltas.values()),
        )

    def _bump_many(self, cur: Cursor, deltas: dict[str, dict[str, int]]) -> None:
        for scope, d in deltas.items():
            if any(d.values()):
                self._bump(cur, scope, **d)

    def _owners(self, cur: Cursor) -> tuple[list[OwnerRecord], float]:
        rows = cur.execute(
            f"SELECT owner, pid, create_time, host, heartbeat, lease_s, {self.db.now_sql} FROM owners"
        ).fetchall()
        now = rows[0][6] if rows else 0.0
        return [OwnerRecord(*r[:6]) for r in rows], now
