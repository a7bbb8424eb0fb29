"""Admission and waves: how many prompts are worked on at once (first wave, slow start, the account-wide
share), reserving ahead of the workers, the wall, and waiting on other runs."""

import asyncio
import contextlib
import math
import time
from collections import deque

from eagle_assets.datasets.prompts import Prompt
from eagle_assets.generation.ledger import Denial
from eagle_assets.generation.records import skipped_record
from eagle_assets.generation.runner.attempts import Attempts


class Dispatch(Attempts):
    def _probing(self, now: float) -> bool:
        """The first wave is held (``breaker.holds_first_wave``): a request-wide error then costs ``breaker_threshold``
        requests, not a wave of ``max_in_flight``; a working request, the time to its response heads."""
        if self._probe_over:
            return False
        if self.breaker.holds_first_wave and not self._abort.is_set():
            return True
        self._probe_over = True
        self._ramp_start = now  # the slow start opens from here
        return False

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
        # Other runs hold the headroom: stopping would end this partition with 0 done whenever another host reserved
        # first. Wait until they settle (or are recovered), but not on a live owner stalled for ``others_stall_s``.
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

    async def _dispatch(self, pending: list[Prompt]) -> None:
        """Keep the workers supplied with reserved prompts until none are left or a budget stops the run.

        Once a budget refuses (the wall), reservations are made only in batches of ``_tail_min()``, and admission
        stops when such a batch will not fit even after everything in flight has settled (``_another_batch_fits``).
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
                # Chunks ready ahead of the workers, so a burst of answers does not find the queue empty; none at
                # the wall; never more than this process's share (reserved and unsent holds others' budget).
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
                # Headroom is held by requests still running: look again when settlements come in.
                await asyncio.sleep(self.s.commit_interval_s)
                await self._wait_wake(0.25)
            # The workers finish what is ready and running (new ones start if the share grows back).
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
