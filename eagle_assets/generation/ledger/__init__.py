"""The dollar and token ledger shared by every process that spends money.

Dagster runs each step in its own process, so in-memory counters cannot hold a budget. This is a
SQLite file (WAL, ``BEGIN IMMEDIATE`` transactions) that every generation step opens. A request is
admitted only after it is *reserved* here; the actual cost *settles* it. What a reservation holds
is decided by ``admission`` from everything open on the ledger, across processes and restarts:

- ``hard`` reservations hold their worst case (prompt + ``max_tokens`` at the dearest price), and
  the check is ``spent + Σ worst cases ≤ budget`` — never exceeded;
- ``statistical`` ones (the default) together hold ``n·μ + z·σ·√n`` of the dollars, from the
  completion lengths this dataset has produced, once there are enough of them (worst case before);
  the budget is then passed with probability below ``overspend_probability`` per run.

A dataset's output-token budget is a target in the same way (``admission.token_admission``).

The ledger also keeps what the statistics need: each reservation gets an admission number per
dataset, and an answer counts only once every earlier admission of its dataset has closed (see
``admission.cohort_moments``). And it holds the account-wide in-flight cap: processes lease slots
(``lease_slots``), so ``max_in_flight`` is one number for the whole account, shared fairly.

When a process dies, its reservations are orphaned: the requests may still have been billed (an
abandoned non-streaming request is billed in full), so an orphan is converted into spend at its
worst-case cost. If the dead run had already journaled the result, the rerun of that partition
corrects the orphan to the actual cost (``correct_orphans``) — conservative first, exact later.

Attempts whose billing is unknown (a timeout, a dropped connection, a torn body, a partial answer that
ended in an error, an orphan whose generation id had arrived) are charged provisionally and listed in
``uncertain`` with their generation id: OpenRouter's ``/generation`` can answer 404 for minutes, so
they are looked up later, by any process (``eagle_assets.generation.settlement`` decides when), and
the provisional charge is replaced by the actual cost (``resolve_uncertain``) or kept for good
(``write_off_uncertain``). This table is plain portable SQL, shared like the rest of the ledger.

The account's settings live here too (``account``): the dollar budget and the in-flight cap, set by the
first run that opens the ledger with them. Every host reads its own configuration, so a pod configured
differently from the others would otherwise split the budget or the cap without a word: a run whose
settings disagree with a live run's is refused (``AccountSettingsConflict``) naming both values. A change
(a budget raised after a top-up) is taken once no live run holds the old values, and recorded with who
made it and when (``account_changes``).

Where the tables live is one setting (``ledger_db``): a SQLite file, the embedded default, or a
PostgreSQL database shared by several hosts. Death is judged by a heartbeat lease on the database's
clock (``liveness``), with a pid check only within one pid space: a dead host's slots come back once
its lease expires, and its open reservations are then charged at their worst case.
"""

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import psutil

from eagle_assets.errors import ConfigError, LeaseLost
from eagle_assets.generation.admission import (
    AdmissionPolicy,
    LengthModel,
    Moments,
    OpenGroup,
    cohort_moments,
    expected_usd,
    fair_shares,
    held_usd,
    token_admission,
)
from eagle_assets.generation.ledger_db import Cursor, LedgerDatabase, open_database
from eagle_assets.generation.liveness import Heartbeat, OwnerRecord, host_id, lease_seconds, why_dead
from eagle_assets.generation.partition_fence import FENCE_SCHEMA, PartitionFence

SCHEMA = (
    """
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
CREATE TABLE IF NOT EXISTS lengths (
  dataset TEXT PRIMARY KEY, next_seq INTEGER NOT NULL DEFAULT 1,
  n INTEGER NOT NULL DEFAULT 0, s1 REAL NOT NULL DEFAULT 0, s2 REAL NOT NULL DEFAULT 0,
  s3 REAL NOT NULL DEFAULT 0, s4 REAL NOT NULL DEFAULT 0,
  eff_n INTEGER NOT NULL DEFAULT 0, eff_s1 REAL NOT NULL DEFAULT 0, eff_s2 REAL NOT NULL DEFAULT 0,
  eff_s3 REAL NOT NULL DEFAULT 0, eff_s4 REAL NOT NULL DEFAULT 0,
  paid REAL NOT NULL DEFAULT 0, priced REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS answers (dataset TEXT NOT NULL, seq INTEGER NOT NULL, tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS slots (owner TEXT PRIMARY KEY, want INTEGER NOT NULL, held INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS uncertain (
  generation_id TEXT PRIMARY KEY, spend_id TEXT NOT NULL, dataset TEXT NOT NULL, partition TEXT NOT NULL,
  prompt_id TEXT NOT NULL, provisional_usd INTEGER NOT NULL, charged_at REAL NOT NULL,
  lookups INTEGER NOT NULL DEFAULT 0, next_lookup REAL NOT NULL);
CREATE TABLE IF NOT EXISTS account (
  id INTEGER PRIMARY KEY, budget_usd INTEGER NOT NULL, max_in_flight INTEGER NOT NULL,
  set_by TEXT NOT NULL, set_host TEXT NOT NULL, set_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS account_changes (
  at REAL NOT NULL, owner TEXT NOT NULL, host TEXT NOT NULL, budget_before INTEGER, budget_after INTEGER NOT NULL,
  max_in_flight_before INTEGER, max_in_flight_after INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS key_usage (id INTEGER PRIMARY KEY, offset_usd BIGINT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS reservations_owner ON reservations(owner);
CREATE INDEX IF NOT EXISTS uncertain_due ON uncertain(next_lookup);
CREATE INDEX IF NOT EXISTS spend_partition ON spend(partition, kind);
CREATE INDEX IF NOT EXISTS answers_seq ON answers(dataset, seq);
"""
    + FENCE_SCHEMA
)
# Created once the columns they index exist (older ledgers gain those columns first).
INDEXES = "CREATE INDEX IF NOT EXISTS reservations_seq ON reservations(dataset, seq)"
# Columns added to reservations after the first release; rows of an older ledger read as hard
# worst-case reservations (prompt part = everything, no completion price), which is what they were.
_ADDED_COLUMNS = {
    "reservations": {
        "seq": "INTEGER NOT NULL DEFAULT 0",
        "hard": "INTEGER NOT NULL DEFAULT 1",
        "prompt_usd": "INTEGER NOT NULL DEFAULT 0",
        "price": "REAL NOT NULL DEFAULT 0",
        # The attempt's generation id once its response head arrived: an orphan with one is settled later.
        "generation_id": "TEXT DEFAULT NULL",
        # Whether a request may have gone out for it (``mark_sent``, written before the send): an orphan that
        # was only reserved ahead is released, not charged. Older rows read as sent, which is the safe side.
        "sent": "INTEGER NOT NULL DEFAULT 1",
    },
    # model: what generated the dataset's answers, so that a fresh dataset of the same model can start from them.
    "lengths": {
        "paid": "REAL NOT NULL DEFAULT 0",
        "priced": "REAL NOT NULL DEFAULT 0",
        "model": "TEXT NOT NULL DEFAULT ''",
    },
    # Owners of an older ledger have no lease (host ''): they are judged by their pid, as they were.
    # budget_usd, max_in_flight: the account settings a spending owner runs with (NULL: one that only reads).
    "owners": {
        "host": "TEXT NOT NULL DEFAULT ''",
        "heartbeat": "REAL NOT NULL DEFAULT 0",
        "lease_s": "REAL NOT NULL DEFAULT 0",
        "budget_usd": "INTEGER DEFAULT NULL",
        "max_in_flight": "INTEGER DEFAULT NULL",
    },
}

