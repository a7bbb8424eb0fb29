"""Progress and observations: the key's cap polled, a progress line every ``progress_interval_s``, and the
account's money handed to ``observe``."""

import asyncio
import logging
import math
import time

from eagle_assets.generation.account_snapshot import take_snapshot
from eagle_assets.generation.runner.stops import StopDecisions
from resources.openrouter.account import read_account_cap

log = logging.getLogger(__name__)


class Progress(StopDecisions):
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
                "credits", f"the account has no credit left (${self._account_remaining:.2f}: {cap.detail})", abort=True
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
