"""The dollar and token ledger shared by every process that spends money.

Dagster runs each step in its own process, so in-memory counters cannot hold a budget. This is a
SQLite file (WAL, ``BEGIN IMMEDIATE`` transactions) that every generation step opens. A request is
admitted only after its worst-case cost is *reserved* here; the actual cost *settles* it. The
invariant checked on every reservation is ``spent + reserved + new <= budget``, across processes and
restarts.

When a process dies, its reservations are orphaned: the requests may still have been billed (an
abandoned non-streaming request is billed in full), so an orphan is converted into spend at its
worst-case cost. If the dead run had already journaled the result, the rerun of that partition
corrects the orphan to the actual cost (``correct_orphans``) — conservative first, exact later.
"""

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

SCHEMA = """
CREATE TABLE IF NOT EXISTS owners (
  owner TEXT PRIMARY KEY, pid INTEGER NOT NULL, create_time REAL NOT NULL, started REAL NOT NULL);
CREATE TABLE IF NOT EXISTS reservations (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, dataset TEXT NOT NULL, partition TEXT NOT NULL,
  prompt_id TEXT NOT NULL, usd INTEGER NOT NULL, tokens INTEGER NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS spend (
  id TEXT PRIMARY KEY, dataset TEXT NOT NULL, partition TEXT NOT NULL, prompt_id TEXT NOT NULL,
  usd INTEGER NOT NULL, tokens INTEGER NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS totals (
  scope TEXT PRIMARY KEY, usd_spent INTEGER NOT NULL DEFAULT 0, usd_reserved INTEGER NOT NULL DEFAULT 0,
  tokens_spent INTEGER NOT NULL DEFAULT 0, tokens_reserved INTEGER NOT NULL DEFAULT 0,
  in_flight INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS reservations_owner ON reservations(owner);
CREATE INDEX IF NOT EXISTS spend_partition ON spend(partition, kind);
"""

GLOBAL = "global"
NANO = 1_000_000_000  # money is stored in integer nano-dollars: sums of floats drift, budgets must not


def _n(usd: float) -> int:
    return round(usd * NANO)


def _scope(dataset: str) -> str:
    return f"dataset:{dataset}"


@dataclass(frozen=True)
class Reservation:
    id: str
    dataset: str
    partition: str
    prompt_id: str
    usd: float
    tokens: int


@dataclass(frozen=True)
class Settlement:
    reservation: Reservation
    usd: float
    tokens: int
    kind: str = "settled"  # settled | discarded | failed | released


