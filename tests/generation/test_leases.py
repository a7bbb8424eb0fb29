"""Leases instead of pids: owners on other hosts, paused owners, and one journal writer per partition.

"Hosts" here are process trees with their own ``EAGLE_FORGE_HOST_ID``: to the ledger they are separate pid
spaces, so a pid means nothing across them and only the heartbeat lease can tell the dead from the living.
The journal tests also turn ``flock`` off (``EAGLE_FORGE_JOURNAL_FLOCK=0``), as on an NFS mount that does
not honour it, so that what keeps the second writer out is the database lease alone.
"""

import os
import signal
import time

import pytest

from eagle_assets.generation.journal import Journal, read_records
from eagle_assets.generation.ledger import BudgetLedger, LedgerLeaseLost
from eagle_assets.generation.partition_fence import FenceLostError, PartitionBusyError
from tests.generation.forked import CTX, process

LEASE_S = 3.0


def _as_host(host: str) -> None:
    os.environ["EAGLE_FORGE_HOST_ID"] = host
    os.environ["EAGLE_FORGE_JOURNAL_FLOCK"] = "0"


def _holder(location, host, conn):
    """Reserve four $0.25 requests and half the slots, then answer the parent until told to stop."""
    _as_host(host)
    led = BudgetLedger(location, lease_s=LEASE_S)
    reqs = [("B1", "B1/0", f"{host}-{i}", 0.25, 10) for i in range(4)]
    g, _ = led.reserve_many(reqs, budget_usd=10, token_budget=None)
    led.mark_sent([r.id for r in g])  # in flight: their requests went out
    conn.send(led.lease_slots(50, 0, 100))
    while (msg := conn.recv()) is not None:
        try:
            granted, _ = led.reserve_many([("B1", "B1/0", msg, 0.25, 10)], budget_usd=10, token_budget=None)
            conn.send(f"reserved {len(granted)}")
        except LedgerLeaseLost as exc:
            conn.send(f"lost: {exc}")


def _start(target, *args):
    parent, child = CTX.Pipe()
    proc = process(target, *args, child, daemon=True)
    proc.start()
    return proc, parent


def _recv(conn, timeout_s: float = 60.0):
    if not conn.poll(timeout_s):
        raise AssertionError(f"no answer from the child within {timeout_s:.0f} s")
    return conn.recv()


def _lease_end(led: BudgetLedger, host: str) -> float | None:
    """When ``host``'s owner's lease lapses by the ledger's own clock (its last heartbeat + lease), if it is there."""
    with led.db.read() as cur:
        rows, _ = led._owners(cur)
    return next((r.heartbeat + r.lease_s for r in rows if r.host == host), None)


def _ledger_now(led: BudgetLedger) -> float:
    with led.db.read() as cur:
        return float(cur.execute(f"SELECT {led.db.now_sql}").fetchone()[0])