log = logging.getLogger(__name__)

GLOBAL = "global"
ACCOUNT_ROW = 1  # the account table holds one row
NANO = 1_000_000_000  # money is stored in integer nano-dollars: sums of floats drift, budgets must not
DEAD_OWNER_CHECK_S = 5.0


def _n(usd: float) -> int:
    return round(usd * NANO)


def _scope(dataset: str) -> str:
    return f"dataset:{dataset}"


@dataclass(frozen=True)
class AccountSettings:
    """What one account allows, whichever host spends from it: the dollar budget and the in-flight cap."""

    budget_usd: float
    max_in_flight: int

    def describe(self) -> str:
        return f"budget_usd ${self.budget_usd:,.2f}, max_in_flight {self.max_in_flight:,}"

    def same_as(self, other: "AccountSettings") -> bool:
        return _n(self.budget_usd) == _n(other.budget_usd) and self.max_in_flight == other.max_in_flight


class AccountSettingsConflict(ConfigError, ValueError):
    """This run's budget or in-flight cap is not the one the live runs on the same ledger hold: run with theirs
    (every host configured alike) or wait for them to finish before changing it."""


@dataclass(frozen=True)
class ReservationRequest:
    """One request to admit: its worst case, the prompt part of it, and its completion price per token."""

    dataset: str
    partition: str
    prompt_id: str
    worst_usd: float
    max_tokens: int
    prompt_usd: float | None = None  # None: the whole worst case is fixed (no completion part)
    price: float = 0.0  # dearest completion USD per token


@dataclass(frozen=True)
class Reservation:
    id: str
    dataset: str
    partition: str
    prompt_id: str
    usd: float  # worst case: what an orphan is charged
    tokens: int  # max_tokens
    seq: int = 0
    hard: bool = True
    prompt_usd: float = 0.0  # the prompt part of ``usd``
    price: float = 0.0  # the completion price per token ``usd`` assumed


@dataclass(frozen=True)
class KeyUsageCheck:
    """One ``reconcile_key_usage``: whether the ledger was quiet enough to hold against the key (else why not),
    what it gave back and from how many head-less orphans."""

    done: bool
    why_not: str
    refunded_usd: float = 0.0
    orphans: int = 0


@dataclass(frozen=True)
class Settlement:
    reservation: Reservation
    usd: float
    tokens: int
    kind: str = "settled"  # settled | discarded | uncertain | failed | released
    # With kind "uncertain": the attempt's generation id, so that ``usd`` is provisional and listed in
    # ``uncertain`` until /generation says what was billed (None: no id was seen, ``usd`` is final).
    generation_id: str | None = None


@dataclass(frozen=True)
class UncertainAttempt:
    """An attempt charged provisionally, awaiting its actual cost from /generation."""

    generation_id: str
    spend_id: str
    dataset: str
    partition: str
    prompt_id: str
    provisional_usd: float
    charged_at: float
    lookups: int
    next_lookup: float


def _uncertain_attempt(row: Sequence[Any]) -> UncertainAttempt:
    """The attempt of an ``uncertain`` row read as (generation_id, spend_id, dataset, partition, prompt_id,
    provisional_usd, charged_at, lookups, next_lookup), money in nano-USD."""
    return UncertainAttempt(row[0], row[1], row[2], row[3], row[4], row[5] / NANO, row[6], row[7], row[8])


@dataclass(frozen=True)
class Denial:
    """Why a reservation was refused: the ``usd`` budget, the dataset's ``tokens`` budget, or the key's ``credits``.

    ``fit``: how many of the requests would have fit (fewer than the minimum asked for).
    """

    reason: str
    detail: str
    fit: int = 0


@dataclass(frozen=True)
class Totals:
    usd_spent: float
    usd_reserved: float
    tokens_spent: int
    tokens_reserved: int
    in_flight: int


@dataclass(frozen=True)
class Outlook:
    """Where a budget will stand once everything in flight has settled at its expected cost.

    ``expected_usd``: spent + what the open requests will cost on average, at the mean length and the
    prices providers actually charged so far (None while some dataset has no length statistics yet);
    ``batch_held_usd``: what ``batch`` more requests like the given one would hold
    on their own; ``expected_tokens``: the dataset's produced + open × mean (None without statistics).
    """

    expected_usd: float | None
    batch_held_usd: float
    expected_tokens: float | None
    mean_tokens: float | None


@dataclass
class _Open:
    """What is open on the ledger, aggregated as admission needs it (one snapshot per transaction)."""

    spent: float
    hard_usd: float
    all_usd: float
    groups: dict[str, OpenGroup] = field(default_factory=dict)


@dataclass(frozen=True)
class _Tokens:
    """A dataset's output tokens when a reservation transaction began: produced, and open on the ledger (requests
    and their max_tokens); ``seed``: the other datasets' answers, for a fresh one (admission's first wave)."""

    produced: int
    open_count: int
    open_max_tokens: int
    seed: Moments | None


@dataclass(frozen=True)
class _Last:
    """A dataset's last request in a prefix, and how many of its requests (and their max_tokens) come before it:
    the token check asks about the last one with the others already open."""

    request: ReservationRequest
    before: int = 0
    before_max_tokens: int = 0


def _with_requests(base: _Open, requests: list[ReservationRequest], hard: bool) -> tuple[_Open, dict[str, _Last]]:
    """What would be open with ``requests`` added to ``base``, and each dataset's last request among them."""
    snap = _Open(base.spent, base.hard_usd, base.all_usd, dict(base.groups))
    lasts: dict[str, _Last] = {}
    for r in requests:
        snap.all_usd += r.worst_usd
        if hard:
            snap.hard_usd += r.worst_usd
        else:
            prompt_usd = r.worst_usd if r.prompt_usd is None else r.prompt_usd
            g = snap.groups.get(r.dataset, OpenGroup())
            snap.groups[r.dataset] = g.plus(r.worst_usd, prompt_usd, r.price, r.max_tokens)
        prev = lasts.get(r.dataset)
        lasts[r.dataset] = (
            _Last(r) if prev is None else _Last(r, prev.before + 1, prev.before_max_tokens + prev.request.max_tokens)
        )
    return snap, lasts


def longest_fit(n: int, check: Callable[[int], Denial | None]) -> tuple[int, Denial | None]:
    """How many of ``n`` requests fit, in order, and why one more does not (None: all ``n`` fit).

    ``check(k)``: why the first ``k`` do not all fit, or None. Every condition only tightens as ``k`` grows,
    so the longest prefix that fits is found by bisection, usually in one call (everything fits).
    """
    denial = check(n)
    if denial is None:
        return n, None
    lo, hi = 0, n  # the first lo fit; the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        why = check(mid)
        if why is None:
            lo = mid
        else:
            hi, denial = mid, why
    return lo, denial


P = ParamSpec("P")
R = TypeVar("R")
_running = threading.local()  # whether this thread is inside a ledger method already (the outermost retries)


def _reconnecting(
    idempotent: bool,
) -> Callable[[Callable[Concatenate["BudgetLedger", P], R]], Callable[Concatenate["BudgetLedger", P], R]]:
    """Run the method again on a new connection when the connection broke under it (``LedgerDatabase.retrying``).

    ``idempotent``: running it twice writes what running it once does (settling skips what is closed, updates
    set values), so even a commit that may have happened is safe to repeat; the others (a reservation, a
    spend row) are repeated only when they certainly did not commit. Arguments that are iterators are read
    into lists first, so that a second run sees them whole.
    """

    def wrap(method: Callable[Concatenate["BudgetLedger", P], R]) -> Callable[Concatenate["BudgetLedger", P], R]:
        @functools.wraps(method)
        def run(self: "BudgetLedger", *args: P.args, **kwargs: P.kwargs) -> R:
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


