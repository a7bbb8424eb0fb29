"""Fault injection: which misbehaviour of OpenRouter a request gets, if any.

Faults are exclusive per request and drawn from one seeded RNG, so a run's fault sequence is reproducible for
a given arrival order while a prompt's text never depends on it. The admission token bucket is apart because
a 429 storm is a rate phenomenon, not a per-request coin flip.
"""

import dataclasses
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from resources.simulator.flags import flag

# Draw order is part of reproducibility: do not reorder without reason.
FAULT_NAMES: tuple[str, ...] = (
    "rate_limit",
    "rate_limit_no_retry_after",
    "server_error",
    "timeout_408",
    "drop_connection",
    "stall",
    "error_body",
    "finish_error",
    "truncated_json",
    "whitespace_padding",
    "disallowed_provider",
    "inflight_402",
)

# Faults answered before any latency: upstream limiters and budget checks refuse at once.
EARLY_FAULTS = frozenset({"rate_limit", "rate_limit_no_retry_after", "inflight_402"})
# Faults whose answer carries no completion, so nothing is billed even if abandoned. Not
# ``finish_error``: its partial output is billed (OpenRouter documents only zero-completion answers
# as free), and so is a stream cut by an error after its first chunks.
UNBILLED_FAULTS = frozenset(
    {
        "rate_limit",
        "rate_limit_no_retry_after",
        "inflight_402",
        "server_error",
        "timeout_408",
        "error_body",
        "drop_connection",
    }
)


@dataclass(frozen=True)
class FaultConfig:
    """Per-request fault probabilities (their sum must not exceed 1) plus the knobs they use."""

    rate_limit: float = 0.0
    rate_limit_no_retry_after: float = 0.0
    server_error: float = 0.0
    timeout_408: float = 0.0
    drop_connection: float = 0.0
    stall: float = 0.0
    error_body: float = 0.0
    finish_error: float = 0.0
    truncated_json: float = 0.0
    whitespace_padding: float = 0.0
    disallowed_provider: float = 0.0
    inflight_402: float = 0.0
    retry_after_s: float = field(
        default=1.0, metadata=flag("--retry-after", "the Retry-After seconds of fault 429s and admit-rate 429s")
    )
    stall_seconds: float = field(default=60.0, metadata=flag("--stall-seconds", "how long a stall fault holds"))
    admit_rate_per_s: float | None = field(
        default=None, metadata=flag("--admit-rate", "token-bucket admissions per second (default: unlimited)")
    )
    admit_burst: float | None = field(
        default=None, metadata=flag("--admit-burst", "the bucket's size (default: max(1, admit rate))")
    )
    admit_retry_after: bool = field(
        default=True, metadata=flag("--admit-no-retry-after", "admit-rate 429s without Retry-After")
    )
    bill_truncated_json: bool = True  # the upstream finished, so OpenRouter bills it

    def __post_init__(self) -> None:
        total = 0.0
        for name in FAULT_NAMES:
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"fault probability {name}={p} is outside [0, 1]")
            total += p
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault probabilities sum to {total:.4f} > 1 (faults are exclusive per request)")
        if self.admit_rate_per_s is not None and self.admit_rate_per_s <= 0:
            raise ValueError("admit_rate_per_s must be positive or None")
        if self.retry_after_s < 0 or self.stall_seconds < 0:
            raise ValueError("retry_after_s and stall_seconds must be >= 0")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "FaultConfig":
        """Build from JSON/CLI values, rejecting unknown names so that typos do not pass silently."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown fault setting(s): {', '.join(unknown)}; known: {', '.join(known)}")
        kwargs: dict[str, Any] = {}
        for name, value in values.items():
            if name in ("admit_retry_after", "bill_truncated_json"):
                kwargs[name] = _as_bool(value)
            elif name in ("admit_rate_per_s", "admit_burst"):
                kwargs[name] = None if value in (None, "", "none", "None") else float(value)
            else:
                kwargs[name] = float(value)
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "FaultConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class FaultPicker:
    """One uniform draw per request against the cumulative probability table."""

    def __init__(self, config: FaultConfig, seed: int) -> None:
        self._rng = random.Random(seed * 7919 + 17)
        self.configure(config)

    def configure(self, config: FaultConfig) -> None:
        self.config = config
        table: list[tuple[float, str]] = []
        acc = 0.0
        for name in FAULT_NAMES:
            p = getattr(config, name)
            if p > 0:
                acc += p
                table.append((acc, name))
        self._table = table

    def draw(self) -> str | None:
        if not self._table:
            return None
        u = self._rng.random()
        for threshold, name in self._table:
            if u < threshold:
                return name
        return None

    def choice(self, options: list[Any]) -> Any:
        return options[self._rng.randrange(len(options))]

    def randrange(self, n: int) -> int:
        return self._rng.randrange(n)


class TokenBucket:
    """Admission control: ``rate`` tokens per second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def try_take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def seconds_until_token(self) -> float:
        return max(0.0, (1.0 - self._tokens) / self.rate)
