"""What differs between the ledger's two backends, tested on each: placeholders, types, pipelined reads."""

import time

import pytest

from eagle_assets.generation.ledger.database import open_database


def test_reads_in_a_pipelined_transaction_wait_for_their_own_statement(fresh_pg_database):
    """A read after writes on the same cursor returns its own rows, not an earlier statement's (psycopg fetches
    in pipeline mode only what has arrived: a slow statement ahead of the read must not let a stale one through)."""
    db = open_database(fresh_pg_database())
    try:
        with db.tx() as cur:
            assert cur.execute("SELECT 1").fetchone() == (1,)
            cur.execute("SELECT 7")  # not read; its answer arrives while the next statement is sent
            time.sleep(0.2)
            assert cur.execute("SELECT 42").fetchone() == (42,)
            cur.execute("SELECT pg_sleep(0.3)")
            cur.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
            cur.executemany("INSERT INTO t (k, v) VALUES (?,?)", [("a", 1), ("b", 2)])
            assert cur.execute("SELECT COUNT(*), SUM(v) FROM t WHERE k != ?", ("z",)).fetchone() == (2, 3.0)
            cur.execute("SELECT pg_sleep(0.2)")
            assert sorted(cur.execute("SELECT k FROM t").fetchall()) == [("a",), ("b",)]
            assert db.columns(cur, "t") == {"k", "v"}
    finally:
        db.close()


@pytest.mark.parametrize("ledger_at", ["sqlite", "postgresql"], indirect=True)
def test_money_and_moments_keep_their_width(ledger_at):
    """Nano-dollars past 2³¹ and fourth powers of token counts: PostgreSQL's INTEGER and REAL would not hold them."""
    db = open_database(ledger_at("l"))
    try:
        db.create_schema(
            "CREATE TABLE IF NOT EXISTS m (k TEXT PRIMARY KEY, usd INTEGER NOT NULL, s4 REAL NOT NULL)", {}
        )
        with db.tx() as cur:
            cur.execute("INSERT INTO m (k, usd, s4) VALUES (?,?,?)", ("x", 100 * 10**9, 16384.0**4 + 0.5))
        with db.read() as cur:
            usd, s4 = cur.execute("SELECT SUM(usd), MAX(s4) FROM m").fetchone()
        assert usd == 100 * 10**9 and s4 == 16384.0**4 + 0.5
    finally:
        db.close()