@dataclass(frozen=True)
class Denial:
    """Why a reservation was refused: the ``usd`` budget, the dataset's ``tokens`` budget, or the key's ``credits``."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Totals:
    usd_spent: float
    usd_reserved: float
    tokens_spent: int
    tokens_reserved: int
    in_flight: int


class BudgetLedger:
    """One connection per process; every public method is one short transaction."""

    def __init__(self, path: str | Path, owner: str | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection shared by the event loop and the journal-commit thread, serialized by a lock.
        self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self.owner = owner or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        proc = psutil.Process()
        with self._tx() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO owners VALUES (?,?,?,?)",
                (self.owner, proc.pid, proc.create_time(), time.time()),
            )
        self.recover_dead_owners()

    # --- plumbing ---------------------------------------------------------------------------
    class _Tx:
        def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
            self.db, self.lock = db, lock

        def __enter__(self) -> sqlite3.Cursor:
            self.lock.acquire()
            try:
                self.cur = self.db.cursor()
                self.cur.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.lock.release()
                raise
            return self.cur

        def __exit__(self, exc_type: object, *_: object) -> None:
            try:
                self.cur.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.lock.release()

    def _tx(self) -> "BudgetLedger._Tx":
        return BudgetLedger._Tx(self._db, self._lock)

    @staticmethod
    def _bump(cur: sqlite3.Cursor, scope: str, **deltas: float) -> None:
        cur.execute("INSERT OR IGNORE INTO totals(scope) VALUES (?)", (scope,))
        sets = ", ".join(f"{k} = {k} + ?" for k in deltas)
        cur.execute(f"UPDATE totals SET {sets} WHERE scope = ?", (*deltas.values(), scope))

    def _move(self, cur: sqlite3.Cursor, res: Reservation, usd: float, tokens: int, kind: str) -> None:
        cur.execute("DELETE FROM reservations WHERE id = ?", (res.id,))
        if cur.rowcount == 0:
            return  # already settled (or recovered as an orphan): never count twice
        if kind != "released":
            cur.execute(
                "INSERT INTO spend VALUES (?,?,?,?,?,?,?,?)",
                (res.id, res.dataset, res.partition, res.prompt_id, _n(usd), tokens, kind, time.time()),
            )
        for scope in (GLOBAL, _scope(res.dataset)):
            self._bump(
                cur,
                scope,
                usd_spent=_n(usd),
                usd_reserved=-_n(res.usd),
                tokens_spent=tokens,
                tokens_reserved=-res.tokens,
                in_flight=-1,
            )

    # --- queries ----------------------------------------------------------------------------
    def totals(self, dataset: str | None = None) -> Totals:
        scope = GLOBAL if dataset is None else _scope(dataset)
        with self._lock:
            row = self._db.execute(
                "SELECT usd_spent, usd_reserved, tokens_spent, tokens_reserved, in_flight FROM totals WHERE scope = ?",
                (scope,),
            ).fetchone()
        if not row:
            return Totals(0.0, 0.0, 0, 0, 0)
        return Totals(row[0] / NANO, row[1] / NANO, row[2], row[3], row[4])

    def spend_by_kind(self, partition: str | None = None) -> dict[str, float]:
        q = "SELECT kind, SUM(usd) FROM spend" + (" WHERE partition = ?" if partition else "")
        with self._lock:
            rows = self._db.execute(q + " GROUP BY kind", (partition,) if partition else ()).fetchall()
        return {k: v / NANO for k, v in rows}

    # --- reservations -----------------------------------------------------------------------
    def reserve_many(
        self,
        requests: Iterable[tuple[str, str, str, float, int]],
        *,
        budget_usd: float,
        token_budget: int | None,
    ) -> tuple[list[Reservation], Denial | None]:
        """Reserve (dataset, partition, prompt_id, usd, tokens) in order until one does not fit."""
        granted: list[Reservation] = []
        denial: Denial | None = None
        now = time.time()
        with self._tx() as cur:
            for dataset, partition, prompt_id, usd, tokens in requests:
                (committed,) = cur.execute(
                    "SELECT usd_spent + usd_reserved FROM totals WHERE scope = ?", (GLOBAL,)
                ).fetchone() or (0,)
                if committed + _n(usd) > _n(budget_usd):
                    denial = Denial("usd", f"${committed / NANO:.4f} spent or reserved of ${budget_usd:.2f} budget")
                    break
                if token_budget is not None:
                    d = cur.execute(
                        "SELECT tokens_spent + tokens_reserved FROM totals WHERE scope = ?",
                        (_scope(dataset),),
                    ).fetchone() or (0,)
                    if d[0] + tokens > token_budget:
                        denial = Denial("tokens", f"{d[0]:,} of {token_budget:,} output tokens used or reserved")
                        break
                res = Reservation(uuid.uuid4().hex, dataset, partition, prompt_id, usd, tokens)
                cur.execute(
                    "INSERT INTO reservations VALUES (?,?,?,?,?,?,?,?)",
                    (res.id, self.owner, dataset, partition, prompt_id, _n(usd), tokens, now),
                )
                for scope in (GLOBAL, _scope(dataset)):
                    self._bump(cur, scope, usd_reserved=_n(usd), tokens_reserved=tokens, in_flight=1)
                granted.append(res)
        return granted, denial

    def settle_many(self, settlements: Iterable[Settlement]) -> None:
        with self._tx() as cur:
            for s in settlements:
                self._move(cur, s.reservation, s.usd, s.tokens, s.kind)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose request was never billed."""
        self.settle_many([Settlement(reservation, 0.0, 0, "released")])

    def record_spend(self, dataset: str, partition: str, prompt_id: str, usd: float, kind: str) -> None:
        """Spend that arrives outside a reservation (e.g. cost reported on an error)."""
        if usd <= 0:
            return
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO spend VALUES (?,?,?,?,?,?,?,?)",
                (uuid.uuid4().hex, dataset, partition, prompt_id, _n(usd), 0, kind, time.time()),
            )
            for scope in (GLOBAL, _scope(dataset)):
                self._bump(cur, scope, usd_spent=_n(usd))

    # --- crash recovery ---------------------------------------------------------------------
    @staticmethod
    def _alive(pid: int, create_time: float) -> bool:
        try:
            return abs(psutil.Process(pid).create_time() - create_time) < 1.0
        except psutil.Error:
            return False

    def recover_dead_owners(self) -> int:
        """Turn the reservations of dead processes into worst-case spend; returns how many."""
        owners = self._db.execute("SELECT owner, pid, create_time FROM owners").fetchall()
        dead = [o for o, pid, ct in owners if o != self.owner and not self._alive(pid, ct)]
        count = 0
        for owner in dead:
            with self._tx() as cur:
                rows = cur.execute(
                    "SELECT id, dataset, partition, prompt_id, usd, tokens FROM reservations WHERE owner = ?",
                    (owner,),
                ).fetchall()
                for row in rows:
                    res = Reservation(*row[:4], row[4] / NANO, row[5])
                    self._move(cur, res, res.usd, 0, "orphan")
                count += len(rows)
                cur.execute("DELETE FROM owners WHERE owner = ?", (owner,))
        return count

    def correct_orphans(self, partition: str, actual: Mapping[str, tuple[float, int]]) -> float:
        """Replace orphan worst-case spend by the journaled actual cost; returns dollars refunded."""
        refunded = 0.0
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT id, dataset, usd FROM spend WHERE partition = ? AND kind = 'orphan'", (partition,)
            ).fetchall()
            for rid, dataset, nano in rows:
                if rid not in actual:
                    continue
                real_usd, tokens = actual[rid]
                cur.execute(
                    "UPDATE spend SET usd = ?, tokens = ?, kind = 'settled_late' WHERE id = ?",
                    (_n(real_usd), tokens, rid),
                )
                for scope in (GLOBAL, _scope(dataset)):
                    self._bump(cur, scope, usd_spent=_n(real_usd) - nano, tokens_spent=tokens)
                refunded += nano / NANO - real_usd
        return refunded

    def close(self) -> None:
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT id, dataset, partition, prompt_id, usd, tokens FROM reservations WHERE owner = ?",
                (self.owner,),
            ).fetchall()
            for row in rows:
                # A clean close with open reservations means requests were abandoned: count them.
                res = Reservation(*row[:4], row[4] / NANO, row[5])
                self._move(cur, res, res.usd, 0, "orphan")
            cur.execute("DELETE FROM owners WHERE owner = ?", (self.owner,))
        self._db.close()
