"""Generate one partition: admit prompts under the budget, retry what is transient, journal the rest.

The loop's promises, in order of importance:
1. never spend past the dollar budget: every request is reserved in the shared ledger before it is
   sent — at its worst case in ``hard`` mode, else within the statistical bound of ``admission``
   (passed with probability below 1e-6 per run);
2. never lose or duplicate a finished response (journal fsync before anything counts);
3. keep up to ``max_in_flight`` requests busy — one number for the whole account, leased from the
   ledger — adapting down on 429s;
4. stop cleanly (in-flight requests finish, everything is persisted) when money runs out.

Admission runs ahead of the requests: a dispatcher reserves prompts in chunks into a ready queue,
and each worker takes the next prompt as soon as its answer is handled, in the same task step. A
wave of 2000 answers is therefore not followed by 2000 semaphore releases, task creations and loop
passes before the next requests go out.
"""

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.account_snapshot import AccountSnapshot, take_snapshot
from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.breaker import RequestWideBreaker
from eagle_assets.generation.concurrency import AdaptiveLimiter
from eagle_assets.generation.journal import Journal
from eagle_assets.generation.ledger import BudgetLedger, Denial, Reservation, ReservationRequest, Settlement
from eagle_assets.generation.records import skipped_record, success_record
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.settlement import LazySettler, SettlementSchedule, reconcile_with_key
from eagle_assets.generation.turn_chains import TurnChains
from resources.openrouter.account import read_account_cap
from resources.openrouter.outcomes import Action, Outcome, RawResponse, classify, generation_id_of
from resources.openrouter.providers import ProviderTable

log = logging.getLogger(__name__)


class ChatClient(Protocol):
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
    async def key_info(self) -> dict[str, Any]: ...
    async def credits(self) -> dict[str, Any]: ...
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
    # Slow start: open the first max_in_flight requests over this many seconds instead of in one burst, so
    # connection setup and the first wave of responses do not all land at the same instant. None: 0.25 ms per
    # request (0.5 s for 2000), about what one answer costs this loop: a wave then arrives no faster than it
    # is handled, and it stays spread, where a burst would queue and delay every later round trip a little.
    startup_ramp_s: float | None = None
    # What a reservation holds (``admission``): the statistical bound by default, the worst case in hard mode.
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    # Once the dollar budget (or the key's credit) refuses, requests start again only in batches of this
    # share of max_in_flight, and admission stops when, after everything in flight settles at its expected
    # cost, no such batch would fit: the last crumbs of a budget are not worth a round trip each at a
    # handful in flight. At the token target the batch is what ``admission.token_overshoot`` of it is worth.
    tail_fraction: float = 0.1
    slot_lease_interval_s: float = 0.1  # how often the account-wide in-flight share is renewed
    # Streaming (``stream: true``): the generation id arrives with the first chunk, so an attempt cut
    # off later is settled exactly from /generation, and a stream that sends no data event for
    # ``stream_idle_timeout_s`` is abandoned as stalled instead of waiting for the request timeout.
    stream: bool = False
    stream_idle_timeout_s: float = 60.0
    # Attempts that may have been billed are charged provisionally and settled from /generation later.
    settlement: SettlementSchedule = field(default_factory=SettlementSchedule)
    # A request-wide error (``breaker``): this many skips of one class and message with no success between stop
    # the run as fatal (0: never; four times as many once the partition has a success); until the first success
    # at most this many requests are out, until this many answers came back. ``reask_skipped``: journaled skips
    # are asked again.
    breaker_threshold: int = 8
    reask_skipped: bool = False
    # Refused while only other runs' requests are open, a run waits for them; this long without a change in
    # what they hold (a live host whose requests hang), it stops as the budget would.
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
    # Charged for attempts that may have been billed (timeouts, drops, torn bodies, partial answers ending in
    # an error): provisionally, less what /generation said they cost once it knew (``settlement``).
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
    refunded_orphans_usd: float = 0.0
    dropped_torn_bytes: int = 0
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
CONGESTION = frozenset({"rate_limited", "in_flight_budget", "no_provider"})


@dataclass
class _PromptTries:
    """One prompt's way through its attempts: the reservation it is asked on now, and what it has used of its
    two allowances (``max_attempts`` failures, ``max_congestion_waits`` waits)."""

    prompt: Prompt
    res: Reservation
    attempts: int = 0
    failures: int = 0
    congestion_waits: int = 0


