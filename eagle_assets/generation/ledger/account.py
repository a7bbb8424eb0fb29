"""The account's settings: the dollar budget and the in-flight cap, set by the first run that opens the ledger
with them. Every host reads its own configuration, so a pod configured differently from the others would otherwise
split the budget or the cap without a word: a run whose settings disagree with a live run's is refused
(``AccountSettingsConflict``) naming both values. A change (a budget raised after a top-up) is taken once no live
run holds the old values, and recorded with who made it and when (``account_changes``)."""

import time

from eagle_assets.errors import ConfigError
from eagle_assets.generation.ledger.base import LedgerBase, reconnecting
from eagle_assets.generation.ledger.database import Cursor
from eagle_assets.generation.ledger.records import NANO, AccountSettings, to_nano
from eagle_assets.generation.liveness import why_dead

ACCOUNT_ROW = 1  # the account table holds one row


class AccountSettingsConflict(ConfigError, ValueError):
    """This run's budget or in-flight cap is not the one the live runs on the same ledger hold: run with theirs
    (every host configured alike) or wait for them to finish before changing it."""


class AccountRole(LedgerBase):
    def _settle_account(self, cur: Cursor, mine: AccountSettings) -> str | None:
        """Check ``mine`` against the live runs' settings and record it; returns what changed, if anything."""
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
            (ACCOUNT_ROW, to_nano(mine.budget_usd), mine.max_in_flight, self.owner, self.host, time.time()),
        )
        cur.execute(
            "INSERT INTO account_changes (at, owner, host, budget_before, budget_after, max_in_flight_before,"
            " max_in_flight_after) VALUES (?,?,?,?,?,?,?)",
            (
                time.time(),
                self.owner,
                self.host,
                None if before is None else to_nano(before.budget_usd),
                to_nano(mine.budget_usd),
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

    @reconnecting(idempotent=True)
    def account_settings(self) -> AccountSettings | None:
        """The account's settings as the ledger records them (None before any run set them)."""
        with self.db.read() as cur:
            row = self._account_row(cur)
        return None if row is None else row[0]

    @reconnecting(idempotent=True)
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
