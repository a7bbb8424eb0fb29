from sensors.topup import CreditsCursor, decide


def test_first_look_only_remembers():
    d = decide(CreditsCursor(), 40.0, pending_partitions=3)
    assert not d.launch and d.cursor.last_remaining == 40.0 and d.cursor.epoch == 0


def test_spend_down_then_topup_launches_once_per_topup():
    c = CreditsCursor(40.0, 0)
    for remaining in (20.0, 0.1, 0.0):  # generation spends the money down
        d = decide(c, remaining, pending_partitions=3)
        assert not d.launch
        c = d.cursor
    assert c.last_remaining == 0.0
    d = decide(c, 25.0, pending_partitions=3)  # top-up
    assert d.launch and d.cursor.epoch == 1 and "backfilling 3" in d.reason
    d2 = decide(d.cursor, 25.0, pending_partitions=3)  # same balance next tick: nothing new
    assert not d2.launch and d2.cursor.epoch == 1


def test_nothing_pending_or_too_little_money():
    assert not decide(CreditsCursor(0.0, 0), 50.0, pending_partitions=0).launch
    assert not decide(CreditsCursor(0.0, 0), 0.2, pending_partitions=5).launch


def test_cursor_roundtrip():
    c = CreditsCursor(12.5, 3)
    assert CreditsCursor.loads(c.dumps()) == c
    assert CreditsCursor.loads(None) == CreditsCursor()