class PartitionRunner:
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
        self._ready: deque[tuple[Prompt, Reservation]] = deque()  # reserved, waiting for a worker
        self._workers = 0  # worker tasks alive (each works one prompt at a time)
        self._starting = 0  # workers created that have not run yet (each will take a ready prompt)
        self._busy = 0  # prompts a worker is working on
        self._slot_limit = settings.max_in_flight  # this process's share of the account's in-flight cap
        self._ramp_start = 0.0
        self._at_wall = False  # a budget has refused: reserve only in batches of _tail_min()
        self._others_held: tuple[float, float] | None = None  # what other runs held, since when (None: no wait yet)
        self._wall_reason = ""
        self._wake = asyncio.Event()  # the dispatcher: ready is running low, budget freed, or the share changed
        self._requests: dict[str, ReservationRequest] = {}
        self._worker_error: BaseException | None = None
        self._commit_q: asyncio.Queue[tuple[dict[str, Any], Reservation | None]] = asyncio.Queue()
        self._stop_admitting = asyncio.Event()
        self._abort = asyncio.Event()  # credits gone or fatal: abandon retries too
        self._account_remaining: float | None = None
        self._commit_error: Exception | None = None
        self._routing = providers.routing()  # the same for every request: build it once
        self._idle_timeout = settings.stream_idle_timeout_s if settings.stream else None
        self._cap_source: str | None = None
        self._credits_allowed = True
        self._spent_at_poll = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self._settler = LazySettler(ledger, client.generation, settings.settlement, self.emit)
        self._queue: deque[Prompt] = deque()  # prompts not yet reserved (every_turn adds next turns to it)
        self._prompt_tokens: dict[str, int] = {}
        self.breaker = RequestWideBreaker(settings.breaker_threshold)
        self._held: list[dict[str, Any]] = []  # skips not journaled until a success says the request works
        self._probe_over = False
        self._probe_taken = 0  # prompts taken while the first wave is held (``breaker.holds_first_wave``)
        self._nothing_bought = ""  # why a partition with skips and no success fails

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

    # --- main loop ----------------------------------------------------------------------------
    async def run(self) -> PartitionReport:
        start = time.monotonic()
        # The partition's lease first: opening the journal may truncate a torn tail (``partition_fence``).
        with self.ledger.partition_fence(self.job.key) as fence, Journal(self.job.journal_path, fence) as journal:
            self.report.dropped_torn_bytes = journal.dropped_bytes
            actual = {
                r["reservation_id"]: (float(r.get("cost") or 0.0), int(r.get("completion_tokens") or 0))
                for r in journal
                if r.get("reservation_id")
            }
            self.report.refunded_orphans_usd = self.ledger.correct_orphans(self.job.key, actual)
            await self._settle_earlier()  # orphans of killed runs, attempts earlier runs left uncertain
            # A success journaled earlier says the request worked: the breaker then needs more evidence.
            self.breaker.proven = any(r.get("status") == "ok" for r in journal)
            if self.job.chains is None:
                pending = [p for p in self.job.prompts if self._to_ask(journal, p.prompt_id)]
                self.report.already_done = self.report.total - len(pending)
                self.report.reasked_skips = sum(p.prompt_id in journal for p in pending)
                if self.report.reasked_skips:
                    self.emit(f"{self.job.key}: asking {self.report.reasked_skips} skipped prompts again")
            else:
                pending, owed = self.job.chains.resume(journal.records, self.s.reask_skipped)
                journal.append_many(owed)  # chains that ended at a journaled turn before a crash marked the rest
                self.report.already_done = self.job.chains.done_count(journal.records, self.s.reask_skipped)
                self.report.reasked_skips = self.job.chains.restarted_at_skip
                if self.report.reasked_skips:
                    self.emit(f"{self.job.key}: asking {self.report.reasked_skips} skipped turns again")
            self.ledger.note_model(self.job.dataset, self.s.model)
            self._spent_at_poll = self.ledger.totals().usd_spent
            await self._poll_key(initial=True)
            committer = asyncio.create_task(self._committer(journal))
            reporter = asyncio.create_task(self._progress_loop(start))
            poller = asyncio.create_task(self._key_loop())
            settling = asyncio.create_task(self._settler.run())
            try:
                await self._dispatch(pending)
                if self._tasks:
                    await asyncio.gather(*self._tasks)
                await self._commit_q.join()
                await self._journal_held(journal)
            finally:
                for t in (reporter, poller, settling):
                    t.cancel()
                for t in self._tasks:
                    t.cancel()
                await asyncio.gather(reporter, poller, settling, *self._tasks, return_exceptions=True)
                await self._commit_q.join()
                committer.cancel()
                await asyncio.gather(committer, return_exceptions=True)
        await self._settle_at_end()
        self.report.elapsed_s = time.monotonic() - start
        if self._commit_error is not None:
            raise self._commit_error
        r = self.report
        r.not_started = r.total - r.done - r.failed - (self.job.chains.turns_after_dead() if self.job.chains else 0)
        if r.stop_reason == "completed" and self._nothing_bought:
            r.stop_reason = "no_success"
            r.stop_detail = self._nothing_bought
        if r.stop_reason == "completed" and r.not_started:
            r.stop_reason = "budget"
            r.stop_detail = f"{r.not_started} prompts could not be reserved again for a retry"
        if r.stop_reason == "completed" and r.failed:
            r.stop_reason = "failures"
            r.stop_detail = f"{r.failed} prompts exhausted {self.s.retry.max_attempts} attempts; rerun to retry them"
        self.emit(self._progress_line(time.monotonic() - start, final=True))
        if self.observe is not None:
            await self._poll_key()  # everything has settled: the key's credit and the ledger agree again
            self._observe()
        return r

    # --- admission ----------------------------------------------------------------------------
    def _probing(self, now: float) -> bool:
        """The first wave is held (``breaker.holds_first_wave``): until ``breaker_threshold`` requests were
        accepted (their 200 heads came, as OpenRouter sends them before the answer), the first success, or that
        many answers, whichever comes first. A request-wide error then costs that many requests, not a wave of
        ``max_in_flight``; a working request, the time to its response heads."""
        if self._probe_over:
            return False
        if self.breaker.holds_first_wave and not self._abort.is_set():
            return True
        self._probe_over = True
        self._ramp_start = now  # the slow start opens from here
        return False

    def _on_accepted(self) -> None:
        """A 200 response head: the request passed OpenRouter's checks, which a request-wide 400 never does."""
        if self.breaker.on_accepted():
            self._wake.set()  # the first wave opens now, not when its answers come back

    def _limit_now(self) -> int:
        """Prompts this process may work on at once: its account-wide share, opened gradually at the start."""
        limit = self._slot_limit
        now = time.monotonic()
        if self._probing(now):
            taken_left = self.breaker.probe_size - self._probe_taken
            return max(0, min(limit, self.breaker.threshold, taken_left + self._busy))
        ramp = self.s.startup_ramp_s
        if ramp is None:
            ramp = 0.00025 * self.s.max_in_flight
        if ramp > 0:
            elapsed = now - self._ramp_start
            if elapsed < ramp:
                limit = min(limit, max(1, math.ceil(self.s.max_in_flight * elapsed / ramp)))
        return limit

    def _lease(self, queued: int) -> None:
        want = min(self.s.max_in_flight, self._workers + len(self._ready) + queued)
        limit = self.ledger.lease_slots(want, self._workers, self.s.max_in_flight)
        if limit != self._slot_limit:
            self._slot_limit = limit
            self._wake.set()

    async def _lease_loop(self, queue: deque[Prompt]) -> None:
        while True:
            await asyncio.sleep(self.s.slot_lease_interval_s)
            self._lease(len(queue))

    def _staff(self) -> None:
        """Start a worker per ready prompt that no started worker will take, up to the limit (a worker then
        keeps going while prompts are ready)."""
        spawn = min(len(self._ready) - self._starting, self._limit_now() - self._workers)
        for _ in range(spawn if not self._abort.is_set() else 0):
            self._workers += 1
            self._starting += 1
            t = asyncio.create_task(self._worker())
            self._tasks.add(t)
            t.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        """A worker that raised ends the run (as an unhandled error must), after the others finish."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None or self._worker_error is not None:
            return
        self._worker_error = task.exception()
        self._stop("fatal", f"a worker failed: {type(self._worker_error).__name__}: {self._worker_error}", abort=True)

    async def _worker(self) -> None:
        self._starting -= 1
        try:
            while self._ready and self._workers <= self._limit_now() and not self._abort.is_set():
                prompt, res = self._ready.popleft()
                if not self._probe_over:
                    self._probe_taken += 1
                if len(self._ready) < 2 * self.s.reserve_chunk:
                    self._wake.set()
                self._busy += 1
                try:
                    await self._attempts(prompt, res)
                finally:
                    self._busy -= 1
                    if self.job.chains is not None:
                        self.job.chains.attempt_finished(prompt.prompt_id)
        finally:
            self._workers -= 1
            self._wake.set()

    async def _wait_wake(self, timeout: float | None) -> None:
        if not self._wake.is_set():
            if timeout is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    def _dollar_cap(self) -> float:
        if self._account_remaining is None:
            return self.s.budget_usd
        return min(self.s.budget_usd, self._spent_at_poll + self._account_remaining)

    def _tail_min(self) -> int:
        """The smallest batch worth a round trip once a budget has refused: ``tail_fraction`` of the
        account's in-flight cap; at the token target, what ``admission.token_overshoot`` of it is worth,
        or ``admission.token_shortfall`` of it where that is set (the run may end that far short)."""
        slots = max(1, math.ceil(self.s.tail_fraction * self.s.max_in_flight))
        if self._wall_reason != "tokens":
            return slots
        model = self.ledger.length_model(self.job.dataset, self.s.max_tokens)
        expected = max(model.mean if model is not None else self.s.max_tokens, 1.0)
        policy = self.s.admission
        worth = max(1, min(slots, math.ceil(policy.token_overshoot * self.job.token_budget / expected)))
        short = math.ceil(policy.token_shortfall * self.job.token_budget / expected)
        return max(worth, min(self.s.max_in_flight, short))

    async def _admit_while_idle(self, queue: deque[Prompt], chunk: list[Prompt], size: int) -> bool:
        """A refusal while nothing of this run is open: ``chunk`` (back at the head of ``queue``) is asked for
        again once this run's settlements are in, since what fits then is all there is for it. False when
        admission stops; True when something was reserved, or when other runs hold the headroom (wait)."""
        await self._commit_q.join()
        granted, denial = self._reserve(chunk[:size], min(self._tail_min(), size))
        if granted:
            for _ in granted:
                queue.popleft()
            self._ready.extend(zip(chunk, granted, strict=False))
            self._staff()
            return True
        assert denial is not None
        held = self.ledger.open_held_usd()  # nothing of this run is open: all of it is other runs'
        if held <= 1e-12:
            self._stop_for(denial)
            return False
        # Another process's requests hold the headroom (other partitions, other hosts): stopping would end
        # this partition with 0 done whenever another host reserved first. They settle, or their owner's
        # lease lapses and recovery charges them, and then it is known what fits. A live owner whose
        # requests do not move for ``others_stall_s`` is not waited for any longer.
        now = time.monotonic()
        first_wait = self._others_held is None
        if self._others_held is None or abs(held - self._others_held[0]) > 1e-12:
            self._others_held = (held, now)
        elif now - self._others_held[1] > self.s.others_stall_s:
            stalled = f"; the ${held:.4f} other runs hold has not moved for {self.s.others_stall_s:g} s"
            self._stop_for(Denial(denial.reason, denial.detail + stalled, denial.fit))
            return False
        if first_wait:
            self.emit(
                f"{self.job.key}: waiting — {denial.detail}; the open requests belong to other runs, and what fits"
                " is known once they settle"
            )
        await asyncio.sleep(max(self.s.commit_interval_s, 0.25))
        return True

    def _another_batch_fits(self, prompt: Prompt, denial: Denial, tail: int) -> bool:
        """Once everything in flight has settled at its expected cost, will a batch of ``tail`` still fit?

        If not, admission stops now: what is left of the budget would only go out in ever smaller waves,
        each a full round trip. Unknown (no statistics yet, or hard mode): keep trying.
        """
        look = self.ledger.outlook(self._request(prompt), tail)
        if denial.reason == "tokens":
            if look.expected_tokens is None or look.mean_tokens is None:
                return True
            return look.expected_tokens + tail * look.mean_tokens <= self.job.token_budget
        if look.expected_usd is None:
            return True
        return look.expected_usd + look.batch_held_usd <= self._dollar_cap()

    async def _dispatch(self, pending: list[Prompt]) -> None:
        """Keep the workers supplied with reserved prompts until none are left or a budget stops the run.

        Reservations run up to four ``reserve_chunk`` ahead of the workers. Once a budget refuses (the
        wall), they are made only in batches of ``_tail_min()``, and admission stops when such a batch
        will not fit even after everything in flight has settled (``_another_batch_fits``), or fewer fit
        while nothing of this run is in flight: a few requests at a time would each cost a round trip.
        """
        queue = self._queue
        queue.extend(pending)
        self._ramp_start = time.monotonic()
        self._lease(len(queue))
        leaser = asyncio.create_task(self._lease_loop(queue))
        try:
            while (queue or self._turns_coming()) and not self._stop_admitting.is_set():
                if not queue:
                    await self._await_next_turns()
                    continue
                limit = self._limit_now()
                # Two to four chunks ready ahead of the workers, so a burst of answers does not find the
                # queue empty; none at the wall, where every reservation counts; and never more than the
                # workers' own share, since what is reserved and unsent holds budget another process (a
                # host with the other half of the in-flight cap) could be spending.
                ahead = 0 if self._at_wall else min(4 * self.s.reserve_chunk, limit)
                room = limit + ahead - self._busy - len(self._ready)
                if room < (1 if self._at_wall else min(self.s.reserve_chunk, len(queue), max(1, ahead))):
                    self._staff()
                    ramping = limit < self._slot_limit
                    await self._wait_wake(0.01 if ramping else (0.25 if self._at_wall else None))
                    continue
                tail = self._tail_min()
                size = min(len(queue), room, max(4 * self.s.reserve_chunk, tail))
                chunk = self._take(queue, size)
                if not chunk:
                    continue
                min_grant = min(tail, size) if self._at_wall else 1
                granted, denial = self._reserve(chunk, min_grant)
                for p in reversed(chunk[len(granted) :]):
                    queue.appendleft(p)
                self._ready.extend(zip(chunk, granted, strict=False))
                self._staff()
                if denial is None:
                    # Everything asked for fit: not (or no longer, once statistics replace worst cases) at the wall.
                    self._at_wall, self._wall_reason = False, ""
                    await asyncio.sleep(0)  # let the new workers send before the next chunk is reserved
                    continue
                self._at_wall, self._wall_reason = True, denial.reason
                if not self._another_batch_fits(chunk[0], denial, self._tail_min()):
                    self._stop_for(denial)
                    break
                if granted:
                    continue
                if self._busy == 0 and not self._ready:
                    if not await self._admit_while_idle(queue, chunk, size):
                        break
                    continue
                # Headroom is held by requests still running, here or in other processes: look again when
                # settlements come in (at most once per commit interval), or after a while for the others.
                await asyncio.sleep(self.s.commit_interval_s)
                await self._wait_wake(0.25)
            # The queue is done (or admission stopped): the workers finish what is ready and running (and
            # if this process's share dropped so low that they all left, new ones start as it grows back).
            while self._tasks or (self._ready and not self._abort.is_set()):
                self._staff()
                await self._wait_wake(0.25)
            if self._worker_error is not None:
                raise self._worker_error
        finally:
            leaser.cancel()
            await asyncio.gather(leaser, return_exceptions=True)
            for _, res in self._ready:  # reserved but never sent (an abort): give them back
                self.ledger.release(res)
            self._ready.clear()
            self.ledger.lease_slots(0, self._workers, self.s.max_in_flight)

    def _take(self, queue: deque[Prompt], size: int) -> list[Prompt]:
        """Up to ``size`` prompts off the queue; one that cannot fit the largest allowed context with ``max_tokens``
        is refused here, before it is reserved or sent (OpenRouter would answer 400 and bill nothing, but a
        3 MB prompt is still a 3 MB upload per attempt), and journaled as skipped."""
        limit = self.providers.max_context_length
        out: list[Prompt] = []
        while queue and len(out) < size:
            p = queue.popleft()
            if limit is not None and (n := self.prompt_tokens(p)) + self.s.max_tokens > limit:
                self.report.errors["prompt_too_long"] += 1
                detail = f"prompt of {n:,} tokens + max_tokens {self.s.max_tokens:,} exceeds the context ({limit:,})"
                self._commit_q.put_nowait((skipped_record(p, "prompt_too_long", detail, 0), None))
                continue
            out.append(p)
        return out

    def _turns_coming(self) -> bool:
        return self.job.chains is not None and self.job.chains.open > 0

    async def _await_next_turns(self) -> None:
        """every_turn, nothing queued: the next turns come with the answers now in flight. Once none is in
        flight, the commits still queued are awaited; a turn that ended with no record ends its chain."""
        chains = self.job.chains
        assert chains is not None
        self._staff()
        if chains.running:
            await self._wait_wake(0.25)
            return
        await self._commit_q.join()
        if not self._queue and not chains.running:
            chains.reap()

    def _advance_chains(self, batch: list[tuple[dict[str, Any], Reservation | None]]) -> None:
        """every_turn: each journaled turn releases its conversation's next one (at the back of the queue: the
        dispatcher may hold prompts it took from the front to put back), or marks the rest as not asked."""
        chains = self.job.chains
        if chains is None:
            return
        for record, _ in batch:
            nxt, owed = chains.on_committed(record)
            for r in owed:
                self._commit_q.put_nowait((r, None))
            if nxt is not None:
                self._queue.append(nxt)
                self._wake.set()

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

    def _stop_for(self, denial: Denial) -> None:
        if denial.reason == "credits":
            self._stop("credits", denial.detail)
        elif denial.reason == "tokens":
            short = self.s.admission.token_shortfall
            within = f" (the rest is less than token_shortfall, {100 * short:g}% of it)" if short else ""
            self._stop("tokens", f"dataset output-token budget reached{within}: {denial.detail}")
        else:
            self._stop("budget", f"dollar budget reached: {denial.detail}")

    def _stop(self, reason: StopReason, detail: str, abort: bool = False) -> None:
        if self.report.stop_reason in ("completed", "failures") or reason == "fatal":
            self.report.stop_reason, self.report.stop_detail = reason, detail
            self.emit(f"{self.job.key}: stopping admission — {detail}")
        self._stop_admitting.set()
        if abort:
            self._abort.set()

    # --- one prompt ---------------------------------------------------------------------------
    async def _attempts(self, prompt: Prompt, res: Reservation) -> None:
        """Ask until the prompt has an answer or a skip, has used its allowance, finds no headroom to be asked
        again, or the run aborts (then its reservation is given back)."""
        tries = _PromptTries(prompt, res)
        payload = self.payload(prompt)
        while not self._abort.is_set():
            raw = await self._send(payload, tries.res)
            tries.attempts += 1
            self.report.requests += 1
            self.breaker.on_response()
            if not await self._on_outcome(tries, raw, classify(raw)):
                return
        self.ledger.release(tries.res)

    async def _send(self, payload: dict[str, Any], res: Reservation) -> RawResponse:
        """One request, within the in-flight limit, on the reservation ``res``."""
        await self.limiter.acquire()
        self.report.peak_in_flight = max(self.report.peak_in_flight, self.limiter.in_flight)
        try:
            await self._settler.sending(res)  # a kill from here on charges it; before, it is released
            return await self.client.chat_completion(
                payload,
                idle_timeout_s=self._idle_timeout,
                on_generation_id=functools.partial(self._settler.note, res),
                on_accepted=self._on_accepted,
            )
        finally:
            self.limiter.release()

    async def _on_outcome(self, tries: _PromptTries, raw: RawResponse, out: Outcome) -> bool:
        """What one attempt's outcome means for its prompt: True to ask again (on ``tries.res``), False when the
        prompt is done with for this run (its reservation settled, charged, queued for the journal or released)."""
        if out.action is Action.SUCCESS:
            return await self._on_answer(tries, raw, out)
        self.report.errors[out.error_class] += 1
        if out.action is Action.RETRY and self._maybe_billed(raw, out):
            # The request may have been billed (an abandoned request is billed in full, a partial answer
            # for what it produced): charge it provisionally, to be settled from /generation by its id
            # later, and reserve afresh for the retry.
            self._charge_uncertain(tries.res, raw, out)
            return await self._retry_afresh(tries, backoff=True, retry_after_s=out.retry_after_s)
        if out.cost_usd:
            self.ledger.record_spend(self.job.dataset, self.job.key, tries.prompt.prompt_id, out.cost_usd, "error")
            self.report.spent_usd += out.cost_usd
        if out.action is Action.RETRY:
            return await self._retry_held(tries, out)
        if out.action is Action.SKIP:
            self._skip(tries.prompt, tries.res, out, tries.attempts)
            return False
        self.ledger.release(tries.res)
        if out.action is Action.STOP_CREDITS:
            budget = out.error_class == "budget_exceeded"
            what = "key or workspace budget exhausted (403" if budget else "credits exhausted (402"
            self._stop("credits", f"{what}: {out.message or out.error_class})", abort=True)
        else:
            self._stop("fatal", out.message or out.error_class, abort=True)
        return False

    async def _on_answer(self, tries: _PromptTries, raw: RawResponse, out: Outcome) -> bool:
        """An answer: kept (queued for the journal with its reservation), or, from a provider the policy does not
        allow, paid for, discarded and asked again on a fresh reservation."""
        assert out.data is not None
        provider = out.data.get("provider")
        # A zero cost is a cost (free, discounted); only a missing one is priced from the usage.
        cost = out.cost_usd if out.cost_usd is not None else self._priced(out.data)
        if not self.providers.is_allowed_name(provider):
            self.report.errors["disallowed_provider"] += 1
            self.report.discarded_usd += cost
            self.report.spent_usd += cost
            log.warning(
                "%s: discarded a response from disallowed provider %r ($%.6f)",
                self.job.key,
                provider,
                cost,
            )
            self.ledger.settle_many([Settlement(tries.res, cost, 0, "discarded")])
            return await self._retry_afresh(tries, backoff=False)
        self.limiter.on_success(raw.latency_s)
        self._confirm_skips()
        record = success_record(
            tries.prompt,
            out.data,
            attempts=tries.attempts,
            latency_s=raw.latency_s,
            reservation_id=tries.res.id,
            cost=cost,
        )
        await self._commit_q.put((record, tries.res))
        return False

    def _count_failure(self, tries: _PromptTries) -> bool:
        """One more failed attempt: False, and the prompt counts as failed, once it has used ``max_attempts``."""
        tries.failures += 1
        if self.s.retry.should_retry(tries.failures):
            return True
        self.report.failed += 1
        return False

    async def _retry_afresh(self, tries: _PromptTries, *, backoff: bool, retry_after_s: float | None = None) -> bool:
        """A failed attempt whose reservation is used up (settled, or charged until settlement): unless the prompt
        has used ``max_attempts``, wait its backoff (if ``backoff``) and reserve it afresh. False: failed, or no
        headroom left for a retry (the prompt stays pending)."""
        if not self._count_failure(tries):
            return False
        if backoff:
            await self._sleep(self.s.retry.delay(tries.failures, retry_after_s))
        again, _ = self._reserve([tries.prompt])
        if not again:
            return False
        tries.res = again[0]
        return True

    async def _retry_held(self, tries: _PromptTries, out: Outcome) -> bool:
        """A retryable error that billed nothing uncertain: the reservation still holds, and the prompt is asked
        again on it after a congestion wait or a failure's backoff. False: it has used ``max_attempts``."""
        if out.error_class in CONGESTION:
            # The server asked us to slow down: that is pacing, not this prompt failing, so it draws
            # on its own (much larger) allowance instead of max_attempts.
            self.limiter.on_congestion()
            tries.congestion_waits += 1
            if tries.congestion_waits <= self.s.retry.max_congestion_waits:
                await self._sleep(self.s.retry.delay(min(tries.congestion_waits, 8), out.retry_after_s))
                return True
        if not self._count_failure(tries):
            self.ledger.release(tries.res)
            log.warning(
                "%s: prompt %s failed after %d attempts (last: %s)",
                self.job.key,
                tries.prompt.prompt_id,
                tries.attempts,
                out.error_class,
            )
            return False
        await self._sleep(self.s.retry.delay(tries.failures, out.retry_after_s))
        return True

    @staticmethod
    def _maybe_billed(raw: RawResponse, out: Outcome) -> bool:
        """An attempt whose bill is unknown: no answer came whole (timeout, drop, torn body), or the answer
        ended in an error after producing output and says no cost (OpenRouter documents only
        zero-completion answers as free)."""
        if raw.transport_error is not None or out.error_class == "malformed":
            return True
        return out.partial_output and not out.cost_usd

    def _provisional_usd(self, res: Reservation, out: Outcome) -> float:
        """What an uncertain attempt is charged until /generation answers: its worst case, or for a partial
        answer whose usage counts its tokens, those at the dearest price (never more than the worst case)."""
        usage = (out.data or {}).get("usage")
        if not out.partial_output or not isinstance(usage, dict):
            return res.usd
        try:
            tokens = int(usage.get("completion_tokens") or 0)
        except (TypeError, ValueError):
            return res.usd
        if tokens <= 0:
            return res.usd
        priced = res.prompt_usd + tokens * (res.price or self.providers.max_completion_price)
        return min(res.usd, max(priced, out.cost_usd or 0.0))

    def _charge_uncertain(self, res: Reservation, raw: RawResponse, out: Outcome) -> None:
        cost = self._provisional_usd(res, out)
        self.report.uncertain_usd += cost
        self.report.spent_usd += cost
        # With an id (head, first chunk, body prefix) the charge is provisional until /generation knows it.
        self._settler.charge(res, cost, generation_id_of(raw))

    async def _settle_earlier(self) -> None:
        """Before admitting: settle what is due on the ledger (its refunds free budget for this run)."""
        try:
            await self._settler.round(all_pending=True)
        except Exception as exc:  # best effort: the provisional charges stand meanwhile
            log.warning("%s: settlement of earlier attempts failed: %s", self.job.key, type(exc).__name__)
            return
        check = await reconcile_with_key(self.ledger, self.client.key_info, self.s.settlement.key_usage_quiet_s)
        if check is not None and check.done and check.orphans:
            self.emit(
                f"{self.job.key}: held against the key's usage, {check.orphans} orphans of killed runs sent without"
                f" a response head were charged ${check.refunded_usd:.4f} more than the key was billed: given back"
            )

    async def _settle_at_end(self) -> None:
        """Look this run's uncertain attempts up once more; what is still unknown waits for a later run."""
        try:
            tally = await self._settler.finish()
        except Exception as exc:  # the provisional charges stand; a later run settles them
            log.warning("%s: settlement at the end of the run failed: %s", self.job.key, type(exc).__name__)
            return
        r = self.report
        r.uncertain_usd -= tally.refunded_own_usd
        r.spent_usd -= tally.refunded_own_usd
        r.settled_earlier_usd = tally.refunded_usd - tally.refunded_own_usd
        r.uncertain_pending = tally.pending_own

    # --- skips and request-wide errors ----------------------------------------------------------
    def _to_ask(self, journal: Journal, prompt_id: str) -> bool:
        """Not journaled yet, or journaled as a skip that is asked again: one no success confirmed (not
        final), or any with ``reask_skipped`` (after a change of configuration)."""
        record = journal.records.get(prompt_id)
        if record is None:
            return True
        return record.get("status") == "skipped" and (self.s.reask_skipped or record.get("final") is False)

    def _skip(self, prompt: Prompt, res: Reservation, out: Outcome, attempts: int) -> None:
        """A skip waits until a success shows the request itself works (an every_turn chain waits with it); if
        the breaker finds it request-wide (``breaker``), the run stops and none of its kind is journaled."""
        self.ledger.release(res)  # a refusal is not billed (a cost it reported was recorded above)
        trip = self.breaker.on_skip(out.error_class, out.message, open_requests=self._busy - 1)
        if trip is not None:
            self._drop_tripped_held()
            self.report.request_wide_skips = trip.count
            self._stop("fatal", trip.describe(), abort=True)
            return
        if self.breaker.is_tripped_by(out.error_class, out.message):
            self.report.request_wide_skips += 1
            return
        if self.job.chains is not None:
            self.job.chains.on_held(prompt.prompt_id)  # the conversation goes on or ends when it is journaled
        self._held.append(skipped_record(prompt, out.error_class, out.message, attempts))

    def _drop_tripped_held(self) -> None:
        """The skips held of the error that opened the breaker are never journaled (asked again next run)."""
        kept = []
        for record in self._held:
            if not self.breaker.is_tripped_by(record["error_class"], record["message"]):
                kept.append(record)
            elif self.job.chains is not None:
                self.job.chains.drop_held(record["prompt_id"])
        self._held = kept

    def _confirm_skips(self) -> None:
        """A success: the request works, so the skips held so far are the prompts' own; journal them."""
        self.breaker.on_success()
        for record in self._held:
            self._commit_q.put_nowait((record, None))
        self._held.clear()

    async def _journal_held(self, journal: Journal) -> None:
        """At the end: skips still held are final if the partition has a success, else asked again next run."""
        if self._held:
            final = self.report.ok > 0 or any(r.get("status") == "ok" for r in journal)
            for record in self._held:
                record["final"] = final
                self._commit_q.put_nowait((record, None))
            self.report.unconfirmed_skips = 0 if final else len(self._held)
            self._held.clear()
            await self._commit_q.join()
        skips = [r for r in journal if r.get("status") == "skipped"]
        if skips and not any(r.get("status") == "ok" for r in journal):
            top = Counter((r.get("error_class"), r.get("message") or "") for r in skips).most_common(1)[0][0]
            self._nothing_bought = (
                f"all {len(skips)} answered prompts of the partition were skipped and none succeeded (most: {top[0]}:"
                f" {top[1] or 'no message'}); a partition with nothing bought fails. The skips not confirmed by a"
                " success are asked again on the next run; set reask_skipped to ask all of them again"
            )

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._abort.wait(), timeout=seconds)

    def _priced(self, body: dict[str, Any]) -> float:
        usage = body.get("usage") or {}
        p, c = self.providers.price_of(body.get("provider"))
        return int(usage.get("prompt_tokens") or 0) * p + int(usage.get("completion_tokens") or 0) * c

    # --- durability ---------------------------------------------------------------------------
    async def _committer(self, journal: Journal) -> None:
        """Group commit: one fsync per batch. A failure here must end the run, never pass silently."""
        while True:
            first = await self._commit_q.get()
            batch = [first]
            await asyncio.sleep(self.s.commit_interval_s)
            while not self._commit_q.empty():
                batch.append(self._commit_q.get_nowait())
            try:
                if self._commit_error is None:
                    await asyncio.to_thread(self._commit, journal, batch)
                    self._advance_chains(batch)
            except Exception as exc:
                self._commit_error = exc
                self._stop("fatal", f"journal/ledger commit failed: {type(exc).__name__}: {exc}", abort=True)
            finally:
                for _ in batch:
                    self._commit_q.task_done()
                if self._at_wall:
                    self._wake.set()  # settlements free budget: the dispatcher may admit again

    def _commit(self, journal: Journal, batch: list[tuple[dict[str, Any], Reservation | None]]) -> None:
        fresh = {r["prompt_id"] for r in journal.append_many([r for r, _ in batch])}
        settlements = []
        for record, res in batch:
            ok = record["status"] == "ok"
            cost = float(record.get("cost") or 0.0) if ok else 0.0
            tokens = int(record.get("completion_tokens") or 0) if ok else 0
            if res is not None:
                settlements.append(Settlement(res, cost, tokens, "settled" if ok else "released"))
            if record["prompt_id"] not in fresh:
                continue
            if ok:
                self.report.ok += 1
                self.report.truncated += bool(record.get("truncated"))
                self.report.output_tokens += tokens
                self.report.spent_usd += cost
                self.report.providers[str(record.get("provider"))] += 1
                self.report.provider_usd[str(record.get("provider"))] += cost
                self.report.provider_tokens[str(record.get("provider"))] += tokens
            else:
                self.report.skipped += 1
        self.ledger.settle_many(settlements)

    # --- account and progress -----------------------------------------------------------------
    async def _poll_key(self, initial: bool = False) -> None:
        try:
            cap, self._credits_allowed = await read_account_cap(self.client, self._credits_allowed)
        except Exception as exc:  # a failed poll must not stop generation; the ledger still holds
            log.warning("%s: /key poll failed: %s", self.job.key, type(exc).__name__)
            return
        if cap.source != self._cap_source:
            self._cap_source = cap.source
            self.emit(f"{self.job.key}: account cap in force — {cap.detail}")
        if cap.remaining_usd is None:
            self._account_remaining = None
            return
        self._account_remaining = cap.remaining_usd
        self._spent_at_poll = self.ledger.totals().usd_spent
        if initial and self._account_remaining <= 0:
            self._stop(
                "credits",
                f"the account has no credit left (${self._account_remaining:.2f}: {cap.detail})",
                abort=True,
            )

    async def _key_loop(self) -> None:
        while True:
            await asyncio.sleep(self.s.key_poll_interval_s)
            await self._poll_key()

    def _eta_s(self, elapsed: float) -> float | None:
        """Seconds left at this run's pace: until every prompt is done or the dataset's token target is
        reached, whichever comes first. None before anything finished."""
        r = self.report
        if elapsed <= 0 or r.ok + r.skipped == 0:
            return None
        eta = (r.total - r.done) / ((r.ok + r.skipped) / elapsed)
        if r.output_tokens > 0:
            left = self.job.token_budget - self.ledger.totals(self.job.dataset).tokens_spent
            eta = min(eta, max(0.0, left) / (r.output_tokens / elapsed))
        return eta

    def _progress_line(self, elapsed: float, final: bool = False) -> str:
        r = self.report
        t = self.ledger.totals()
        errs = " ".join(f"{k}={v}" for k, v in sorted(r.errors.items())) or "none"
        rate = r.requests / elapsed if elapsed > 0 else 0.0
        tok_rate = r.output_tokens / elapsed if elapsed > 0 else 0.0
        eta = None if final else self._eta_s(elapsed)
        return (
            f"{'done ' if final else ''}{r.partition}: {r.done}/{r.total} prompts | out {r.output_tokens:,} tok"
            f" | ${r.spent_usd:.4f} this run, ${t.usd_spent:.4f} spent + ${self.ledger.open_held_usd():.4f} held"
            f" ({self.s.admission.mode}) of ${self.s.budget_usd:.2f} | {rate:.1f} req/s, {tok_rate:,.0f} tok/s,"
            f" ${60 * r.spent_usd / elapsed if elapsed > 0 else 0.0:.4f}/min"
            f"{'' if final else ' | ETA ' + format_duration(eta)} | in flight"
            f" {self.limiter.in_flight}/{min(self.limiter.current, self._slot_limit)} | errors: {errs}"
        )

    def _observe(self) -> None:
        """Hand the account's money to ``observe``; a failing observer is logged, never ends generation."""
        if self.observe is None:
            return
        try:
            self.observe(
                take_snapshot(
                    self.ledger,
                    self.s.budget_usd,
                    remaining_at_poll=self._account_remaining,
                    spent_at_poll=self._spent_at_poll,
                    cap_source=self._cap_source or "unknown",
                    observed_by=f"generation {self.job.key}",
                )
            )
        except Exception as exc:
            log.warning("%s: account observation failed: %s: %s", self.job.key, type(exc).__name__, exc)

    async def _progress_loop(self, start: float) -> None:
        progressed = observed = time.monotonic()
        self._observe()
        while True:
            await asyncio.sleep(min(self.s.progress_interval_s, self.s.account_observe_interval_s))
            now = time.monotonic()
            if now - progressed >= self.s.progress_interval_s * 0.999:
                progressed = now
                self.emit(self._progress_line(now - start))
            if now - observed >= self.s.account_observe_interval_s * 0.999:
                observed = now
                self._observe()


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