def _wait_recovered(led: BudgetLedger, host: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """Poll recovery until the dead host's owner is recovered; returns (owners recovered, polls that ended, by
    the ledger's clock, before the lease lapsed). Any such poll that recovered something fails at once."""
    early = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lapses = _lease_end(led, host)
        n = led.recover_dead_owners()
        if lapses is not None and _ledger_now(led) <= lapses:
            assert n == 0, "recovered an owner whose lease had not lapsed yet"
            early += 1
        elif n:
            return n, early
        time.sleep(0.1)
    raise AssertionError("the dead owner was never recovered")


def test_a_dead_hosts_slots_and_dollars_come_back_only_after_its_lease(ledger_at, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOST_ID", "host-a")
    loc = ledger_at("l")
    proc, conn = _start(_holder, loc, "host-b")
    try:
        assert _recv(conn) == 50
        live = BudgetLedger(loc, lease_s=LEASE_S)
        assert live.lease_slots(100, 0, 100) == 50  # host-b holds the other half
        assert live.totals().usd_reserved == pytest.approx(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        # Its pid is gone, but host-b is another pid space: only its lease can say it is dead. Every recovery
        # attempt made while the ledger's clock was still inside the lease recovered nothing (checked in
        # ``_wait_recovered``): its slots and dollars come back only after it.
        recovered, _ = _wait_recovered(live, "host-b")
        assert recovered == 4
        t = live.totals()
        assert t.in_flight == 0 and t.usd_reserved == 0 and t.usd_spent == pytest.approx(1.0)  # worst case
        assert live.lease_slots(100, 0, 100) == 100
        live.close()
    finally:
        proc.kill()


def test_a_paused_owner_that_lost_its_lease_takes_nothing_more(ledger_at, monkeypatch):
    """SIGSTOP stands for a long GC pause or a partitioned network: declared dead, it must not come back."""
    monkeypatch.setenv("EAGLE_FORGE_HOST_ID", "host-a")
    loc = ledger_at("l")
    proc, conn = _start(_holder, loc, "host-b")
    try:
        assert _recv(conn) == 50
        live = BudgetLedger(loc, lease_s=LEASE_S)
        conn.send("before")
        assert _recv(conn) == "reserved 1"
        os.kill(proc.pid, signal.SIGSTOP)
        assert _wait_recovered(live, "host-b")[0] == 5
        spent = live.totals().usd_spent
        os.kill(proc.pid, signal.SIGCONT)
        conn.send("after")
        answer = _recv(conn)
        assert answer.startswith("lost: ") and "declared dead" in answer
        t = live.totals()
        assert t.in_flight == 0 and t.usd_spent == pytest.approx(spent) and live.lease_slots(100, 0, 100) == 100
        live.close()
    finally:
        proc.kill()


def _writer(location, host, journal_path, conn):
    """Take the partition's lease and open its journal (no flock), then append what the parent asks."""
    _as_host(host)
    led = BudgetLedger(location, lease_s=LEASE_S)
    started = time.monotonic()
    try:
        fence = led.partition_fence("B1/0000").acquire()
    except PartitionBusyError as exc:
        conn.send(("busy", str(exc)))
        return
    journal = Journal(journal_path, fence)
    conn.send(("holding", fence.token, fence.took_over, time.monotonic() - started))
    while (msg := conn.recv()) is not None:
        try:
            journal.append_many([{"prompt_id": msg, "status": "ok"}])
            conn.send("ok")
        except FenceLostError as exc:
            conn.send(f"refused: {exc}")


@pytest.mark.parametrize("ledger_at", ["postgresql"], indirect=True)
def test_one_journal_writer_per_partition_across_hosts_without_flock(ledger_at, tmp_path):
    loc, path = ledger_at("l"), tmp_path / "B1" / "0000.journal"
    a, a_conn = _start(_writer, loc, "host-a", path)
    b = c = None
    try:
        assert _recv(a_conn)[:2] == ("holding", 1)
        a_conn.send("p1")
        assert _recv(a_conn) == "ok"
        # A second run elsewhere sees host-a renewing its lease and fails, naming the holder.
        b, b_conn = _start(_writer, loc, "host-b", path)
        kind, detail = _recv(b_conn)
        assert kind == "busy" and "host-a" in detail and "renewing its lease" in detail
        # host-a stalls (SIGSTOP): a third run waits for its lease to expire, then takes over with a new token.
        os.kill(a.pid, signal.SIGSTOP)
        c, c_conn = _start(_writer, loc, "host-c", path)
        kind, token, took_over, _waited = _recv(c_conn)
        assert kind == "holding" and token == 2
        assert took_over is None or ("host-a" in took_over and "no heartbeat" in took_over)  # None: found released
        c_conn.send("p2")
        assert _recv(c_conn) == "ok"
        # host-a wakes up and tries to append: its token is no longer current, nothing is written.
        os.kill(a.pid, signal.SIGCONT)
        a_conn.send("p3")
        refused = _recv(a_conn)
        assert refused.startswith("refused: ") and "B1/0000" in refused
        assert [r["prompt_id"] for r in read_records(path)] == ["p1", "p2"]
    finally:
        for p in (a, b, c):
            if p is not None:
                p.kill()


def test_a_second_writer_on_the_same_machine_fails_at_once(ledger_at, tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOST_ID", "host-a")
    monkeypatch.setenv("EAGLE_FORGE_JOURNAL_FLOCK", "0")
    loc, path = ledger_at("l"), tmp_path / "0000.journal"
    first = BudgetLedger(loc, lease_s=LEASE_S)
    second = BudgetLedger(loc, lease_s=LEASE_S)
    with first.partition_fence("B1/0000") as fence, Journal(path, fence) as journal:
        journal.append_many([{"prompt_id": "p1"}])
        with pytest.raises(PartitionBusyError, match="alive on this machine"):
            second.partition_fence("B1/0000").acquire()
    # Given back: the next run takes it at once, with the next token, and appends.
    with second.partition_fence("B1/0000") as fence, Journal(path, fence) as journal:
        assert fence.token == 2 and "p1" in journal
        journal.append_many([{"prompt_id": "p2"}])
    first.close()
    second.close()
