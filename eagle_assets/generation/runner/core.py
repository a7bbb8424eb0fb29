"""The state of one partition run, and its cost model: what a prompt reserves, what its request says."""

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.account_snapshot import AccountSnapshot
from eagle_assets.generation.breaker import RequestWideBreaker
from eagle_assets.generation.concurrency import AdaptiveLimiter
from eagle_assets.generation.ledger import BudgetLedger, Denial, Reservation, ReservationRequest
from eagle_assets.generation.runner.job import (
    ChatClient,
    GenerationSettings,
    PartitionJob,
    PartitionReport,
    PromptTokenEstimator,
)
from eagle_assets.generation.settlement import LazySettler
from resources.openrouter.providers import ProviderTable

log = logging.getLogger(__name__)


class RunnerCore:
    """A run's state, shared by the parts of the runner, and its cost model: what a prompt asks the ledger for
    and what its request says."""

    def __init__(
        self,
        job: PartitionJob,
        client: ChatClient,
        ledger: BudgetLedger,
        providers: ProviderTable,
        settings: GenerationSettings,
        estimate_prompt_tokens: PromptTokenEstimator,
        emit: Callable[[str], None] | None = None,
        observe: Callable[[AccountSnapshot], None] | None = None,
    ) -> None:
        self.job, self.client, self.ledger, self.providers = job, client, ledger, providers
        self.s = settings
        self.estimate = estimate_prompt_tokens
        self.emit = emit or log.info
        self.observe = observe  # receives the account's money every account_observe_interval_s, and at the end
        self.report = PartitionReport(job.key, total=job.total)
        self.report.allowed_providers = sorted({n for e in providers.allowed for n in (e.provider_name, e.slug)})
        self.limiter = AdaptiveLimiter(settings.max_in_flight, min(settings.min_in_flight, settings.max_in_flight))
        # The ledger decides what a reservation holds and how answers feed the statistics: this run's policy.
        ledger.policy = settings.admission
        self._routing = providers.routing()  # the same for every request: build it once
        self._idle_timeout = settings.stream_idle_timeout_s if settings.stream else None
        self._prompt_tokens: dict[str, int] = {}
        self._requests: dict[str, ReservationRequest] = {}
        # dispatch: the queue, the prompts reserved ahead, the workers and their limit
        self._queue: deque[Prompt] = deque()  # prompts not yet reserved (every_turn adds next turns to it)
        self._ready: deque[tuple[Prompt, Reservation]] = deque()  # reserved, waiting for a worker
        self._workers = 0  # worker tasks alive (each works one prompt at a time)
        self._starting = 0  # workers created that have not run yet (each will take a ready prompt)
        self._busy = 0  # prompts a worker is working on
        self._tasks: set[asyncio.Task[None]] = set()
        self._worker_error: BaseException | None = None
        self._slot_limit = settings.max_in_flight  # this process's share of the account's in-flight cap
        self._ramp_start = 0.0
        self._probe_over = False
        self._probe_taken = 0  # prompts taken while the first wave is held (``breaker.holds_first_wave``)
        self._at_wall = False  # a budget has refused: reserve only in batches of _tail_min()
        self._wall_reason = ""
        self._others_held: tuple[float, float] | None = None  # what other runs held, since when (None: no wait yet)
        self._wake = asyncio.Event()  # the dispatcher: ready is running low, budget freed, or the share changed
        # stops
        self._stop_admitting = asyncio.Event()
        self._abort = asyncio.Event()  # credits gone or fatal: abandon retries too
        self._nothing_bought = ""  # why a partition with skips and no success fails
        # commits, skips and settlements
        self._commit_q: asyncio.Queue[tuple[dict[str, Any], Reservation | None]] = asyncio.Queue()
        self._commit_error: Exception | None = None
        self.breaker = RequestWideBreaker(settings.breaker_threshold)
        self._held: list[dict[str, Any]] = []  # skips not journaled until a success says the request works
        self._settler = LazySettler(ledger, client.generation, settings.settlement, self.emit)
        # progress: the account's cap as last polled
        self._account_remaining: float | None = None
        self._spent_at_poll = 0.0
        self._cap_source: str | None = None
        self._credits_allowed = True

    # --- cost model ---------------------------------------------------------------------------
    def prompt_tokens(self, prompt: Prompt) -> int:
        """The estimate (the exact length as served, where the template renders), once per prompt."""
        n = self._prompt_tokens.get(prompt.prompt_id)
        if n is None:
            n = self._prompt_tokens[prompt.prompt_id] = self.estimate(prompt)
        return n

    def prompt_usd(self, prompt: Prompt) -> float:
        """The prompt's part of the worst case: the estimate with a margin, at the dearest allowed price."""
        return (self.prompt_tokens(prompt) * self.s.reservation_margin + 16) * self.providers.max_prompt_price

    def _request(self, prompt: Prompt) -> ReservationRequest:
        """What a reservation of this prompt asks for; kept, since a refused prompt is asked for again."""
        req = self._requests.get(prompt.prompt_id)
        if req is None:
            fixed = self.prompt_usd(prompt)
            price = self.providers.max_completion_price
            req = ReservationRequest(
                self.job.dataset,
                self.job.key,
                prompt.prompt_id,
                fixed + self.s.max_tokens * price,
                self.s.max_tokens,
                fixed,
                price,
            )
            self._requests[prompt.prompt_id] = req
        return req

    def payload(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.s.model,
            "messages": prompt.messages,
            "max_tokens": self.s.max_tokens,
            "provider": self._routing,
            **self.s.sampling,
        }
        if prompt.tools:
            body["tools"] = prompt.tools
        if self.s.stream:
            body["stream"] = True
        return body

    def _priced(self, body: dict[str, Any]) -> float:
        usage = body.get("usage") or {}
        p, c = self.providers.price_of(body.get("provider"))
        return int(usage.get("prompt_tokens") or 0) * p + int(usage.get("completion_tokens") or 0) * c

    def _reserve(self, prompts: list[Prompt], min_grant: int = 1) -> tuple[list[Reservation], Denial | None]:
        """Reserve, in order, as many prompts as the budgets and the account's remaining credit allow.

        The key's remaining credit caps the ledger's total: what was spent when it was last polled plus
        what the key had left then (spend since then is in the ledger already).
        """
        cap = None if self._account_remaining is None else self._spent_at_poll + self._account_remaining
        return self.ledger.reserve_many(
            [self._request(p) for p in prompts],
            budget_usd=self.s.budget_usd,
            token_budget=self.job.token_budget,
            account_cap_usd=cap,
            min_grant=min_grant,
        )
