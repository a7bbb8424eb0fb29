"""Attempts whose billing is unknown, charged provisionally and listed in ``uncertain`` with their generation id
until any process looks them up (why and when: ``eagle_assets.generation.settlement``), and what an orphan's charge
depends on: whether its request went out (``mark_sent``) and the generation its response head named."""

from collections.abc import Iterable, Sequence
from typing import Any

from eagle_assets.generation.ledger.base import LedgerBase, reconnecting
from eagle_assets.generation.ledger.database import Cursor
from eagle_assets.generation.ledger.records import GLOBAL, NANO, Reservation, UncertainAttempt, dataset_scope, to_nano

_UNCERTAIN_COLUMNS = (
    "generation_id, spend_id, dataset, partition, prompt_id, provisional_usd, charged_at, lookups, next_lookup"
)


def _uncertain_attempt(row: Sequence[Any]) -> UncertainAttempt:
    return UncertainAttempt(row[0], row[1], row[2], row[3], row[4], row[5] / NANO, row[6], row[7], row[8])


def list_uncertain(cur: Cursor, rows: list[tuple[str | None, Reservation, float, float]]) -> None:
    """List provisional charges (generation id, the reservation whose spend row holds it, usd, when)."""
    cur.executemany(
        "INSERT INTO uncertain (generation_id, spend_id, dataset, partition, prompt_id, provisional_usd,"
        " charged_at, lookups, next_lookup) VALUES (?,?,?,?,?,?,?,0,?) ON CONFLICT (generation_id) DO NOTHING",
        [
            (gen_id, res.id, res.dataset, res.partition, res.prompt_id, to_nano(usd), now, now)
            for gen_id, res, usd, now in rows
            if gen_id
        ],
    )


class UncertainRole(LedgerBase):
    # --- attempts awaiting settlement -------------------------------------------------------
    @reconnecting(idempotent=True)
    def note_generation_ids(self, pairs: Iterable[tuple[Reservation, str]]) -> None:
        """Remember which generation an open reservation's request started, as soon as the response head
        names it: should this process die, the orphan is then settled from /generation, not charged for good."""
        rows = [(gen_id, res.id) for res, gen_id in pairs if gen_id]
        if not rows:
            return
        with self.db.tx() as cur:
            cur.executemany("UPDATE reservations SET generation_id = ? WHERE id = ?", rows)

    @reconnecting(idempotent=True)
    def mark_sent(self, reservation_ids: Iterable[str]) -> None:
        """Requests about to go out for these reservations (written before the send): from here on an orphan of
        one is charged, since it may have been billed; before, it is released. A generation id noted for an
        earlier attempt no longer stands for the reservation (the new attempt's head will name its own)."""
        rows = [(rid,) for rid in reservation_ids]
        if not rows:
            return
        with self.db.tx() as cur:
            cur.executemany("UPDATE reservations SET sent = 1, generation_id = NULL WHERE id = ?", rows)

    @reconnecting(idempotent=True)
    def due_uncertain(
        self, now: float, limit: int = 200, claim_s: float = 30.0, due_by: float | None = None
    ) -> list[UncertainAttempt]:
        """Claim up to ``limit`` attempts whose lookup is due by ``due_by`` (default ``now``): their next
        lookup moves ``claim_s`` past ``now``, so that processes settling at once do not all look the same
        ids up."""
        with self.db.tx() as cur:
            rows = cur.execute(
                f"SELECT {_UNCERTAIN_COLUMNS} FROM uncertain WHERE next_lookup <= ? ORDER BY next_lookup LIMIT ?",
                (now if due_by is None else due_by, limit),
            ).fetchall()
            cur.executemany(
                "UPDATE uncertain SET next_lookup = ? WHERE generation_id = ?", [(now + claim_s, r[0]) for r in rows]
            )
        return [_uncertain_attempt(r) for r in rows]

    @reconnecting(idempotent=True)
    def uncertain_attempts(self, partition: str | None = None) -> list[UncertainAttempt]:
        """Every attempt still awaiting settlement (of one partition, or all)."""
        where = " WHERE partition = ?" if partition else ""
        with self.db.read() as cur:
            rows = cur.execute(
                f"SELECT {_UNCERTAIN_COLUMNS} FROM uncertain{where} ORDER BY charged_at",
                (partition,) if partition else (),
            ).fetchall()
        return [_uncertain_attempt(r) for r in rows]

    @reconnecting(idempotent=True)
    def reschedule_uncertain(self, items: Iterable[tuple[str, float]]) -> None:
        """One more lookup found nothing (404: not indexed yet): count it and set when to look again."""
        rows = [(at, gen_id) for gen_id, at in items]
        if not rows:
            return
        with self.db.tx() as cur:
            cur.executemany("UPDATE uncertain SET lookups = lookups + 1, next_lookup = ? WHERE generation_id = ?", rows)

    @reconnecting(idempotent=True)
    def resolve_uncertain(self, items: Iterable[tuple[str, float]]) -> float:
        """Replace provisional charges by what /generation says was billed; returns the dollars given back
        (negative if an attempt cost more than its provisional charge). An id no longer listed (settled by
        another process) is skipped: never corrected twice."""
        refunded = 0
        with self.db.tx() as cur:
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
                actual = to_nano(max(0.0, actual_usd))
                cur.execute("UPDATE spend SET usd = ?, kind = ? WHERE id = ?", (actual, f"{kind}_settled", row[0]))
                for scope in (GLOBAL, dataset_scope(dataset)):
                    self._bump(cur, scope, usd_spent=actual - nano)
                refunded += nano - actual
        return refunded / NANO

    @reconnecting(idempotent=True)
    def write_off_uncertain(self, generation_ids: Iterable[str]) -> float:
        """Stop looking these attempts up: their provisional charge stands for good; returns its sum."""
        total = 0
        with self.db.tx() as cur:
            for gen_id in generation_ids:
                row = cur.execute(
                    "DELETE FROM uncertain WHERE generation_id = ? RETURNING spend_id, provisional_usd", (gen_id,)
                ).fetchone()
                if row is None:
                    continue
                cur.execute("UPDATE spend SET kind = kind || '_written_off' WHERE id = ?", (row[0],))
                total += row[1]
        return total / NANO
