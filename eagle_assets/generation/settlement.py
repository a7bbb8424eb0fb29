"""Lazy settlement: attempts whose billing is unknown are charged provisionally, then looked up later.

An attempt may have been billed without its answer reaching us (a timeout, a dropped connection, a torn body, a
partial answer that ended in an error, a kill). Its generation id says what it cost through ``/generation``, but
that answers 404 until OpenRouter has indexed it, which a probe saw take more than 8 minutes. So nothing waits: the
charge is provisional (the ledger's ``uncertain`` table), and the lookup is repeated with backoff while this run
lasts, once more at its end, and by any later run on the ledger, so that a kill costs what was billed, not the
worst case forever. The budget never counts less than may have been billed (docs/errors-and-billing.md).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from eagle_assets.generation.ledger import BudgetLedger, KeyUsageCheck, Reservation, Settlement, UncertainAttempt

log = logging.getLogger(__name__)

Lookup = Callable[[str], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class SettlementSchedule:
    """When to look an uncertain attempt up: ``first_lookup_s`` after it was charged, then backing off by
    ``backoff`` up to ``max_interval_s``; given up (written off) ``write_off_after_s`` after the charge."""

    first_lookup_s: float = 2.0
    backoff: float = 2.0
    max_interval_s: float = 600.0
    write_off_after_s: float = 7 * 86400.0
    loop_interval_s: float = 1.0  # how often a run looks for due attempts
    # How often sends and response heads' ids are written down: a request waits up to this long before it is sent.
    note_flush_s: float = 0.02
    batch: int = 200  # attempts claimed per round
    concurrency: int = 16  # lookups at once
    claim_s: float = 60.0  # a claimed attempt is not looked up by another process for this long
    final_wait_s: float = 5.0  # at a run's end, how long to keep trying this run's attempts
    lookup_timeout_s: float = 10.0  # one /generation lookup
    # Quiet needed before the ledger is held against the key's usage counter: it must have caught up with every bill.
    key_usage_quiet_s: float = 600.0

    def __post_init__(self) -> None:
        if self.first_lookup_s < 0 or self.backoff < 1 or self.max_interval_s <= 0 or self.write_off_after_s <= 0:
            raise ValueError("settlement schedule: delays must be positive and backoff >= 1")
        if self.loop_interval_s <= 0 or self.note_flush_s <= 0:
            raise ValueError("settlement schedule: loop_interval_s and note_flush_s must be positive")

    def next_lookup(self, lookups: int, now: float) -> float:
        """When to look again after ``lookups`` lookups found nothing."""
        return now + min(self.max_interval_s, self.first_lookup_s * self.backoff ** max(0, lookups - 1))


@dataclass
class SettlementTally:
    """What settlement did in one run: attempts charged here, and answers found (here or for earlier runs)."""

    charged: int = 0
    charged_usd: float = 0.0
    resolved: int = 0
    refunded_usd: float = 0.0  # provisional charges given back, on this run's attempts and older ones alike
    refunded_own_usd: float = 0.0  # the part of it on attempts charged by this run
    written_off: int = 0
    lookups: int = 0
    pending_own: int = 0  # this run's attempts still unsettled when it ended
    pending_own_usd: float = 0.0
    key_check: KeyUsageCheck | None = None  # the ledger held against the key's usage counter, if it was

    def line(self) -> str:
        return (
            f"uncertain attempts: {self.charged} charged provisionally (${self.charged_usd:.4f}); {self.resolved}"
            f" settled from /generation (${self.refunded_usd:.4f} given back), {self.written_off} written off;"
            f" {self.pending_own} of this run's still pending (${self.pending_own_usd:.4f}), settled by a later run"
        )


@dataclass
class LazySettler:
    """One run's side of lazy settlement, over the shared ledger; ``lookup`` is ``client.generation``."""

    ledger: BudgetLedger
    lookup: Lookup | None
    schedule: SettlementSchedule = field(default_factory=SettlementSchedule)
    emit: Callable[[str], None] = log.info
    tally: SettlementTally = field(default_factory=SettlementTally)

    def __post_init__(self) -> None:
        self._noted: list[tuple[Reservation, str]] = []
        self._own: dict[str, float] = {}  # generation id -> provisional charge, for this run's attempts
        self._sending: list[str] = []  # reservations whose request waits for the next flush to go out
        self._flushed: asyncio.Future[None] | None = None

    # --- what the runner tells it ---------------------------------------------------------------
    def note(self, reservation: Reservation, generation_id: str) -> None:
        """The response head named the generation of ``reservation``'s request (called on arrival: cheap).
        Written to the ledger at the next round, so that a kill from then on leaves a settleable orphan."""
        self._noted.append((reservation, generation_id))

    def charge(self, reservation: Reservation, provisional_usd: float, generation_id: str | None) -> None:
        """Close ``reservation`` at a provisional charge; with an id it is looked up later, without it is final."""
        self.ledger.settle_many([Settlement(reservation, provisional_usd, 0, "uncertain", generation_id)])
        self.tally.charged += 1
        self.tally.charged_usd += provisional_usd
        if generation_id:
            self._own[generation_id] = provisional_usd

    async def sending(self, reservation: Reservation) -> None:
        """Before each attempt goes out, its reservation is marked sent (with the next flush, shared by every request
        sent meanwhile): a process killed after that is charged for it, one killed before has it released."""
        self._sending.append(reservation.id)
        if self._noted:  # an earlier attempt's id, not yet written, must not stand for this one
            self._noted = [(r, g) for r, g in self._noted if r.id != reservation.id]
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._flushed)  # one waiter giving up must not cancel the others' wait

    def flush_noted(self) -> None:
        """Write down the reservations about to be sent and the ids response heads named, then let the sends go."""
        sending, self._sending = self._sending, []
        flushed, self._flushed = self._flushed, None
        noted, self._noted = self._noted, []
        try:
            if sending:
                self.ledger.mark_sent(sending)
            if noted:
                self.ledger.note_generation_ids(noted)
        except BaseException as exc:
            if flushed is not None and not flushed.done():
                flushed.set_exception(exc)  # the sends fail loudly: nothing goes out unrecorded
            raise
        if flushed is not None and not flushed.done():
            flushed.set_result(None)

    # --- looking up ----------------------------------------------------------------------------
    async def _look(self, gen_id: str) -> float | None:
        """The actual cost of one generation, or None while /generation does not know it (or cannot answer)."""
        assert self.lookup is not None
        self.tally.lookups += 1
        try:
            data = await asyncio.wait_for(self.lookup(gen_id), self.schedule.lookup_timeout_s)
        except Exception as exc:  # a failed lookup is a lookup to repeat, never a reason to stop the run
            log.debug("lookup of %s failed: %s", gen_id, type(exc).__name__)
            return None
        if not data or data.get("total_cost") is None:
            return None
        try:
            return float(data["total_cost"])
        except (TypeError, ValueError):
            return None

    async def _settle(self, attempts: list[UncertainAttempt], now: float) -> int:
        """Look ``attempts`` up; resolve, reschedule or write each off. Returns how many were resolved."""
        if not attempts or self.lookup is None:
            return 0
        gate = asyncio.Semaphore(self.schedule.concurrency)

        async def one(a: UncertainAttempt) -> tuple[UncertainAttempt, float | None]:
            async with gate:
                return a, await self._look(a.generation_id)

        found = await asyncio.gather(*(one(a) for a in attempts))
        resolved = [(a.generation_id, cost) for a, cost in found if cost is not None]
        unknown = [a for a, cost in found if cost is None]
        stale = [a.generation_id for a in unknown if now - a.charged_at >= self.schedule.write_off_after_s]
        later = [
            (a.generation_id, self.schedule.next_lookup(a.lookups + 1, now))
            for a in unknown
            if now - a.charged_at < self.schedule.write_off_after_s
        ]
        if resolved:
            refunded = self.ledger.resolve_uncertain(resolved)
            self.tally.resolved += len(resolved)
            self.tally.refunded_usd += refunded
            own = sum(self._own.pop(g) - cost for g, cost in resolved if g in self._own)
            self.tally.refunded_own_usd += own
        if stale:
            self.tally.written_off += len(stale)
            self.ledger.write_off_uncertain(stale)
            for g in stale:
                self._own.pop(g, None)
        self.ledger.reschedule_uncertain(later)
        return len(resolved)

    async def round(self, now: float | None = None, *, all_pending: bool = False) -> int:
        """Write down noted ids, then settle what is due on the whole ledger (claimed, so that several
        processes do not look the same attempts up at once). ``all_pending``: whatever its schedule (at
        the start of a run, for what earlier runs and killed ones left)."""
        self.flush_noted()
        if self.lookup is None:
            return 0
        t = time.time() if now is None else now
        due_by = float("inf") if all_pending else None
        due = self.ledger.due_uncertain(t, self.schedule.batch, self.schedule.claim_s, due_by=due_by)
        return await self._settle(due, t)

    async def run(self) -> None:
        """The loops a run keeps going beside its requests (cancelled at its end): sends and noted ids written
        down every ``note_flush_s`` (never held up by a slow lookup), due attempts settled every
        ``loop_interval_s``."""
        flusher = asyncio.create_task(self._flush_loop())
        try:
            while True:
                await asyncio.sleep(self.schedule.loop_interval_s)
                try:
                    await self.round()
                except Exception as exc:  # settlement is best effort; the provisional charges stand meanwhile
                    log.warning("settlement round failed: %s: %s", type(exc).__name__, exc)
        finally:
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.schedule.note_flush_s)
            try:
                self.flush_noted()
            except Exception as exc:  # the sends waiting on this flush failed with it (loudly); keep flushing
                log.warning("writing sends and generation ids failed: %s: %s", type(exc).__name__, exc)

    async def finish(self) -> SettlementTally:
        """At the end of a run: look this run's attempts up, whatever their schedule, for up to ``final_wait_s``
        (backing off between tries); what is still unknown is left for later runs."""
        self.flush_noted()
        deadline = time.monotonic() + self.schedule.final_wait_s
        pause = 0.2
        while self._own and self.lookup is not None:
            mine = [a for a in self.ledger.uncertain_attempts() if a.generation_id in self._own]
            for g in set(self._own) - {a.generation_id for a in mine}:
                self._own.pop(g)  # settled or written off by another process meanwhile
            if not mine:
                break
            await self._settle(mine, time.time())
            if not self._own or time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
            pause = min(2.0, pause * 2)
        self.tally.pending_own = len(self._own)
        self.tally.pending_own_usd = sum(self._own.values())
        if self.tally.charged or self.tally.resolved:
            self.emit(self.tally.line())
        return self.tally


