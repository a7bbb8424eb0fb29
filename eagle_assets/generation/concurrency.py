"""An AIMD concurrency limit: back off multiplicatively on 429s, regain additively on success.

The upstream rate limit is unknown and moves, so the number of requests in flight follows what
comes back: one halving per congestion episode (``cooldown_s`` keeps a burst of 429s from one
overload from collapsing the window to the floor), and a gain of about ``increase_per_window`` for
every window's worth of successes.
"""

import asyncio
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
        self.in_flight = 0
        self.decreases = 0
        self._last_decrease = -1e9
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

    def on_success(self) -> None:
        self.limit = min(float(self.maximum), self.limit + self.increase_per_window / max(self.limit, 1.0))
        self._wake()

    def on_congestion(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._last_decrease < self.cooldown_s:
            return
        self._last_decrease = now
        self.decreases += 1
        self.limit = max(float(self.minimum), self.limit * self.decrease_factor)
