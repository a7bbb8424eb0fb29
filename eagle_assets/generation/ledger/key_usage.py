"""The ledger held against the key's own usage counter: at a quiet moment, what the orphans sent without a response
head were charged beyond what the key was billed is given back."""

import time

from eagle_assets.generation.ledger.base import LedgerBase, reconnecting
from eagle_assets.generation.ledger.records import GLOBAL, NANO, KeyUsageCheck, dataset_scope, to_nano


class KeyUsageRole(LedgerBase):
    @reconnecting(idempotent=False)
    def reconcile_key_usage(self, key_usage_usd: float, *, quiet_s: float, now: float | None = None) -> KeyUsageCheck:
        """Give back what the head-less orphans were charged beyond what the key (``/key``'s ``usage``) was billed.

        Their charge (``_headless_charges``) is a bound, not a bill. At a quiet moment (nothing open or uncertain, no
        spend for ``quiet_s``: the counter has caught up) the key's usage less the ledger's spend is a fixed offset
        (what the key spent beside this ledger); a later quiet check that finds it smaller finds the ledger over by
        that much, and refunds it from the orphans charged since, in proportion, never more than their charge. A
        larger offset gives nothing back. Either way the offset is recorded again and those orphans are final.
        """
        now = time.time() if now is None else now
        with self.db.tx() as cur:
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
                refund = max(0, min(charged, mark[0] - (to_nano(key_usage_usd) - spent)))
                given = 0
                for i, (rid, dataset, nano) in enumerate(headless):
                    part = refund - given if i == len(headless) - 1 else refund * nano // charged
                    given += part
                    cur.execute("UPDATE spend SET usd = ?, kind = 'orphan_reconciled' WHERE id = ?", (nano - part, rid))
                    for scope in (GLOBAL, dataset_scope(dataset)):
                        self._bump(cur, scope, usd_spent=-part)
            elif headless:  # no earlier mark to hold them against: their charge stands
                cur.execute("UPDATE spend SET kind = 'orphan_reconciled' WHERE kind = 'orphan_headless'")
            offset = to_nano(key_usage_usd) - (spent - refund)
            cur.execute("DELETE FROM key_usage WHERE id = 1")
            cur.execute("INSERT INTO key_usage(id, offset_usd, at) VALUES (1, ?, ?)", (offset, now))
            return KeyUsageCheck(True, "", refunded_usd=refund / NANO, orphans=len(headless))
