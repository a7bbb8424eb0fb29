"""Stop decisions: why admission stops (a budget, the credits, a fatal error), when the last crumbs of a
budget are not worth another batch, and the stop reason a run reports at its end."""

import asyncio
import contextlib
import math

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.ledger import Denial
from eagle_assets.generation.runner.core import RunnerCore
from eagle_assets.generation.runner.job import StopReason


class StopDecisions(RunnerCore):
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

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._abort.wait(), timeout=seconds)

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

    def _final_stop_reason(self) -> None:
        """At the end, a run that stopped for nothing else reports what it left undone: a partition with nothing
        bought, prompts that found no headroom for a retry, or prompts that used up their attempts."""
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
