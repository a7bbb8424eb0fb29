"""What a partition run is given (its settings, its job, a client) and what it returns (its report)."""

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.settlement import SettlementSchedule
from eagle_assets.generation.turn_chains import TurnChains
from resources.openrouter.account import AccountClient
from resources.openrouter.outcomes import RawResponse


class ChatClient(AccountClient, Protocol):
    """What the runner asks of a client (``OpenRouterClient`` is one): requests, the account's money, and
    ``generation`` — what an attempt cost, by its id, which settles the attempts whose bill is unknown."""

    async def chat_completion(
        self,
        payload: dict[str, Any],
        *,
        idle_timeout_s: float | None = None,
        on_generation_id: Callable[[str], None] | None = None,
        on_accepted: Callable[[], None] | None = None,
    ) -> RawResponse: ...
    async def generation(self, generation_id: str) -> dict[str, Any] | None: ...


# Why a run stopped admitting: ``completed`` (every prompt asked), the dollar ``budget``, the key's ``credits``,
# the dataset's output ``tokens``, a ``fatal`` error, prompts that exhausted their retries (``failures``), or a
# partition whose answered prompts were all skipped (``no_success``).
StopReason = Literal["completed", "budget", "credits", "tokens", "fatal", "failures", "no_success"]


@dataclass(frozen=True)
class GenerationSettings:
    model: str
    max_tokens: int
    budget_usd: float
    sampling: dict[str, Any] = field(default_factory=dict)
    max_in_flight: int = 2000
    min_in_flight: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    reservation_margin: float = 1.10  # over-estimate prompt tokens: the provider's count may differ
    key_poll_interval_s: float = 15.0
    progress_interval_s: float = 5.0
    account_observe_interval_s: float = 10.0  # how often the account's money is handed to ``observe``
    commit_interval_s: float = 0.05
    reserve_chunk: int = 64  # prompts reserved per ledger transaction, and kept ready ahead of the workers
    # Slow start: open max_in_flight over this many seconds, not in one burst. None: 0.25 ms per request, about
    # what one answer costs this loop, so a wave arrives no faster than it is handled and stays spread.
    startup_ramp_s: float | None = None
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    # Once a budget refuses, requests start only in batches of this share of max_in_flight, and stop when no such
    # batch would fit after everything in flight settles: the last crumbs are not worth a round trip each.
    tail_fraction: float = 0.1
    slot_lease_interval_s: float = 0.1  # how often the account-wide in-flight share is renewed
    # Streaming: a stream with no data event for ``stream_idle_timeout_s`` is abandoned as stalled.
    stream: bool = False
    stream_idle_timeout_s: float = 60.0
    settlement: SettlementSchedule = field(default_factory=SettlementSchedule)
    breaker_threshold: int = 8
    reask_skipped: bool = False
    others_stall_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.budget_usd < 0:
            raise ValueError(f"budget_usd must be >= 0, got {self.budget_usd}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be positive")
        if self.stream_idle_timeout_s <= 0:
            raise ValueError("stream_idle_timeout_s must be positive")
        if not 0.0 <= self.tail_fraction < 1.0:
            raise ValueError("tail_fraction must be in [0, 1)")
        if self.breaker_threshold < 0:
            raise ValueError("breaker_threshold must be >= 0")
        if self.others_stall_s <= 0:
            raise ValueError("others_stall_s must be positive")


@dataclass
class PartitionJob:
    dataset: str
    shard: str
    prompts: list[Prompt]
    token_budget: int
    journal_path: Path
    chains: TurnChains | None = None  # every_turn: prompts come turn by turn from these (``prompts`` unused)

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.shard}"

    @property
    def total(self) -> int:
        """Requests this partition holds: one per prompt, or one per turn of every conversation."""
        return len(self.prompts) if self.chains is None else self.chains.total


@dataclass
class PartitionReport:
    partition: str
    total: int
    already_done: int = 0
    ok: int = 0
    truncated: int = 0
    skipped: int = 0
    failed: int = 0  # retries exhausted this run
    not_started: int = 0
    stop_reason: StopReason = "completed"
    stop_detail: str = ""
    spent_usd: float = 0.0  # this run, all kinds
    discarded_usd: float = 0.0
    # Charged provisionally for attempts that may have been billed, less what /generation said they cost.
    uncertain_usd: float = 0.0
    settled_earlier_usd: float = 0.0  # given back this run on attempts charged by earlier or other runs
    uncertain_pending: int = 0  # this run's attempts still unsettled at its end (a later run settles them)
    reasked_skips: int = 0  # journaled skips asked again this run (not final, or ``reask_skipped``)
    unconfirmed_skips: int = 0  # skips journaled as not final: no success in the partition, asked again next run
    request_wide_skips: int = 0  # skips of the error that opened the breaker: not journaled
    output_tokens: int = 0
    requests: int = 0
    elapsed_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    providers: Counter[str] = field(default_factory=Counter)
    # Dollars of the kept responses, per provider (a Counter counts in int: these are float).
    provider_usd: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    provider_tokens: Counter[str] = field(default_factory=Counter)  # their output tokens
    peak_in_flight: int = 0
    allowed_providers: list[str] = field(default_factory=list)  # as responses name them, for the data checks

    @property
    def done(self) -> int:
        return self.already_done + self.ok + self.skipped

    @property
    def complete(self) -> bool:
        return self.done >= self.total

    def summary(self) -> str:
        return (
            f"{self.partition}: {self.done} of {self.total} prompts done ({self.ok} new, {self.truncated} "
            f"truncated, {self.skipped} skipped, {self.failed} failed), ${self.spent_usd:.4f} spent, "
            f"{self.output_tokens:,} output tokens, {self.requests} requests in {self.elapsed_s:.1f}s; "
            f"stop: {self.stop_reason}{' — ' + self.stop_detail if self.stop_detail else ''}"
        )


PromptTokenEstimator = Callable[[Prompt], int]
