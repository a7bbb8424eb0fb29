"""An AIMD concurrency limit: back off multiplicatively on 429s, regain additively on success.

The upstream rate limit is unknown and moves, so the number of requests in flight follows what
comes back: a gain of about ``increase_per_window`` for every window's worth of successes, and at
most one halving per episode. An episode lasts about one round trip (the smoothed latency of
successes, bounded by ``min_cooldown_s`` and ``cooldown_s``), as in TCP: the 429s of requests sent
before the last decrease say nothing about the new window, and waiting much longer than a round trip
lets a 2000-wide window hammer an overloaded server for seconds.

An episode only halves the window when its congestion answers are more than ``loss_threshold`` of
what came back in it (or of what was sent in it, if that is more) by more than chance gives: three
standard deviations of a binomial at that rate. Providers return the odd 429 at random; halving on
each (classic AIMD under random loss) collapses the window to a few dozen requests at a 3% 429 rate.
Two effects of a long answer latency (tens of seconds on OpenRouter) make plain shares lie: a 429
comes back at once while a success takes the whole answer, so in a run's first latency every answer
is a fast 429 of the first wave (hence the sends in the denominator); and an episode is a slice of a
round trip holding a handful of answers, where one 429 among five is 20% (hence the deviation). With
shares alone the soak at 30 s latency halved 2,000 down to 63–173 in flight, regaining ~100 a round
trip.
"""

import asyncio
import math
import time
from collections import deque


class AdaptiveLimiter:
    def __init__(
        self,
        maximum: int,
        minimum: int = 4,
        initial: int | None = None,
        decrease_factor: float = 0.5,
        increase_per_window: float | None = None,
        cooldown_s: float = 2.0,
        min_cooldown_s: float = 0.2,
        loss_threshold: float = 0.1,
        min_episode_samples: int = 5,
    ) -> None:
        if maximum < 1 or minimum < 1 or minimum > maximum:
            raise ValueError("need 1 <= minimum <= maximum")
        if not 0.0 < decrease_factor < 1.0:
            raise ValueError("decrease_factor must be in (0, 1)")
        self.maximum = maximum
        self.minimum = minimum
        self.limit = float(initial if initial is not None else maximum)
        self.decrease_factor = decrease_factor
        self.increase_per_window = increase_per_window or max(1.0, maximum * 0.05)
        self.cooldown_s = cooldown_s
        self.min_cooldown_s = min(min_cooldown_s, cooldown_s)
        self.latency_ewma: float | None = None
        self.loss_threshold = loss_threshold
        self.min_episode_samples = min_episode_samples
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
        """More congestion answers than ``loss_threshold`` of ``seen`` plus three standard deviations of a
        binomial at that rate: an episode of a round trip's slice holds a few answers, and one 429 among five
        is no evidence (at a 30 s latency there are 15 episodes a round trip: chance halvings outran the gain
        of ~100 a round trip); a storm (most answers 429s) passes it at any size."""
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