async def reconcile_with_key(
    ledger: BudgetLedger, key_info: Callable[[], Awaitable[dict[str, Any]]], quiet_s: float
) -> KeyUsageCheck | None:
    """Hold the ledger against the key's usage counter (``BudgetLedger.reconcile_key_usage``); None when the key
    cannot be read or names no usage (best effort: the head-less orphans' charges stand meanwhile)."""
    try:
        info = await key_info()
    except Exception as exc:
        log.warning("reading the key's usage to hold the ledger against failed: %s", type(exc).__name__)
        return None
    usage = info.get("usage") if isinstance(info, dict) else None
    if isinstance(usage, bool) or not isinstance(usage, int | float):
        return None
    return ledger.reconcile_key_usage(float(usage), quiet_s=quiet_s)


async def settle_pending(
    ledger: BudgetLedger,
    lookup: Lookup,
    wait_s: float,
    schedule: SettlementSchedule | None = None,
    key_info: Callable[[], Awaitable[dict[str, Any]]] | None = None,
) -> SettlementTally:
    """Settle every attempt awaiting settlement on the ledger, trying for up to ``wait_s`` (outside a run:
    after a kill, or to see the books exact before a report); with ``key_info``, then hold the ledger against the
    key's usage counter (``reconcile_with_key``, after ``schedule.key_usage_quiet_s`` of quiet)."""
    schedule = schedule or SettlementSchedule()
    settler = LazySettler(ledger, lookup, schedule)
    deadline = time.monotonic() + wait_s
    pause = 0.5
    while True:
        pending = ledger.uncertain_attempts()
        if not pending:
            break
        await settler._settle(pending, time.time())
        if time.monotonic() + pause > deadline:
            break
        await asyncio.sleep(pause)
        pause = min(10.0, pause * 1.5)
    left = ledger.uncertain_attempts()
    settler.tally.pending_own = len(left)
    settler.tally.pending_own_usd = sum(a.provisional_usd for a in left)
    if key_info is not None and not left:
        settler.tally.key_check = await reconcile_with_key(ledger, key_info, schedule.key_usage_quiet_s)
    return settler.tally
