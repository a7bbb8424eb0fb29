"""A PostgreSQL ledger outlives its connections: backends terminated by ``pg_terminate_backend`` from another
connection on the real server, between transactions and in the middle of one. Nothing is counted twice."""

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from eagle_assets.generation.ledger import BudgetLedger, Settlement
from eagle_assets.generation.ledger.database import (
    LEDGER_LOCK_KEY,
    LedgerConnectionLost,
    LedgerDatabaseUnavailable,
    connection_string,
    open_database,
)


@pytest.fixture
def pg_url(fresh_pg_database: Callable[[], str]) -> str:
    return fresh_pg_database()


@pytest.fixture
def admin(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """Another connection to the same database: the one that terminates the ledger's backends."""
    conn = psycopg.connect(pg_url, autocommit=True)
    yield conn
    conn.close()


def _terminate(admin: psycopg.Connection[Any], pid: int) -> None:
    assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    _until(lambda: admin.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (0,))


def _until(fact: Callable[[], bool], what: str = "the fact") -> None:
    """Wait for a fact (not a duration): fail only if it never comes."""
    deadline = time.monotonic() + 30
    while not fact():
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


def test_the_connection_carries_keepalives_and_server_timeouts(pg_url):
    db = open_database(pg_url)
    try:
        params = db._db.info.get_parameters()  # type: ignore[attr-defined]
        assert params["keepalives"] == "1" and params["keepalives_idle"] == "30"
        assert params["tcp_user_timeout"] == "60000"
        with db.read() as cur:
            assert cur.execute("SHOW statement_timeout").fetchone() == ("3min",)
            assert cur.execute("SHOW lock_timeout").fetchone() == ("2min",)
            assert cur.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1min",)
    finally:
        db.close()
    # What the URL sets itself wins over the defaults.
    mine = connection_string(pg_url + "&keepalives_idle=5&options=-c%20lock_timeout%3D7s")
    assert "keepalives_idle=5" in mine and "lock_timeout=7s" in mine and "lock_timeout=120s" not in mine
    assert "statement_timeout=180s" in mine


def test_run_and_heartbeat_recover_after_their_backends_are_terminated(pg_url, admin):
    led = BudgetLedger(pg_url, lease_s=3.0)
    try:
        granted, _ = led.reserve_many(
            [("B1", "B1/0", f"p{i}", 0.25, 10) for i in range(4)], budget_usd=10.0, token_budget=None
        )
        led.mark_sent([r.id for r in granted])
        main_pid, beat_pid = led.db._db.info.backend_pid, led._beat_db._db.info.backend_pid  # type: ignore[attr-defined]
        _terminate(admin, main_pid)
        _terminate(admin, beat_pid)
        # The heartbeat renews on a new connection: its backend changes and its lease moves on.
        renewed_before = led.heartbeat.last_ok
        _until(lambda: led.heartbeat.last_ok > renewed_before + 0.01, "a renewal after the kill")
        assert led._beat_db._db.info.backend_pid != beat_pid  # type: ignore[attr-defined]
        assert not led.heartbeat.lost
        # The run goes on: settle, reserve, read; each exactly once.
        led.settle_many([Settlement(r, 0.10, 5) for r in granted[:2]])
        assert led.db._db.info.backend_pid != main_pid  # type: ignore[attr-defined]
        more, _ = led.reserve_many([("B1", "B1/0", "q", 0.25, 10)], budget_usd=10.0, token_budget=None)
        t = led.totals()
        assert len(more) == 1 and t.in_flight == 3
        assert t.usd_spent == pytest.approx(0.20) and t.usd_reserved == pytest.approx(0.75)
        with led.db.read() as cur:
            assert cur.execute("SELECT COUNT(*) FROM spend").fetchone() == (2,)
            assert cur.execute("SELECT COUNT(*) FROM owners").fetchone() == (1,)  # not taken for dead
        assert led.db.reconnects == 1 and led._beat_db.reconnects == 1  # type: ignore[attr-defined]
    finally:
        led.close()


def _waiting_on_the_lock(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("call", ["settle", "reserve"])
def test_a_transaction_cut_in_its_middle_runs_again_once(pg_url, admin, call):
    """The ledger's backend is terminated while its transaction waits for the ledger's lock (held by another
    connection): the transaction never committed, so it runs again on a new connection, once."""
    led = BudgetLedger(pg_url)
    try:
        granted, _ = led.reserve_many(
            [("B1", "B1/0", f"p{i}", 0.25, 10) for i in range(4)], budget_usd=1.25, token_budget=None
        )
        holder = psycopg.connect(pg_url, autocommit=True)
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (LEDGER_LOCK_KEY,))
        pid = led.db._db.info.backend_pid  # type: ignore[attr-defined]
        done: list[object] = []

        def work() -> None:
            if call == "settle":
                led.settle_many(Settlement(r, 0.10, 5) for r in granted)  # a generator: read once, run twice
                done.append("settled")
            else:
                done.append(led.reserve_many([("B1", "B1/0", "q", 0.25, 10)], budget_usd=1.25, token_budget=None))

        worker = threading.Thread(target=work)
        worker.start()
        _until(lambda: _waiting_on_the_lock(admin, pid), "the ledger's transaction waiting on the lock")
        _terminate(admin, pid)
        _until(lambda: led.db.reconnects == 1, "the reconnection")  # type: ignore[attr-defined]
        holder.execute("COMMIT")
        holder.close()
        worker.join(30)
        assert done, "the cut transaction did not complete"
        t = led.totals()
        if call == "settle":
            assert t.usd_spent == pytest.approx(0.40) and t.in_flight == 0 and led.totals("B1").tokens_spent == 20
            with led.db.read() as cur:
                assert cur.execute("SELECT COUNT(*) FROM spend").fetchone() == (4,)
        else:
            more, denial = done[0]  # type: ignore[misc]
            assert len(more) == 1 and denial is None and t.in_flight == 5 and t.usd_reserved == pytest.approx(1.25)
    finally:
        led.close()


def test_an_unreachable_database_fails_loudly_after_bounded_retries(pg_url, local_postgres):
    led = BudgetLedger(pg_url)
    dbname = led.db._db.info.dbname  # type: ignore[attr-defined]
    admin = psycopg.connect(local_postgres.url("postgres"), autocommit=True)  # a database may not bar its own
    try:
        led.db.reconnect_delays_s = (0.0, 0.05, 0.05)  # type: ignore[attr-defined]
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        _terminate(admin, led.db._db.info.backend_pid)  # type: ignore[attr-defined]
        with pytest.raises(LedgerDatabaseUnavailable, match="3 attempts to connect again") as err:
            led.totals()
        assert "ALLOW_CONNECTIONS" not in str(err.value) and dbname in str(err.value)
    finally:
        admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        admin.close()
        led.close()


def test_a_commit_that_may_have_happened_is_not_run_again_unless_it_is_idempotent(pg_url):
    """What ``retrying`` does with each kind of loss, on a real connection's database object."""
    db = open_database(pg_url)
    try:
        runs: list[int] = []

        def lost_at_commit() -> None:
            runs.append(1)
            raise LedgerConnectionLost("broke while committing", commit_unknown=True)

        with pytest.raises(LedgerConnectionLost, match="may have committed"):
            db.retrying(lost_at_commit, idempotent=False, what="reserve")
        assert len(runs) == 1
        runs.clear()

        def lost_once() -> str:
            runs.append(1)
            if len(runs) == 1:
                raise LedgerConnectionLost("broke while committing", commit_unknown=True)
            return "done"

        assert db.retrying(lost_once, idempotent=True, what="settle") == "done" and len(runs) == 2
    finally:
        db.close()
