"""One prompt's attempts: send, classify, and record what the outcome means (kept, skipped, charged until
settled, retried on the same or a fresh reservation, or stopping the run)."""

import functools
import logging
from dataclasses import dataclass
from typing import Any

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.ledger import Reservation, Settlement
from eagle_assets.generation.records import success_record
from eagle_assets.generation.runner.skips import Skips
from resources.openrouter.outcomes import Action, Outcome, RawResponse, classify, generation_id_of

log = logging.getLogger(__name__)

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


class Attempts(Skips):
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
            # Maybe billed: charged provisionally (settled from /generation later), the retry reserved afresh.
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
            log.warning("%s: discarded a response from disallowed provider %r ($%.6f)", self.job.key, provider, cost)
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
        """A failed attempt whose reservation is used up: wait its backoff and reserve the prompt afresh. False: it
        used ``max_attempts``, or no headroom is left for a retry (the prompt stays pending)."""
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
        if out.error_class in CONGESTION:  # pacing, not this prompt failing: its own (larger) allowance
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
        """No answer came whole, or it ended in an error after output and says no cost (OpenRouter documents only
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
        self._settler.charge(res, cost, generation_id_of(raw))

    def _on_accepted(self) -> None:
        """A 200 response head: the request passed OpenRouter's checks, which a request-wide 400 never does."""
        if self.breaker.on_accepted():
            self._wake.set()  # the first wave opens now, not when its answers come back
