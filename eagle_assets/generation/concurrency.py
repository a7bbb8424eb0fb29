"""An AIMD concurrency limit: back off multiplicatively on 429s, regain additively on success.

The upstream rate limit is unknown and moves, so the window follows what comes back: a gain of about 5% of the
maximum per window's worth of successes, and at most one halving per episode of about one round trip (the
smoothed latency, as in TCP: the 429s of requests sent before the last decrease say nothing about the new window).
An episode halves only when its congestion answers pass ``loss_threshold`` of what came back or was sent in it by
three binomial standard deviations: providers return the odd 429 at random, a 429 comes back at once while a
success takes the whole answer, and an episode holds a handful of answers. With plain shares the soak at 30 s
latency halved 2,000 down to 63–173 in flight (docs/errors-and-billing.md).
"""

import asyncio
import math
import time
from collections import deque


class AdaptiveLimiter:
    decrease_factor = 0.5
    min_episode_samples = 5

    def __init__(self, maximum: int, minimum: int = 4, cooldown_s: float = 2.0, loss_threshold: float = 0.1) -> None:
        if maximum < 1 or minimum < 1 or minimum > maximum:
            raise ValueError("need 1 <= minimum <= maximum")
        self.maximum = maximum
        self.minimum = minimum
        self.limit = float(maximum)
        self.increase_per_window = max(1.0, maximum * 0.05)
        self.cooldown_s = cooldown_s
        self.min_cooldown_s = min(0.2, cooldown_s)
        self.latency_ewma: float | None = None
        self.loss_threshold = loss_threshold
        self.in_flight = 0
        self.decreases = 0
        self._window_start: float | None = None
        self._window_ok = 0
        self._window_congested = 0
        self._window_sent = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def current(self) -> int:
        return max(self.minimum, min(self.maximum, int(self.limit)))

    async def acquire(self) -> None:
        while self.in_flight >= self.current:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                raise
        self.in_flight += 1
        self.on_sent()

    def on_sent(self, now: float | None = None) -> None:
        """A request goes out: it counts in the current episode's denominator (see the module docstring)."""
        if self._window_start is None:
            self._window_start = time.monotonic() if now is None else now
        self._window_sent += 1

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        free = self.current - self.in_flight
        while free > 0 and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                free -= 1

    @property
    def episode_s(self) -> float:
        if self.latency_ewma is None:
            return self.cooldown_s
        return max(self.min_cooldown_s, min(self.cooldown_s, self.latency_ewma))

    def on_success(self, latency_s: float | None = None, now: float | None = None) -> None:
        if latency_s is not None:
            self.latency_ewma = latency_s if self.latency_ewma is None else 0.9 * self.latency_ewma + 0.1 * latency_s
        self.limit = min(float(self.maximum), self.limit + self.increase_per_window / max(self.limit, 1.0))
        self._record(False, time.monotonic() if now is None else now)
        self._wake()

    def on_congestion(self, now: float | None = None) -> None:
        self._record(True, time.monotonic() if now is None else now)

    def _congested_beyond_chance(self, seen: int) -> bool:
        """More congestion answers than ``loss_threshold`` of ``seen`` plus three binomial standard deviations: one
        429 among five answers is no evidence, a storm (most answers 429s) passes it at any size."""
        p = self.loss_threshold
        return self._window_congested > p * seen + 3.0 * math.sqrt(seen * p * (1.0 - p))

    def _record(self, congested: bool, now: float) -> None:
        """Count an answer in the current episode; the first answer after it ends decides it."""
        if self._window_start is None:
            self._window_start = now
        elif now - self._window_start >= self.episode_s:
            answered = self._window_ok + self._window_congested
            seen = max(answered, self._window_sent)
            if answered >= self.min_episode_samples and self._congested_beyond_chance(seen):
                self.decreases += 1
                self.limit = max(float(self.minimum), self.limit * self.decrease_factor)
            self._window_start, self._window_ok, self._window_congested, self._window_sent = now, 0, 0, 0
        if congested:
            self._window_congested += 1
        else:
            self._window_ok += 1
