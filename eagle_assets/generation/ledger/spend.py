"""Recorded spend: reservations closed into spend (never twice), answers feeding the length statistics, spend that
came without a reservation, orphans corrected to their journaled cost, and the totals read back."""

import time
import uuid
from collections.abc import Iterable, Mapping

from eagle_assets.generation.ledger.base import reconnecting
from eagle_assets.generation.ledger.database import Cursor
from eagle_assets.generation.ledger.lengths import LengthsRole
from eagle_assets.generation.ledger.records import GLOBAL, NANO, Reservation, Settlement, Totals, dataset_scope, to_nano
from eagle_assets.generation.ledger.uncertain import list_uncertain


class SpendRole(LengthsRole):
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
                spend_rows.append((res.id, res.dataset, res.partition, res.prompt_id, to_nano(usd), tokens, kind, now))
            for scope in (GLOBAL, dataset_scope(res.dataset)):
                d = deltas.setdefault(
                    scope, dict(usd_spent=0, usd_reserved=0, tokens_spent=0, tokens_reserved=0, in_flight=0)
                )
                d["usd_spent"] += to_nano(usd)
                d["usd_reserved"] -= to_nano(res.usd)
                d["tokens_spent"] += tokens
                d["tokens_reserved"] -= res.tokens
                d["in_flight"] -= 1
        cur.executemany("INSERT INTO spend VALUES (?,?,?,?,?,?,?,?)", spend_rows)
        self._bump_many(cur, deltas)
        return closed

    @reconnecting(idempotent=True)
    def totals(self, dataset: str | None = None) -> Totals:
        scope = GLOBAL if dataset is None else dataset_scope(dataset)
        with self.db.read() as cur:
            row = cur.execute(
                "SELECT usd_spent, usd_reserved, tokens_spent, tokens_reserved, in_flight FROM totals WHERE scope = ?",
                (scope,),
            ).fetchone()
        if not row:
            return Totals(0.0, 0.0, 0, 0, 0)
        return Totals(row[0] / NANO, row[1] / NANO, row[2], row[3], row[4])

    @reconnecting(idempotent=True)
    def spend_by_kind(self, partition: str | None = None) -> dict[str, float]:
        q = "SELECT kind, SUM(usd) FROM spend" + (" WHERE partition = ?" if partition else "")
        with self.db.read() as cur:
            rows = cur.execute(q + " GROUP BY kind", (partition,) if partition else ()).fetchall()
        return {k: v / NANO for k, v in rows}

    @reconnecting(idempotent=True)
    def settle_many(self, settlements: Iterable[Settlement]) -> None:
        """Close reservations; answers feed the length statistics (a lost attempt counts as max_tokens).

        An ``uncertain`` settlement with a generation id is listed for a later lookup (``due_uncertain``).
        """
        sts = list(settlements)
        items = [(st.reservation, st.usd, st.tokens, st.kind) for st in sts]
        with self.db.tx() as cur:
            closed = self._close_many(cur, items)
            now = time.time()
            provisional = [sts[i] for i in closed if sts[i].kind == "uncertain"]
            list_uncertain(cur, [(st.generation_id, st.reservation, st.usd, now) for st in provisional])
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

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose request was never billed."""
        self.settle_many([Settlement(reservation, 0.0, 0, "released")])

    @reconnecting(idempotent=False)
    def record_spend(self, dataset: str, partition: str, prompt_id: str, usd: float, kind: str) -> None:
        """Spend that arrives outside a reservation (e.g. cost reported on an error)."""
        if usd <= 0:
            return
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO spend VALUES (?,?,?,?,?,?,?,?)",
                (uuid.uuid4().hex, dataset, partition, prompt_id, to_nano(usd), 0, kind, time.time()),
            )
            for scope in (GLOBAL, dataset_scope(dataset)):
                self._bump(cur, scope, usd_spent=to_nano(usd))

    @reconnecting(idempotent=True)
    def correct_orphans(self, partition: str, actual: Mapping[str, tuple[float, int]]) -> float:
        """Replace orphan worst-case spend by the journaled actual cost; returns dollars refunded."""
        refunded = 0.0
        with self.db.tx() as cur:
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
                    (to_nano(real_usd), tokens, rid),
                )
                for scope in (GLOBAL, dataset_scope(dataset)):
                    self._bump(cur, scope, usd_spent=to_nano(real_usd) - nano, tokens_spent=tokens)
                cur.execute("DELETE FROM uncertain WHERE spend_id = ?", (rid,))  # known exactly now
                refunded += nano / NANO - real_usd
        return refunded
