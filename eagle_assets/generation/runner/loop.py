"""The partition's run: open the journal under the partition's lease, resume, run the background tasks and the
dispatcher, settle, and report."""

import asyncio
import logging
import time

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.journal import Journal
from eagle_assets.generation.runner.commits import Commits
from eagle_assets.generation.runner.dispatch import Dispatch
from eagle_assets.generation.runner.job import PartitionReport
from eagle_assets.generation.runner.progress import Progress
from eagle_assets.generation.settlement import reconcile_with_key

log = logging.getLogger(__name__)


class PartitionRunner(Dispatch, Commits, Progress):
    async def run(self) -> PartitionReport:
        start = time.monotonic()
        # The partition's lease first: opening the journal may truncate a torn tail (``partition_fence``).
        with self.ledger.partition_fence(self.job.key) as fence, Journal(self.job.journal_path, fence) as journal:
            actual = {
                r["reservation_id"]: (float(r.get("cost") or 0.0), int(r.get("completion_tokens") or 0))
                for r in journal
                if r.get("reservation_id")
            }
            self.ledger.correct_orphans(self.job.key, actual)
            await self._settle_earlier()  # orphans of killed runs, attempts earlier runs left uncertain
            pending = self._resume(journal)
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
        self._final_stop_reason()
        self.emit(self._progress_line(time.monotonic() - start, final=True))
        if self.observe is not None:
            await self._poll_key()  # everything has settled: the key's credit and the ledger agree again
            self._observe()
        return self.report

    def _resume(self, journal: Journal) -> list[Prompt]:
        """What this run asks: the prompts (or first turns) not journaled yet, and the skips asked again."""
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
        return pending

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
