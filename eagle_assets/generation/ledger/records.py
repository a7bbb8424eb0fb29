"""The values the ledger takes and gives back, and its unit of money (integer nano-dollars)."""

from dataclasses import dataclass

GLOBAL = "global"
NANO = 1_000_000_000  # money is stored in integer nano-dollars: sums of floats drift, budgets must not


def to_nano(usd: float) -> int:
    return round(usd * NANO)


def dataset_scope(dataset: str) -> str:
    return f"dataset:{dataset}"


@dataclass(frozen=True)
class AccountSettings:
    """What one account allows, whichever host spends from it: the dollar budget and the in-flight cap."""

    budget_usd: float
    max_in_flight: int

    def describe(self) -> str:
        return f"budget_usd ${self.budget_usd:,.2f}, max_in_flight {self.max_in_flight:,}"

    def same_as(self, other: "AccountSettings") -> bool:
        return to_nano(self.budget_usd) == to_nano(other.budget_usd) and self.max_in_flight == other.max_in_flight


@dataclass(frozen=True)
class ReservationRequest:
    """One request to admit: its worst case, the prompt part of it, and its completion price per token."""

    dataset: str
    partition: str
    prompt_id: str
    worst_usd: float
    max_tokens: int
    prompt_usd: float | None = None  # None: the whole worst case is fixed (no completion part)
    price: float = 0.0  # dearest completion USD per token


@dataclass(frozen=True)
class Reservation:
    id: str
    dataset: str
    partition: str
    prompt_id: str
    usd: float  # worst case: what an orphan is charged
    tokens: int  # max_tokens
    seq: int = 0
    hard: bool = True
    prompt_usd: float = 0.0  # the prompt part of ``usd``
    price: float = 0.0  # the completion price per token ``usd`` assumed


@dataclass(frozen=True)
class KeyUsageCheck:
    """One ``reconcile_key_usage``: whether the ledger was quiet enough to hold against the key (else why not),
    what it gave back and from how many head-less orphans."""

    done: bool
    why_not: str
    refunded_usd: float = 0.0
    orphans: int = 0


@dataclass(frozen=True)
class Settlement:
    reservation: Reservation
    usd: float
    tokens: int
    kind: str = "settled"  # settled | discarded | uncertain | failed | released
    # With kind "uncertain": the attempt's generation id, so that ``usd`` is provisional and listed in
    # ``uncertain`` until /generation says what was billed (None: no id was seen, ``usd`` is final).
    generation_id: str | None = None


@dataclass(frozen=True)
class UncertainAttempt:
    """An attempt charged provisionally, awaiting its actual cost from /generation."""

    generation_id: str
    spend_id: str
    dataset: str
    partition: str
    prompt_id: str
    provisional_usd: float
    charged_at: float
    lookups: int
    next_lookup: float


@dataclass(frozen=True)
class Denial:
    """Why a reservation was refused: the ``usd`` budget, the dataset's ``tokens`` budget, or the key's ``credits``;
    ``fit``: how many of the requests would have fit."""

    reason: str
    detail: str
    fit: int = 0


@dataclass(frozen=True)
class Totals:
    usd_spent: float
    usd_reserved: float
    tokens_spent: int
    tokens_reserved: int
    in_flight: int


@dataclass(frozen=True)
class Outlook:
    """Where a budget will stand once everything in flight has settled at its expected cost (at the prices
    providers charged so far); None while there are no length statistics yet. ``batch_held_usd``: what ``batch``
    more requests like the given one would hold on their own."""

    expected_usd: float | None
    batch_held_usd: float
    expected_tokens: float | None
    mean_tokens: float | None
