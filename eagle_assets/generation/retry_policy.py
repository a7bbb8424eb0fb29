"""Exponential backoff with full jitter, bounded by attempts, honouring server hints.

Full jitter (sleep uniformly in [0, min(cap, base * 2**n)]) spreads 2000 clients' retries instead of
synchronising them into waves; a ``Retry-After`` from the server is a floor, not a suggestion.
"""

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    max_attempts: int = 10  # failures (5xx, timeouts, torn bodies...) per prompt
    max_congestion_waits: int = 200  # 429 / in-flight 402 / 503 waits per prompt: pacing, not failure
    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    retry_after_cap_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.max_congestion_waits < 0:
            raise ValueError("max_congestion_waits must be >= 0")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")

    def should_retry(self, attempts_made: int) -> bool:
        return attempts_made < self.max_attempts

    def delay(self, attempts_made: int, retry_after_s: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt ``attempts_made + 1``."""
        r = rng or random
        ceiling = min(self.max_delay_s, self.base_delay_s * (2 ** max(0, attempts_made - 1)))
        jitter = r.uniform(0.0, ceiling)
        if retry_after_s is not None:
            # Spread the herd a little past the hint so that they do not all return at once.
            return min(self.retry_after_cap_s, retry_after_s) + r.uniform(0.0, min(1.0, ceiling))
        return jitter
