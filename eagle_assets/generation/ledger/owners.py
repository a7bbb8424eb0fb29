"""Who spends from the ledger, whether they are still there, and what a dead owner's open requests are charged.

Death is judged by a heartbeat lease on the database's clock (``liveness``): a dead host's slots and named leases
come back once its lease expires. A dead owner's reservations may still have been billed (an abandoned request is
billed in full), so they become spend, corrected to the actual cost when a rerun finds the result journaled
(``spend.correct_orphans``): conservative first, exact later."""

import logging
import time

import psutil

from eagle_assets.errors import LeaseLost
from eagle_assets.generation.admission import OpenGroup, held_usd
from eagle_assets.generation.ledger.account import AccountRole
from eagle_assets.generation.ledger.base import reconnecting
from eagle_assets.generation.ledger.database import Cursor, LedgerDatabase
from eagle_assets.generation.ledger.records import NANO, Reservation, to_nano
from eagle_assets.generation.ledger.spend import SpendRole
from eagle_assets.generation.ledger.uncertain import list_uncertain
from eagle_assets.generation.liveness import why_dead

log = logging.getLogger(__name__)


class LedgerLeaseLost(LeaseLost, RuntimeError):
    """This process's owner lease lapsed and another process charged what it had open: it must stop."""


class OwnersRole(SpendRole, AccountRole):
    account_change: str | None  # what this owner changed in the account's settings, if anything
    _beat_db: LedgerDatabase  # the heartbeat thread's own connection

    @reconnecting(idempotent=True)
    def _register(self) -> None:
        """Record this owner with its lease (and its account settings, once they agree with the live runs')."""
        proc = psutil.Process()
        with self.db.tx() as cur:
            if self.account is not None:
                self.account_change = self._settle_account(cur, self.account)
            budget = None if self.account is None else to_nano(self.account.budget_usd)
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

    @reconnecting(idempotent=True)
    def dead_owners(self) -> dict[str, str]:
        """Owners other than this one that count as dead now, and why (``liveness.why_dead``)."""
        with self.db.read() as cur:
            owners, now = self._owners(cur)
        out = {}
        for row in owners:
            if row.owner != self.owner and (why := why_dead(row, here=self.host, now=now)) is not None:
                out[row.owner] = why
        return out

    @reconnecting(idempotent=True)
    def recover_dead_owners(self) -> int:
        """Turn the reservations of dead owners into worst-case spend and free their slots; returns how many.

        Whether an owner is dead is asked again inside the write: a heartbeat that arrived meanwhile saves it.
        """
        self._last_dead_check = time.monotonic()
        count = 0
        for owner in self.dead_owners():
            with self.db.tx() as cur:
                count += self._orphan_if_dead(cur, owner)
        return count

    def _orphan_if_dead(self, cur: Cursor, owner: str) -> int:
        owners, now = self._owners(cur)
        row = next((r for r in owners if r.owner == owner), None)
        if row is None or why_dead(row, here=self.host, now=now) is None:
            return 0
        return self._orphan_owner(cur, owner)

    def _orphan_owner(self, cur: Cursor, owner: str) -> int:
        """Charge an owner's open reservations and forget the owner; those never sent are released. One whose response
        head had arrived is charged its worst case and settled later by its generation id; one sent without a head
        names nothing to look up, so its charge is final (``_headless_charges``)."""
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
        list_uncertain(cur, [(row[10], res, res.usd, now) for row, res in zip(rows, orphans, strict=True)])
        for dataset in {res.dataset for res in orphans}:
            self._refresh_lengths(cur, dataset)
        cur.execute("DELETE FROM owners WHERE owner = ?", (owner,))
        cur.execute("DELETE FROM slots WHERE owner = ?", (owner,))
        cur.execute("UPDATE partition_leases SET holder = NULL WHERE holder = ?", (owner,))  # its named leases
        return len(rows)

    def _headless_charges(self, cur: Cursor, orphans: list[Reservation]) -> dict[str, float]:
        """What each statistical orphan sent without a response head is charged, by reservation id.

        Worst case for good overcharged every kill (the soak: 9% over what was billed). They are a random draw of
        their dataset's answers, so per dataset they are charged what the admission bound that admitted them holds,
        split in proportion to worst case; held hard, or without a length model yet: worst case."""
        if self.policy.hard:
            return {}
        by_dataset: dict[str, list[Reservation]] = {}
        for res in orphans:
            if not res.hard:
                by_dataset.setdefault(res.dataset, []).append(res)
        charges: dict[str, float] = {}
        for dataset, group in by_dataset.items():
            open_group = OpenGroup()
            for r in group:
                open_group = open_group.plus(r.usd, r.prompt_usd, r.price, r.tokens)
            model = self._model(self._moments(cur, dataset), open_group.max_tokens)
            if model is None or open_group.worst_usd <= 0:
                continue
            share = held_usd([(open_group, model)], self.policy) / open_group.worst_usd
            charges.update({r.id: r.usd * min(1.0, share) for r in group})
        return charges

    def close(self) -> None:
        self.heartbeat.stop()
        self._beat_db.close()
        try:
            self._close_owner()
        finally:
            self.db.close()

    @reconnecting(idempotent=True)
    def _close_owner(self) -> None:
        with self.db.tx() as cur:
            # A clean close with open reservations means requests were abandoned: count them.
            self._orphan_owner(cur, self.owner)
