import multiprocessing
import os
import signal
import time

import pytest

from eagle_assets.generation.ledger import BudgetLedger, Settlement


def test_reservation_respects_budget_and_settles(tmp_path):
    led = BudgetLedger(tmp_path / "l.sqlite")
    granted, denial = led.reserve_many(
        [("B1", "B1/0", f"p{i}", 0.30, 100) for i in range(5)], budget_usd=1.0, token_budget=None
    )
    assert len(granted) == 3 and denial is not None and denial.reason == "usd"
    t = led.totals()
    assert t.usd_reserved == pytest.approx(0.9) and t.in_flight == 3
    led.settle_many([Settlement(granted[0], 0.10, 40)])
    led.settle_many([Settlement(granted[0], 0.10, 40)])  # settling twice counts once
    led.release(granted[1])
    t = led.totals()
    assert t.usd_spent == pytest.approx(0.10) and t.usd_reserved == pytest.approx(0.30) and t.in_flight == 1
    assert led.totals("B1").tokens_spent == 40
    more, _ = led.reserve_many([("B1", "B1/0", "x", 0.30, 1)], budget_usd=1.0, token_budget=None)
    assert len(more) == 1  # 0.10 + 0.30 + 0.30 <= 1.0
    led.close()


def test_token_budget_per_dataset(tmp_path):
    led = BudgetLedger(tmp_path / "l.sqlite")
    g, d = led.reserve_many([("B1", "B1/0", f"p{i}", 0.0, 400) for i in range(3)], budget_usd=10, token_budget=1000)
    assert len(g) == 2 and d.reason == "tokens"
    g2, d2 = led.reserve_many([("B2", "B2/0", "q", 0.0, 400)], budget_usd=10, token_budget=1000)
    assert len(g2) == 1 and d2 is None  # budgets are per dataset
    led.close()


def test_spend_persists_across_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    led = BudgetLedger(path)
    g, _ = led.reserve_many([("B1", "B1/0", "p", 2.0, 10)], budget_usd=5, token_budget=None)
    led.settle_many([Settlement(g[0], 1.5, 10)])
    led.close()
    led2 = BudgetLedger(path)
    assert led2.totals().usd_spent == pytest.approx(1.5)
    g, d = led2.reserve_many([("B1", "B1/0", "q", 4.0, 10)], budget_usd=5, token_budget=None)
    assert not g and d.reason == "usd"
    led2.close()


def _reserve_and_hang(path, ready):
    led = BudgetLedger(path)
    led.reserve_many([("B1", "B1/0", f"p{i}", 0.25, 10) for i in range(4)], budget_usd=10, token_budget=None)
    ready.set()
    time.sleep(60)


def test_dead_process_reservations_become_worst_case_spend_then_corrected(tmp_path):
    path = tmp_path / "l.sqlite"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_reserve_and_hang, args=(path, ready))
    p.start()
    assert ready.wait(30)
    live = BudgetLedger(path)
    assert live.totals().usd_reserved == pytest.approx(1.0)  # the owner is alive: nothing recovered
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert live.recover_dead_owners() == 4
    t = live.totals()
    assert t.usd_reserved == 0 and t.in_flight == 0 and t.usd_spent == pytest.approx(1.0)
    # The rerun finds two of those prompts journaled with their real cost and corrects the orphans.
    import sqlite3

    ids = [r[0] for r in sqlite3.connect(path).execute("SELECT id FROM spend ORDER BY prompt_id LIMIT 2")]
    refunded = live.correct_orphans("B1/0", {ids[0]: (0.05, 7), ids[1]: (0.10, 9)})
    assert refunded == pytest.approx(0.35)
    assert live.totals().usd_spent == pytest.approx(0.65)
    assert live.totals("B1").tokens_spent == 16
    assert live.correct_orphans("B1/0", {ids[0]: (0.05, 7)}) == 0  # idempotent
    live.close()


def test_concurrent_processes_never_exceed_budget(tmp_path):
    path = tmp_path / "l.sqlite"
    BudgetLedger(path).close()
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_grab, args=(path, q)) for _ in range(4)]
    for p in procs:
        p.start()
    got = sum(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join()
    assert got == 20  # 20 × $0.05 = $1.00 exactly fills the budget, from 4 racing processes
    led = BudgetLedger(path)
    assert led.totals().usd_spent + led.totals().usd_reserved <= 1.0 + 1e-9
    led.close()


def _grab(path, q):
    led = BudgetLedger(path)
    n = 0
    for i in range(30):
        g, _ = led.reserve_many([("B1", "B1/0", f"{os.getpid()}-{i}", 0.05, 1)], budget_usd=1.0, token_budget=None)
        for r in g:
            led.settle_many([Settlement(r, 0.05, 1)])
            n += 1
    q.put(n)
    led.close()
