"""Skips and request-wide errors: which skips are held, journaled or dropped, and when the breaker stops a run."""

from collections import Counter

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.journal import Journal
from eagle_assets.generation.ledger import Reservation
from eagle_assets.generation.records import skipped_record
from eagle_assets.generation.runner.stops import StopDecisions
from eagle_assets.generation.turn_chains import asked_again
from resources.openrouter.outcomes import Outcome


class Skips(StopDecisions):
    def _to_ask(self, journal: Journal, prompt_id: str) -> bool:
        """Not journaled yet, or journaled as a skip that is asked again (as a turn's is: ``asked_again``)."""
        record = journal.records.get(prompt_id)
        return record is None or asked_again(record, self.s.reask_skipped)

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
