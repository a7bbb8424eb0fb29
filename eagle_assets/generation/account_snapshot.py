"""The account's money at one moment: what the key has left, what the ledger has spent and holds.

Runs take one every few seconds and the credits sensor one per evaluation, recorded as observations of the
``openrouter_account`` source asset, so its plots show spend while a run is going, not only after it.
"""

import time
from dataclasses import dataclass

from eagle_assets.generation.ledger import BudgetLedger


@dataclass(frozen=True)
class AccountSnapshot:
    spent_usd: float  # the ledger: everything charged, by every process and run
    held_usd: float  # what the requests in flight hold of the budget now
    output_tokens: int  # the ledger: output tokens produced, all datasets
    in_flight: int  # requests open on the ledger, all processes
    budget_usd: float
    # The key's credit at the last poll less what the ledger spent since; None: no cap visible.
    remaining_credit_usd: float | None
    cap_source: str  # key_limit | account_credits | key_limit+account_credits | none | unknown
    observed_by: str  # which run or sensor took it
    at: float  # unix time

    @property
    def budget_left_usd(self) -> float:
        return self.budget_usd - self.spent_usd - self.held_usd

    @property
    def available_usd(self) -> float:
        """Dollars a new request could still draw on: the budget's headroom, capped by the key's credit."""
        left = self.budget_left_usd
        return left if self.remaining_credit_usd is None else min(left, self.remaining_credit_usd)


def take_snapshot(
    ledger: BudgetLedger,
    budget_usd: float,
    *,
    remaining_at_poll: float | None,
    spent_at_poll: float,
    cap_source: str,
    observed_by: str,
) -> AccountSnapshot:
    """``remaining_at_poll`` / ``spent_at_poll``: the key's credit and the ledger's spend when the key was read."""
    totals = ledger.totals()
    remaining = None
    if remaining_at_poll is not None:
        remaining = remaining_at_poll - max(0.0, totals.usd_spent - spent_at_poll)
    return AccountSnapshot(
        spent_usd=totals.usd_spent,
        held_usd=ledger.open_held_usd(),
        output_tokens=totals.tokens_spent,
        in_flight=totals.in_flight,
        budget_usd=budget_usd,
        remaining_credit_usd=remaining,
        cap_source=cap_source,
        observed_by=observed_by,
        at=time.time(),
    )