class LedgerLeaseLost(LeaseLost, RuntimeError):
    """This process's owner lease lapsed and another process charged what it had open: it must stop."""


class BudgetLedger:
    """One connection per process; every public method is one short transaction.

    ``location``: a SQLite path (or ``sqlite:///path``) or a ``postgresql://`` URL (``ledger_db``).
    ``lease_s``: how long this owner counts as alive without a heartbeat (``EAGLE_FORGE_LEASE_S``, 30 s);
    a thread renews it every ``lease_s / 6``.
    ``account``: the budget and in-flight cap this process spends under (a run); checked against the live
    runs' and recorded (``AccountSettingsConflict`` on a disagreement). None: a process that only reads or
    settles (the plan, an observer), which neither sets nor checks them.
    """

    def __init__(
        self,
        location: str | Path,
        owner: str | None = None,
        policy: AdmissionPolicy | None = None,
        lease_s: float | None = None,
        account: AccountSettings | None = None,
    ) -> None:
        self.db: LedgerDatabase = open_database(location)
        self.location = self.db.description
        self.policy = policy or AdmissionPolicy()
        self.lease_s = lease_s or lease_seconds()
        self.host = host_id()
        self.account = account
        self.account_change: str | None = None  # what this owner changed in the account's settings, if anything
        self.owner = owner or f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            self.db.create_schema(SCHEMA, _ADDED_COLUMNS, INDEXES)
            self._register()
        except BaseException:
            self.db.close()
            raise
        self._last_dead_check = time.monotonic()
        self._model_cache: tuple[tuple[Moments, int, AdmissionPolicy], LengthModel | None] | None = None
        self._beat_db = self.db.another()
        self.heartbeat = Heartbeat(self._beat, interval_s=self.lease_s / 6)
        self.recover_dead_owners()

    @_reconnecting(idempotent=True)
    def _register(self) -> None:
        """Record this owner with its lease (and its account settings, once they agree with the live runs')."""
        proc = psutil.Process()
        with self._tx() as cur:
            if self.account is not None:
                self.account_change = self._settle_account(cur, self.account)
            budget = None if self.account is None else _n(self.account.budget_usd)
            cap = None if self.account is None else self.account.max_in_flight
            cur.execute(
                "INSERT INTO owners (owner, pid, create_time, started, host, heartbeat, lease_s, budget_usd,"
                f" max_in_flight) VALUES (?,?,?,?,?,{self.db.now_sql},?,?,?) ON CONFLICT(owner) DO UPDATE SET"
                " pid = excluded.pid, create_time = excluded.create_time, started = excluded.started,"
                " host = excluded.host, heartbeat = excluded.heartbeat, lease_s = excluded.lease_s,"
                " budget_usd = excluded.budget_usd, max_in_flight = excluded.max_in_flight",
                (self.owner, proc.pid, proc.create_time(), time.time(), self.host, self.lease_s, budget, cap),
            )
        if self.account_change:
            log.warning(self.account_change)

    # --- the account's settings -----------------------------------------------------------
    def _settle_account(self, cur: Cursor, mine: AccountSettings) -> str | None:
        """Check ``mine`` against the live runs' settings and record it; returns what changed, if anything.

        A live run (its lease current) that spends under other settings refuses this one: two pods configured
        apart would each hold their own budget and cap. With no such run, settings that differ from the
        recorded ones are a change made on purpose (a budget raised after a top-up): taken, and kept in
        ``account_changes`` with who made it and when.
        """
        recorded = self._account_row(cur)
        if recorded is not None and recorded[0].same_as(mine):
            return None
        others = self._live_spenders(cur)
        differ = [(who, theirs) for who, theirs in others if not theirs.same_as(mine)]
        if differ:
            (who, theirs), more = differ[0], len(differ) - 1
            raise AccountSettingsConflict(
                f"this run's account settings ({mine.describe()}) disagree with those of the live run {who}"
                f"{f' and {more} more' if more else ''} ({theirs.describe()}) on the ledger {self.location}."
                " Every host spends from one account: configure the same budget_usd and max_in_flight everywhere"
                " (EAGLE_FORGE_BUDGET_USD, EAGLE_FORGE_MAX_IN_FLIGHT, or the openrouter resource's fields), or"
                " wait for the live runs to finish before changing them."
            )
        before = None if recorded is None else recorded[0]
        cur.execute(
            "INSERT INTO account (id, budget_usd, max_in_flight, set_by, set_host, set_at) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(id) DO UPDATE SET budget_usd = excluded.budget_usd, max_in_flight ="
            " excluded.max_in_flight, set_by = excluded.set_by, set_host = excluded.set_host, set_at = excluded.set_at",
            (ACCOUNT_ROW, _n(mine.budget_usd), mine.max_in_flight, self.owner, self.host, time.time()),
        )
        cur.execute(
            "INSERT INTO account_changes (at, owner, host, budget_before, budget_after, max_in_flight_before,"
            " max_in_flight_after) VALUES (?,?,?,?,?,?,?)",
            (
                time.time(),
                self.owner,
                self.host,
                None if before is None else _n(before.budget_usd),
                _n(mine.budget_usd),
                None if before is None else before.max_in_flight,
                mine.max_in_flight,
            ),
        )
        if before is None:
            return None  # the first settings of this ledger: nothing changed
        return (
            f"account settings changed on the ledger {self.location}: {before.describe()} (set by"
            f" {recorded[1] if recorded else '?'}) -> {mine.describe()} by owner {self.owner} on {self.host};"
            " no live run held the old ones"
        )

    @staticmethod
    def _account_row(cur: Cursor) -> tuple[AccountSettings, str] | None:
        row = cur.execute(
            "SELECT budget_usd, max_in_flight, set_by, set_host FROM account WHERE id = ?", (ACCOUNT_ROW,)
        ).fetchone()
        return None if row is None else (AccountSettings(row[0] / NANO, row[1]), f"{row[2]} on {row[3]}")

    def _live_spenders(self, cur: Cursor) -> list[tuple[str, AccountSettings]]:
        """Every other owner that spends under account settings and counts as alive now (``why_dead``)."""
        owners, now = self._owners(cur)
        alive = {r.owner: r for r in owners if r.owner != self.owner and why_dead(r, here=self.host, now=now) is None}
        rows = cur.execute(
            "SELECT owner, budget_usd, max_in_flight FROM owners WHERE budget_usd IS NOT NULL"
            " AND max_in_flight IS NOT NULL"
        ).fetchall()
        return [
            (f"{o} (pid {alive[o].pid} on {alive[o].host or 'this host'})", AccountSettings(b / NANO, c))
            for o, b, c in rows
            if o in alive
        ]

    @_reconnecting(idempotent=True)
    def account_settings(self) -> AccountSettings | None:
        """The account's settings as the ledger records them (None before any run set them)."""
        with self.db.read() as cur:
            row = self._account_row(cur)
        return None if row is None else row[0]

    @_reconnecting(idempotent=True)
    def account_history(self) -> list[tuple[float, str, str, AccountSettings | None, AccountSettings]]:
        """Every recorded setting of the account, oldest first: (when, owner, host, before, after)."""
        with self.db.read() as cur:
            rows = cur.execute(
                "SELECT at, owner, host, budget_before, max_in_flight_before, budget_after, max_in_flight_after"
                " FROM account_changes ORDER BY at"
            ).fetchall()
        return [
            (at, o, h, None if b0 is None else AccountSettings(b0 / NANO, c0), AccountSettings(b1 / NANO, c1))
            for at, o, h, b0, c0, b1, c1 in rows
        ]

    def _check_account(self, what: str, value: float, recorded: float) -> None:
        """A caller passing other settings than the ones this owner registered is a bug: refuse loudly."""
        if value != recorded:
            raise AccountSettingsConflict(
                f"{what} {value} passed to the ledger differs from {recorded}, the account setting this run"
                f" registered on {self.location}"
            )

    # --- plumbing ---------------------------------------------------------------------------
    def _tx(self, durable: bool = True) -> AbstractContextManager[Cursor]:
        return self.db.tx(durable)

    def _beat(self) -> bool:
        """Renew this owner's lease (heartbeat thread); False once the row is gone (declared dead). A connection
        that broke is replaced within the same beat, so a database blip costs no lease."""

        def renew() -> bool:
            with self._beat_db.tx(durable=False) as cur:
                sql = f"UPDATE owners SET heartbeat = {self.db.now_sql} WHERE owner = ? RETURNING owner"
                return bool(cur.execute(sql, (self.owner,)).fetchone() is not None)

        return self._beat_db.retrying(renew, idempotent=True, what="ledger heartbeat")

    def _assert_alive(self, cur: Cursor) -> None:
        """Renew the lease inside a write, and refuse to go on once it was lost: a process declared dead
        must not take budget or slots that were handed back on its behalf."""
        sql = f"UPDATE owners SET heartbeat = {self.db.now_sql} WHERE owner = ? RETURNING owner"
        if cur.execute(sql, (self.owner,)).fetchone() is None or self.heartbeat.lost:
            self.heartbeat.lost = True
            raise LedgerLeaseLost(
                f"ledger owner {self.owner} on {self.host} was declared dead (no heartbeat for over"
                f" {self.lease_s:.0f} s, {self.heartbeat.since_ok():.0f} s since the last one this process saw);"
                " its open reservations were charged at worst case and its slots freed. Rerun the partition."
            )

    def partition_fence(self, partition: str, wait_s: float | None = None) -> PartitionFence:
        """The database lease that makes this process the only writer of ``partition``'s journal."""
        return PartitionFence(self, partition, wait_s=wait_s)

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

    def _close_many(self, cur: Cursor, items: list[tuple[Reservation, float, int, str]]) -> list[int]:
        """Close reservations into spend, in one pass; returns the indexes of those that were still open.

        A reservation already closed (settled twice, or recovered as an orphan) is skipped: never count twice.
        """
        if not items:
            return []
        open_ids: set[str] = set()
        ids = list({res.id for res, *_ in items})
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            marks = ",".join("?" * len(part))
            open_ids.update(
                r[0] for r in cur.execute(f"DELETE FROM reservations WHERE id IN ({marks}) RETURNING id", part)
            )
        closed, spend_rows = [], []
        deltas: dict[str, dict[str, int]] = {}
        now = time.time()
        for idx, (res, usd, tokens, kind) in enumerate(items):
            if res.id not in open_ids:
                continue
            open_ids.discard(res.id)  # the same reservation twice in one batch counts once
            closed.append(idx)
            if kind != "released":
                spend_rows.append((res.id, res.dataset, res.partition, res.prompt_id, _n(usd), tokens, kind, now))
            for scope in (GLOBAL, _scope(res.dataset)):
                d = deltas.setdefault(
                    scope, dict(usd_spent=0, usd_reserved=0, tokens_spent=0, tokens_reserved=0, in_flight=0)
                )
                d["usd_spent"] += _n(usd)
                d["usd_reserved"] -= _n(res.usd)
                d["tokens_spent"] += tokens
                d["tokens_reserved"] -= res.tokens
                d["in_flight"] -= 1
        cur.executemany("INSERT INTO spend VALUES (?,?,?,?,?,?,?,?)", spend_rows)
        self._bump_many(cur, deltas)
        return closed

    # --- queries ----------------------------------------------------------------------------
    @_reconnecting(idempotent=True)
    def totals(self, dataset: str | None = None) -> Totals:
        scope = GLOBAL if dataset is None else _scope(dataset)
        with self.db.read() as cur:
            row = cur.execute(
                "SELECT usd_spent, usd_reserved, tokens_spent, tokens_reserved, in_flight FROM totals WHERE scope = ?",
                (scope,),
            ).fetchone()
        if not row:
            return Totals(0.0, 0.0, 0, 0, 0)
        return Totals(row[0] / NANO, row[1] / NANO, row[2], row[3], row[4])

    @_reconnecting(idempotent=True)
    def spend_by_kind(self, partition: str | None = None) -> dict[str, float]:
        q = "SELECT kind, SUM(usd) FROM spend" + (" WHERE partition = ?" if partition else "")
        with self.db.read() as cur:
            rows = cur.execute(q + " GROUP BY kind", (partition,) if partition else ()).fetchall()
        return {k: v / NANO for k, v in rows}

    @_reconnecting(idempotent=True)
    def length_moments(self, dataset: str) -> Moments:
        """The completion-length statistics admission uses for ``dataset`` (completed cohorts only)."""
        with self.db.read() as cur:
            return self._moments(cur, dataset)

    @_reconnecting(idempotent=True)
    def note_model(self, dataset: str, model: str) -> None:
        """Record which model answers ``dataset``: other datasets of that model may seed its statistics."""
        with self._tx() as cur:
            cur.execute("INSERT INTO lengths(dataset) VALUES (?) ON CONFLICT DO NOTHING", (dataset,))
            cur.execute("UPDATE lengths SET model = ? WHERE dataset = ?", (model, dataset))

    @_reconnecting(idempotent=True)
    def dataset_lengths(self) -> dict[str, tuple[str, Moments]]:
        """dataset → (model, the completed-cohort moments admission uses), for every dataset on the ledger."""
        with self.db.read() as cur:
            rows = cur.execute("SELECT dataset, model, eff_n, eff_s1, eff_s2, eff_s3, eff_s4 FROM lengths").fetchall()
        return {d: (model, Moments(*m)) for d, model, *m in rows}

    @staticmethod
    def _seed_moments(cur: Cursor, dataset: str) -> Moments:
        """The pooled answers of the other datasets of ``dataset``'s model (empty if its model is unknown)."""
        row = cur.execute("SELECT model FROM lengths WHERE dataset = ?", (dataset,)).fetchone()
        if not row or not row[0]:
            return Moments()
        n, s1, s2, s3, s4 = cur.execute(
            "SELECT COALESCE(SUM(eff_n), 0), COALESCE(SUM(eff_s1), 0), COALESCE(SUM(eff_s2), 0),"
            " COALESCE(SUM(eff_s3), 0), COALESCE(SUM(eff_s4), 0) FROM lengths WHERE model = ? AND dataset != ?",
            (row[0], dataset),
        ).fetchone()
        return Moments(int(n), s1, s2, s3, s4)

    def length_model(self, dataset: str, max_tokens: int) -> LengthModel | None:
        return LengthModel.from_moments(self.length_moments(dataset), self.policy, max_tokens)

    @_reconnecting(idempotent=True)
    def outlook(self, request: ReservationRequest, batch: int) -> Outlook:
        """Numbers for the decision to stop at a budget's tail (see ``Outlook``)."""
        with self.db.read() as cur:
            snap = self._open(cur)
            moments = {d: self._moments(cur, d) for d in {*snap.groups, request.dataset}}
            open_expected: float | None = 0.0
            for d, g in snap.groups.items():
                one = expected_usd([(g, self._model(moments[d], g.max_tokens))])
                if one is None or open_expected is None:
                    open_expected = None
                    continue
                paid, priced = cur.execute("SELECT paid, priced FROM lengths WHERE dataset = ?", (d,)).fetchone()
                open_expected += one * (min(1.0, paid / priced) if priced > 0 else 1.0)
            model = self._model(moments[request.dataset], request.max_tokens)
            prompt_usd = request.worst_usd if request.prompt_usd is None else request.prompt_usd
            g = OpenGroup.of(batch, request.worst_usd, prompt_usd, request.price, request.max_tokens)
            batch_held = g.worst_usd if self.policy.hard else held_usd([(g, model)], self.policy)
            row = cur.execute(
                "SELECT tokens_spent, in_flight FROM totals WHERE scope = ?", (_scope(request.dataset),)
            ).fetchone()
        produced, open_count = row or (0, 0)
        return Outlook(
            None if open_expected is None or self.policy.hard else snap.spent + snap.hard_usd + open_expected,
            batch_held,
            None if model is None else produced + open_count * model.mean,
            None if model is None else model.mean,
        )

    @_reconnecting(idempotent=True)
    def open_held_usd(self) -> float:
        """What the open reservations hold of the dollar budget now (the admission check's left side, less spend)."""
        with self.db.read() as cur:
            snap = self._open(cur)
            return self._held(cur, snap, {}) - snap.spent

    @staticmethod
    def _moments(cur: Cursor, dataset: str) -> Moments:
        row = cur.execute(
            "SELECT eff_n, eff_s1, eff_s2, eff_s3, eff_s4 FROM lengths WHERE dataset = ?", (dataset,)
        ).fetchone()
        return Moments(*row) if row else Moments()

    # --- admission --------------------------------------------------------------------------
    def _open(self, cur: Cursor) -> _Open:
        (spent,) = cur.execute("SELECT usd_spent FROM totals WHERE scope = ?", (GLOBAL,)).fetchone() or (0,)
        snap = _Open(spent / NANO, 0.0, 0.0)
        rows = cur.execute(
            "SELECT dataset, hard, COUNT(*), SUM(usd), SUM(prompt_usd), SUM(price), SUM(price * price), MAX(price),"
            " MAX(tokens) FROM reservations GROUP BY dataset, hard"
        ).fetchall()
        for dataset, hard, count, usd, prompt, p1, p2, pmax, tmax in rows:
            snap.all_usd += usd / NANO
            if hard:
                snap.hard_usd += usd / NANO
            else:
                snap.groups[dataset] = OpenGroup(count, usd / NANO, prompt / NANO, p1, p2, pmax, tmax)
        return snap

    def _held(self, cur: Cursor, snap: _Open, models: dict[str, Moments]) -> float:
        """``spent`` plus what everything open holds, under this ledger's policy."""
        if self.policy.hard:
            return snap.spent + snap.all_usd
        for d in snap.groups:
            if d not in models:
                models[d] = self._moments(cur, d)
        groups = [(g, self._model(models[d], g.max_tokens)) for d, g in snap.groups.items()]
        return snap.spent + snap.hard_usd + held_usd(groups, self.policy)

    def _model(self, moments: Moments, max_tokens: int) -> LengthModel | None:
        """``LengthModel.from_moments``, remembered: a chunk of requests asks the same question many times."""
        key = (moments, max_tokens, self.policy)
        if self._model_cache is None or self._model_cache[0] != key:
            self._model_cache = (key, LengthModel.from_moments(moments, self.policy, max_tokens))
        return self._model_cache[1]

    @_reconnecting(idempotent=False)
    def reserve_many(
        self,
        requests: Iterable[ReservationRequest | tuple[str, str, str, float, int]],
        *,
        budget_usd: float,
        token_budget: int | None,
        account_cap_usd: float | None = None,
        min_grant: int = 1,
    ) -> tuple[list[Reservation], Denial | None]:
        """Reserve requests in order until one does not fit; all or nothing below ``min_grant``.

        ``account_cap_usd``: the most the ledger's total spend may reach on the key's remaining credit
        (spend at the last poll + the key's ``limit_remaining``); a denial on it reads ``credits``.
        A plain tuple ``(dataset, partition, prompt_id, usd, tokens)`` is a request of fixed cost ``usd``.
        """
        if self.account is not None:
            self._check_account("budget_usd", _n(budget_usd) / NANO, _n(self.account.budget_usd) / NANO)
        reqs = [r if isinstance(r, ReservationRequest) else ReservationRequest(*r) for r in requests]
        cap, cap_reason = budget_usd, "usd"
        if account_cap_usd is not None and account_cap_usd < budget_usd:
            cap, cap_reason = account_cap_usd, "credits"
        with self._tx() as cur:
            self._assert_alive(cur)
            base = self._open(cur)
            moments: dict[str, Moments] = {}
            tokens = {} if token_budget is None else self._dataset_tokens(cur, {r.dataset for r in reqs}, moments)

            def check(k: int) -> Denial | None:
                """Why the first ``k`` requests do not all fit (the dollar cap first, then each dataset's tokens)."""
                snap, lasts = _with_requests(base, reqs[:k], self.policy.hard)
                denial = self._dollar_denial(cur, snap, moments, cap, cap_reason)
                if denial is None and token_budget is not None:
                    denial = self._token_denial(lasts, tokens, moments, token_budget)
                return denial

            fit, denial = longest_fit(len(reqs), check)
            if denial is not None and fit < min_grant:
                return [], Denial(denial.reason, denial.detail, fit=fit)
            granted = [(r, r.worst_usd if r.prompt_usd is None else r.prompt_usd) for r in reqs[:fit]]
            out = self._insert_many(cur, granted, self.policy.hard)
        if denial is not None:
            denial = Denial(denial.reason, denial.detail, fit=len(out))
        return out, denial

    def _dataset_tokens(self, cur: Cursor, datasets: Iterable[str], moments: dict[str, Moments]) -> dict[str, _Tokens]:
        """Each dataset's output tokens as the transaction began; its answers' moments go into ``moments``."""
        out = {}
        for d in datasets:
            row = cur.execute(
                "SELECT tokens_spent, in_flight, tokens_reserved FROM totals WHERE scope = ?", (_scope(d),)
            ).fetchone()
            produced, open_count, open_max_tokens = row or (0, 0, 0)
            moments[d] = self._moments(cur, d)
            fresh = moments[d].n < self.policy.min_samples and not self.policy.hard
            out[d] = _Tokens(produced, open_count, open_max_tokens, self._seed_moments(cur, d) if fresh else None)
        return out

    def _dollar_denial(
        self, cur: Cursor, snap: _Open, moments: dict[str, Moments], cap: float, cap_reason: str
    ) -> Denial | None:
        """Why what ``snap`` holds, on top of what was spent, does not fit under ``cap``, or None."""
        need = self._held(cur, snap, moments)
        if _n(need) <= _n(cap):
            return None
        what = "budget" if cap_reason == "usd" else "the key's remaining credit"
        return Denial(
            cap_reason,
            f"${snap.spent:.4f} spent + ${need - snap.spent:.4f} held by requests in flight would pass"
            f" ${cap:.2f} ({what}{', worst case' if self.policy.hard else ''})",
        )

    def _token_denial(
        self, lasts: dict[str, _Last], tokens: dict[str, _Tokens], moments: dict[str, Moments], token_budget: int
    ) -> Denial | None:
        """Why some dataset's last request would pass its token budget with its others open, or None."""
        for d, last in lasts.items():
            t = tokens[d]
            decision = token_admission(
                produced=t.produced,
                open_count=t.open_count + last.before,
                open_max_tokens=t.open_max_tokens + last.before_max_tokens,
                new_max_tokens=last.request.max_tokens,
                budget=token_budget,
                model=self._model(moments[d], last.request.max_tokens)
                or (None if t.seed is None else LengthModel.seeded(t.seed, self.policy, last.request.max_tokens)),
                policy=self.policy,
            )
            if not decision.admit:
                return Denial("tokens", decision.detail)
        return None

    def _insert_many(
        self, cur: Cursor, granted: list[tuple[ReservationRequest, float]], hard: bool
    ) -> list[Reservation]:
        if not granted:
            return []
        next_seq: dict[str, int] = {}
        for r, _ in granted:
            if r.dataset not in next_seq:
                cur.execute("INSERT INTO lengths(dataset) VALUES (?) ON CONFLICT DO NOTHING", (r.dataset,))
                (next_seq[r.dataset],) = cur.execute(
                    "SELECT next_seq FROM lengths WHERE dataset = ?", (r.dataset,)
                ).fetchone()
        out, rows = [], []
        deltas: dict[str, dict[str, int]] = {}
        now = time.time()
        for r, prompt_usd in granted:
            seq = next_seq[r.dataset]
            next_seq[r.dataset] = seq + 1
            res = Reservation(
                uuid.uuid4().hex,
                r.dataset,
                r.partition,
                r.prompt_id,
                r.worst_usd,
                r.max_tokens,
                seq,
                hard,
                prompt_usd,
                r.price,
            )
            out.append(res)
            rows.append(
                (
                    res.id,
                    self.owner,
                    r.dataset,
                    r.partition,
                    r.prompt_id,
                    _n(r.worst_usd),
                    r.max_tokens,
                    now,
                    seq,
                    int(hard),
                    _n(prompt_usd),
                    r.price,
                    0,
                )
            )
            for scope in (GLOBAL, _scope(r.dataset)):
                d = deltas.setdefault(scope, dict(usd_reserved=0, tokens_reserved=0, in_flight=0))
                d["usd_reserved"] += _n(r.worst_usd)
                d["tokens_reserved"] += r.max_tokens
                d["in_flight"] += 1
        cur.executemany(
            "INSERT INTO reservations (id, owner, dataset, partition, prompt_id, usd, tokens, created, seq, hard,"
            " prompt_usd, price, sent) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        cur.executemany("UPDATE lengths SET next_seq = ? WHERE dataset = ?", [(v, k) for k, v in next_seq.items()])
        self._bump_many(cur, deltas)
        return out

    # --- settlement -------------------------------------------------------------------------
    @_reconnecting(idempotent=True)
    def settle_many(self, settlements: Iterable[Settlement]) -> None:
        """Close reservations; answers feed the length statistics (a lost attempt counts as max_tokens).

        An ``uncertain`` settlement with a generation id is listed for a later lookup (``due_uncertain``).
        """
        sts = list(settlements)
        items = [(st.reservation, st.usd, st.tokens, st.kind) for st in sts]
        with self._tx() as cur:
            closed = self._close_many(cur, items)
            now = time.time()
            provisional = [sts[i] for i in closed if sts[i].kind == "uncertain"]
            self._list_uncertain(cur, [(st.generation_id, st.reservation, st.usd, now) for st in provisional])
            answers = []
            prices: dict[str, list[float]] = {}
            for i in closed:
                res, usd, tokens, kind = items[i]
                # An attempt whose answer was lost may have run long (timeouts do): count it at its maximum.
                length = tokens if kind == "settled" else res.tokens if kind == "uncertain" else None
                if length is not None:
                    answers.append((res.dataset, res.seq, int(length)))
                if kind == "settled" and res.price > 0:
                    # What providers charged against what the dearest price would have: the tail's outlook.
                    paid = prices.setdefault(res.dataset, [0.0, 0.0])
                    paid[0] += usd
                    paid[1] += res.prompt_usd + tokens * res.price
            cur.executemany("INSERT INTO answers VALUES (?,?,?)", answers)
            cur.executemany(
                "UPDATE lengths SET paid = paid + ?, priced = priced + ? WHERE dataset = ?",
                [(paid, priced, d) for d, (paid, priced) in prices.items()],
            )
            for dataset in {items[i][0].dataset for i in closed}:
                self._refresh_lengths(cur, dataset)

    def _refresh_lengths(self, cur: Cursor, dataset: str) -> None:
        """Fold answers below the oldest open admission into the dataset's statistics (see ``cohort_moments``)."""
        row = cur.execute("SELECT next_seq, n, s1, s2, s3, s4 FROM lengths WHERE dataset = ?", (dataset,)).fetchone()
        if row is None:
            return
        next_seq, *folded_row = row
        (frontier,) = cur.execute("SELECT MIN(seq) FROM reservations WHERE dataset = ?", (dataset,)).fetchone()
        frontier = next_seq if frontier is None else frontier
        n, s1, s2, s3, s4 = cur.execute(
            "SELECT COUNT(*), COALESCE(SUM(tokens * 1.0), 0), COALESCE(SUM(tokens * tokens * 1.0), 0),"
            " COALESCE(SUM(tokens * tokens * tokens * 1.0), 0),"
            " COALESCE(SUM(tokens * tokens * 1.0 * tokens * tokens), 0) FROM answers WHERE dataset = ? AND seq < ?",
            (dataset, frontier),
        ).fetchone()
        folded = Moments(*folded_row)
        if n:
            folded = folded + Moments(n, s1, s2, s3, s4)
            cur.execute("DELETE FROM answers WHERE dataset = ? AND seq < ?", (dataset, frontier))
        effective = folded
        if folded.n < self.policy.min_samples:
            settled = cur.execute("SELECT seq, tokens FROM answers WHERE dataset = ?", (dataset,)).fetchall()
            open_ = cur.execute("SELECT seq, tokens FROM reservations WHERE dataset = ?", (dataset,)).fetchall()
            effective = cohort_moments(folded, settled, open_, self.policy.cohort_slack)
        cur.execute(
            "UPDATE lengths SET n=?, s1=?, s2=?, s3=?, s4=?, eff_n=?, eff_s1=?, eff_s2=?, eff_s3=?, eff_s4=?"
            " WHERE dataset = ?",
            (
                folded.n,
                folded.s1,
                folded.s2,
                folded.s3,
                folded.s4,
                effective.n,
                effective.s1,
                effective.s2,
                effective.s3,
                effective.s4,
                dataset,
            ),
        )

    @staticmethod
    def _list_uncertain(cur: Cursor, rows: list[tuple[str | None, Reservation, float, float]]) -> None:
        """List provisional charges (generation id, the reservation whose spend row holds it, usd, when)."""
        cur.executemany(
            "INSERT INTO uncertain (generation_id, spend_id, dataset, partition, prompt_id, provisional_usd,"
            " charged_at, lookups, next_lookup) VALUES (?,?,?,?,?,?,?,0,?) ON CONFLICT (generation_id) DO NOTHING",
            [
                (gen_id, res.id, res.dataset, res.partition, res.prompt_id, _n(usd), now, now)
                for gen_id, res, usd, now in rows
                if gen_id
            ],
        )

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose request was never billed."""
        self.settle_many([Settlement(reservation, 0.0, 0, "released")])

    @_reconnecting(idempotent=False)
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

    # --- the account-wide in-flight cap -----------------------------------------------------
    @_reconnecting(idempotent=True)
    def lease_slots(self, want: int, in_use: int, capacity: int) -> int:
        """How many requests this process may have in flight now, out of ``capacity`` for the whole ledger.

        Every process records what it wants; each gets a fair share (``admission.fair_shares``), and
        never more than the others leave free. A process above its share keeps the slots it uses and
        gives them back as its requests finish (``held = max(in_use, limit)``), so the sum of what is
        held never passes the capacity.
        """
        if self.account is not None:
            self._check_account("max_in_flight", capacity, self.account.max_in_flight)
        if time.monotonic() - self._last_dead_check > min(DEAD_OWNER_CHECK_S, self.lease_s / 10):
            self.recover_dead_owners()
        with self._tx(durable=False) as cur:  # re-leased every 0.1 s: soft state
            self._assert_alive(cur)
            rows = cur.execute("SELECT owner, want, held FROM slots WHERE owner != ?", (self.owner,)).fetchall()
            wants = {o: w for o, w, _ in rows}
            wants[self.owner] = want
            share = fair_shares(wants, capacity)[self.owner]
            limit = max(0, min(share, capacity - sum(h for _, _, h in rows)))
            cur.execute(
                "INSERT INTO slots (owner, want, held) VALUES (?,?,?)"
                " ON CONFLICT(owner) DO UPDATE SET want = excluded.want, held = excluded.held",
                (self.owner, want, max(in_use, limit)),
            )
        return limit

    # --- crash recovery ---------------------------------------------------------------------
    def _owners(self, cur: Cursor) -> tuple[list[OwnerRecord], float]:
        rows = cur.execute(
            f"SELECT owner, pid, create_time, host, heartbeat, lease_s, {self.db.now_sql} FROM owners"
        ).fetchall()
        now = rows[0][6] if rows else 0.0
        return [OwnerRecord(*r[:6]) for r in rows], now

    @_reconnecting(idempotent=True)
    def dead_owners(self) -> dict[str, str]:
        """Owners other than this one that count as dead now, and why (``liveness.why_dead``)."""
        with self.db.read() as cur:
            owners, now = self._owners(cur)
        out = {}
        for row in owners:
            if row.owner != self.owner and (why := why_dead(row, here=self.host, now=now)) is not None:
                out[row.owner] = why
        return out

    @_reconnecting(idempotent=True)
    def recover_dead_owners(self) -> int:
        """Turn the reservations of dead owners into worst-case spend and free their slots; returns how many.

        Whether an owner is dead is asked again inside the write: a heartbeat that arrived meanwhile saves it.
        """
        self._last_dead_check = time.monotonic()
        count = 0
        for owner in self.dead_owners():
            with self._tx() as cur:
                count += self._orphan_if_dead(cur, owner)
        return count

    def _orphan_if_dead(self, cur: Cursor, owner: str) -> int:
        owners, now = self._owners(cur)
        row = next((r for r in owners if r.owner == owner), None)
        if row is None or why_dead(row, here=self.host, now=now) is None:
            return 0
        return self._orphan_owner(cur, owner)

    def _orphan_owner(self, cur: Cursor, owner: str) -> int:
        """Charge an owner's open reservations and forget the owner; those whose request never went out (reserved
        ahead, not ``mark_sent``) are released.

        An orphan whose response head had arrived is charged its worst case provisionally and settled later by its
        generation id. One sent without a head names nothing that ``/generation`` could look up, so its charge is
        final: its worst case when held hard, else its dataset's share of what those requests hold under the
        admission bound (``_headless_charges``), the same bound that admitted them."""
        rows = cur.execute(
            "SELECT id, dataset, partition, prompt_id, usd, tokens, seq, hard, prompt_usd, price, generation_id, sent"
            " FROM reservations WHERE owner = ?",
            (owner,),
        ).fetchall()
        orphans = [
            Reservation(
                row[0], row[1], row[2], row[3], row[4] / NANO, row[5], row[6], bool(row[7]), row[8] / NANO, row[9]
            )
            for row in rows
        ]
        headless = self._headless_charges(
            cur, [res for row, res in zip(rows, orphans, strict=True) if row[11] and not row[10]]
        )
        self._close_many(
            cur,
            [
                (res, res.usd, 0, "orphan")
                if row[10]
                else (res, headless.get(res.id, res.usd), 0, "orphan_headless")
                if row[11]
                else (res, 0.0, 0, "released")
                for row, res in zip(rows, orphans, strict=True)
            ],
        )
        # An orphan whose response head had arrived names its generation: look its real cost up later.
        now = time.time()
        self._list_uncertain(cur, [(row[10], res, res.usd, now) for row, res in zip(rows, orphans, strict=True)])
        for dataset in {res.dataset for res in orphans}:
            self._refresh_lengths(cur, dataset)
        cur.execute("DELETE FROM owners WHERE owner = ?", (owner,))
        cur.execute("DELETE FROM slots WHERE owner = ?", (owner,))
        PartitionFence.release_all(cur, owner)
        return len(rows)

    def _headless_charges(self, cur: Cursor, orphans: list[Reservation]) -> dict[str, float]:
        """What each statistical orphan sent without a response head is charged, by reservation id.

        Their bill can never be looked up, so worst case for good overcharged every kill by the requests whose head
        had not come (the soak: 9% over what was billed). They are a random draw of their dataset's answers, so
        per dataset they are charged what the admission bound holds for them (expected cost plus its deviation at
        the policy's overspend probability, never above their worst case), split in proportion to worst case.
        Held hard (the policy or the reservation), or a dataset without enough answers for a length model: worst
        case, as before."""
        if self.policy.hard:
            return {}
        by_dataset: dict[str, list[Reservation]] = {}
        for res in orphans:
            if not res.hard:
                by_dataset.setdefault(res.dataset, []).append(res)
        charges: dict[str, float] = {}
        for dataset, group in by_dataset.items():
            open_group = OpenGroup(
                count=len(group),
                worst_usd=sum(r.usd for r in group),
                prompt_usd=sum(r.prompt_usd for r in group),
                price_sum=sum(r.price for r in group),
                price_sq_sum=sum(r.price * r.price for r in group),
                price_max=max(r.price for r in group),
                max_tokens=max(r.tokens for r in group),
            )
            model = self._model(self._moments(cur, dataset), open_group.max_tokens)
            if model is None or open_group.worst_usd <= 0:
                continue
            share = held_usd([(open_group, model)], self.policy) / open_group.worst_usd
            charges.update({r.id: r.usd * min(1.0, share) for r in group})
        return charges

    @_reconnecting(idempotent=True)
    def correct_orphans(self, partition: str, actual: Mapping[str, tuple[float, int]]) -> float:
        """Replace orphan worst-case spend by the journaled actual cost; returns dollars refunded."""
        refunded = 0.0
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT id, dataset, usd FROM spend WHERE partition = ? AND kind IN ('orphan', 'orphan_headless')",
                (partition,),
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
                cur.execute("DELETE FROM uncertain WHERE spend_id = ?", (rid,))  # known exactly now
                refunded += nano / NANO - real_usd
        return refunded

    @_reconnecting(idempotent=False)
    def reconcile_key_usage(self, key_usage_usd: float, *, quiet_s: float, now: float | None = None) -> KeyUsageCheck:
        """Hold the ledger against the key's own usage counter (``/key``'s ``usage``), and give back what the orphans
        sent without a response head were charged beyond what the key was billed.

        Those orphans name nothing that ``/generation`` could look up, so their charge (``_headless_charges``) is a
        bound, not a bill. The key's usage counts every request billed, named or not: at a quiet moment (nothing
        open or uncertain on the ledger, no spend for ``quiet_s``, so that the counter has caught up) the key's usage
        less the ledger's spend is a fixed offset (what the key spent before or beside this ledger). The first quiet
        check records it; a later one that finds the offset smaller finds the ledger over by that much, and gives it
        back from the head-less orphans charged since (never more than they were charged, in proportion). A larger
        offset (the key used elsewhere, or a head-less orphan that was billed) gives nothing back. Either way the
        offset is recorded again, and those orphans are final.
        """
        now = time.time() if now is None else now
        with self._tx() as cur:
            (open_count,) = cur.execute("SELECT COUNT(*) FROM reservations").fetchone()
            (uncertain,) = cur.execute("SELECT COUNT(*) FROM uncertain").fetchone()
            (last_spend,) = cur.execute("SELECT MAX(at) FROM spend").fetchone()
            if open_count or uncertain:
                return KeyUsageCheck(False, f"{open_count} requests open, {uncertain} uncertain")
            if last_spend is not None and now - last_spend < quiet_s:
                return KeyUsageCheck(False, f"last spend {now - last_spend:.0f} s ago, under {quiet_s:.0f} s")
            (spent,) = cur.execute("SELECT usd_spent FROM totals WHERE scope = ?", (GLOBAL,)).fetchone() or (0,)
            mark = cur.execute("SELECT offset_usd FROM key_usage WHERE id = 1").fetchone()
            headless = cur.execute("SELECT id, dataset, usd FROM spend WHERE kind = 'orphan_headless'").fetchall()
            refund = 0
            if mark is not None and headless:
                charged = sum(row[2] for row in headless)
                refund = max(0, min(charged, mark[0] - (_n(key_usage_usd) - spent)))
                given = 0
                for i, (rid, dataset, nano) in enumerate(headless):
                    part = refund - given if i == len(headless) - 1 else refund * nano // charged
                    given += part
                    cur.execute("UPDATE spend SET usd = ?, kind = 'orphan_reconciled' WHERE id = ?", (nano - part, rid))
                    for scope in (GLOBAL, _scope(dataset)):
                        self._bump(cur, scope, usd_spent=-part)
            elif headless:  # no earlier mark to hold them against: their charge stands
                cur.execute("UPDATE spend SET kind = 'orphan_reconciled' WHERE kind = 'orphan_headless'")
            offset = _n(key_usage_usd) - (spent - refund)
            cur.execute("DELETE FROM key_usage WHERE id = 1")
            cur.execute("INSERT INTO key_usage(id, offset_usd, at) VALUES (1, ?, ?)", (offset, now))
            return KeyUsageCheck(True, "", refunded_usd=refund / NANO, orphans=len(headless))

    # --- attempts awaiting settlement -------------------------------------------------------
    @_reconnecting(idempotent=True)
    def note_generation_ids(self, pairs: Iterable[tuple[Reservation, str]]) -> None:
        """Remember which generation an open reservation's request started, as soon as the response head
        names it: should this process die, the orphan is then settled from /generation, not charged for good."""
        rows = [(gen_id, res.id) for res, gen_id in pairs if gen_id]
        if not rows:
            return
        with self._tx() as cur:
            cur.executemany("UPDATE reservations SET generation_id = ? WHERE id = ?", rows)

    @_reconnecting(idempotent=True)
    def mark_sent(self, reservation_ids: Iterable[str]) -> None:
        """Requests about to go out for these reservations (written before the send): from here on an orphan of
        one is charged, since it may have been billed; before, it is released. A generation id noted for an
        earlier attempt no longer stands for the reservation (the new attempt's head will name its own)."""
        rows = [(rid,) for rid in reservation_ids]
        if not rows:
            return
        with self._tx() as cur:
            cur.executemany("UPDATE reservations SET sent = 1, generation_id = NULL WHERE id = ?", rows)

    @_reconnecting(idempotent=True)
    def due_uncertain(
        self, now: float, limit: int = 200, claim_s: float = 30.0, due_by: float | None = None
    ) -> list[UncertainAttempt]:
        """Claim up to ``limit`` attempts whose lookup is due by ``due_by`` (default ``now``): their next
        lookup moves ``claim_s`` past ``now``, so that processes settling at once do not all look the same
        ids up."""
        with self._tx() as cur:
            rows = cur.execute(
                "SELECT generation_id, spend_id, dataset, partition, prompt_id, provisional_usd, charged_at, lookups,"
                " next_lookup FROM uncertain WHERE next_lookup <= ? ORDER BY next_lookup LIMIT ?",
                (now if due_by is None else due_by, limit),
            ).fetchall()
            cur.executemany(
                "UPDATE uncertain SET next_lookup = ? WHERE generation_id = ?", [(now + claim_s, r[0]) for r in rows]
            )
        return [_uncertain_attempt(r) for r in rows]

    @_reconnecting(idempotent=True)
    def uncertain_attempts(self, partition: str | None = None) -> list[UncertainAttempt]:
        """Every attempt still awaiting settlement (of one partition, or all)."""
        q = (
            "SELECT generation_id, spend_id, dataset, partition, prompt_id, provisional_usd, charged_at, lookups,"
            " next_lookup FROM uncertain"
        )
        with self.db.read() as cur:
            rows = cur.execute(
                q + (" WHERE partition = ?" if partition else "") + " ORDER BY charged_at",
                (partition,) if partition else (),
            ).fetchall()
        return [_uncertain_attempt(r) for r in rows]

    @_reconnecting(idempotent=True)
    def reschedule_uncertain(self, items: Iterable[tuple[str, float]]) -> None:
        """One more lookup found nothing (404: not indexed yet): count it and set when to look again."""
        rows = [(at, gen_id) for gen_id, at in items]
        if not rows:
            return
        with self._tx() as cur:
            cur.executemany("UPDATE uncertain SET lookups = lookups + 1, next_lookup = ? WHERE generation_id = ?", rows)

    @_reconnecting(idempotent=True)
    def resolve_uncertain(self, items: Iterable[tuple[str, float]]) -> float:
        """Replace provisional charges by what /generation says was billed; returns the dollars given back
        (negative if an attempt cost more than its provisional charge). An id no longer listed (settled by
        another process) is skipped: never corrected twice."""
        refunded = 0
        with self._tx() as cur:
            for gen_id, actual_usd in items:
                row = cur.execute(
                    "DELETE FROM uncertain WHERE generation_id = ? RETURNING spend_id", (gen_id,)
                ).fetchone()
                if row is None:
                    continue
                spend = cur.execute("SELECT dataset, usd, kind FROM spend WHERE id = ?", (row[0],)).fetchone()
                if spend is None:
                    continue
                dataset, nano, kind = spend
                actual = _n(max(0.0, actual_usd))
                cur.execute("UPDATE spend SET usd = ?, kind = ? WHERE id = ?", (actual, f"{kind}_settled", row[0]))
                for scope in (GLOBAL, _scope(dataset)):
                    self._bump(cur, scope, usd_spent=actual - nano)
                refunded += nano - actual
        return refunded / NANO

    @_reconnecting(idempotent=True)
    def write_off_uncertain(self, generation_ids: Iterable[str]) -> float:
        """Stop looking these attempts up: their provisional charge stands for good; returns its sum."""
        total = 0
        with self._tx() as cur:
            for gen_id in generation_ids:
                row = cur.execute(
                    "DELETE FROM uncertain WHERE generation_id = ? RETURNING spend_id, provisional_usd", (gen_id,)
                ).fetchone()
                if row is None:
                    continue
                cur.execute("UPDATE spend SET kind = kind || '_written_off' WHERE id = ?", (row[0],))
                total += row[1]
        return total / NANO

    def close(self) -> None:
        self.heartbeat.stop()
        self._beat_db.close()
        try:
            self._close_owner()
        finally:
            self.db.close()

    @_reconnecting(idempotent=True)
    def _close_owner(self) -> None:
        with self._tx() as cur:
            # A clean close with open reservations means requests were abandoned: count them.
            self._orphan_owner(cur, self.owner)
