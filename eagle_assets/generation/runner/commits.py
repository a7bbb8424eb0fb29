"""Durability: the group commit that journals records (fsync first) and settles their reservations, and
the every_turn conversations it moves on."""

import asyncio
from typing import Any

from eagle_assets.generation.journal import Journal
from eagle_assets.generation.ledger import Reservation, Settlement
from eagle_assets.generation.runner.stops import StopDecisions


class Commits(StopDecisions):
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
