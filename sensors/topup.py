"""Pure decision logic of the credits sensor: has money been added since generation stopped?

A top-up is an increase of the dollars available by more than ``min_increase_usd`` since the sensor last looked,
while some generation partition is failed or missing. Each top-up gets an epoch, and run keys include it: Dagster
drops repeated run keys, so a partition is retried after the next top-up but never twice for the same one.
"""

from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class CreditsCursor:
    last_remaining: float | None = None
    epoch: int = 0

    def dumps(self) -> str:
        return orjson.dumps({"last_remaining": self.last_remaining, "epoch": self.epoch}).decode()

    @staticmethod
    def loads(text: str | None) -> "CreditsCursor":
        if not text:
            return CreditsCursor()
        d = orjson.loads(text)
        return CreditsCursor(d.get("last_remaining"), int(d.get("epoch", 0)))


@dataclass(frozen=True)
class TopupDecision:
    launch: bool
    cursor: CreditsCursor
    reason: str


def decide(
    cursor: CreditsCursor,
    remaining: float,
    pending_partitions: int,
    min_increase_usd: float = 0.5,
    min_remaining_usd: float = 0.5,
) -> TopupDecision:
    """``remaining``: dollars available now, min(key's limit_remaining, budget headroom) — always finite."""
    previous = cursor.last_remaining
    if pending_partitions == 0:
        return TopupDecision(False, CreditsCursor(remaining, cursor.epoch), "nothing to backfill")
    if remaining < min_remaining_usd:
        return TopupDecision(False, CreditsCursor(remaining, cursor.epoch), f"only ${remaining:.2f} left")
    if previous is None:
        return TopupDecision(False, CreditsCursor(remaining, cursor.epoch), "first look: remembering the balance")
    if remaining - previous < min_increase_usd:
        # Track the low-water mark so that a top-up after a spend-down is seen as an increase.
        return TopupDecision(False, CreditsCursor(min(previous, remaining), cursor.epoch), "no top-up seen")
    return TopupDecision(
        True,
        CreditsCursor(remaining, cursor.epoch + 1),
        f"credits went from ${previous:.2f} to ${remaining:.2f}: backfilling {pending_partitions} partitions",
    )
