"""Tell a request-wide error from prompts that are bad one by one.

A 400 or 403 that the classifier calls a skip ("this prompt can never succeed") is sometimes caused
by the request itself, and then every prompt gets it alike: "Reasoning is mandatory for this
endpoint and cannot be disabled." for a ``reasoning: {enabled: false}`` in the config, or
``Input required: specify "prompt" or "messages"``. Skipping them all would end the partition
"completed" with nothing bought, and the journaled skips would never be asked again.

The breaker watches the skips: when ``threshold`` of them carry the same error class and the same
normalized message with no success since (the first ``threshold`` answers of a run, or a streak
later), the error is request-wide. The run then stops as fatal with that message, and those skips
are not journaled as final, so the prompts are asked again once the request is fixed. Until the
first success it also says the run is ``probing``: the runner keeps its first wave to ``threshold``
requests for a moment, so a request-wide error costs that many requests, not a wave of 2000.

A pure class: no clock, no I/O; the runner feeds it answers.
"""

import re
from collections import Counter
from dataclasses import dataclass

# Parts of a message that differ between prompts of one cause: ids, numbers, quoted values.
_VOLATILE = re.compile(
    r"gen-[A-Za-z0-9_\-]+"  # generation ids
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"  # uuids
    r"|\b[0-9a-f]{16,}\b"  # long hex ids
    r"|\d+(?:[.,]\d+)*",  # numbers (token counts, lengths, prices)
    re.I,
)
_SPACES = re.compile(r"\s+")


def normalize_message(text: str) -> str:
    """The message with what varies from prompt to prompt taken out, so one cause reads as one message."""
    return _SPACES.sub(" ", _VOLATILE.sub("#", text or "")).strip().lower()[:240]


Signature = tuple[str, str]  # (error class, normalized message)


@dataclass(frozen=True)
class Trip:
    """The breaker opened: ``count`` answers of ``error_class`` said ``message`` (the first one's words)."""

    error_class: str
    message: str
    count: int

    def describe(self) -> str:
        return (
            f"request-wide error: {self.count} answers in a row without a success were {self.error_class}"
            f" with the same message: {self.message or '(no message)'} — every prompt would get it, so the"
            " request itself is wrong (model, parameters, reasoning or provider settings); nothing was journaled"
            " for these prompts: fix the configuration and re-materialize"
        )


class RequestWideBreaker:
    """Counts skip answers per (class, normalized message) since the last success; ``threshold`` 0 disables."""

    def __init__(self, threshold: int = 8) -> None:
        if threshold < 0:
            raise ValueError("breaker threshold must be >= 0 (0 disables it)")
        self.threshold = threshold
        self.seen_success = False
        self.tripped: Trip | None = None
        self._counts: Counter[Signature] = Counter()
        self._first_message: dict[Signature, str] = {}

    @staticmethod
    def signature(error_class: str, message: str) -> Signature:
        return error_class, normalize_message(message)

    @property
    def probing(self) -> bool:
        """No success yet this run: whether the request works at all is still open."""
        return self.threshold > 0 and not self.seen_success and self.tripped is None

    @property
    def suspect(self) -> bool:
        """Some skip since the last success (or since the start)."""
        return bool(self._counts)

    def on_success(self) -> None:
        self.seen_success = True
        self._counts.clear()
        self._first_message.clear()

    def on_skip(self, error_class: str, message: str) -> Trip | None:
        """One skip answer; returns the trip when this one makes the error request-wide (once)."""
        if self.threshold == 0 or self.tripped is not None:
            return None
        sig = self.signature(error_class, message)
        self._counts[sig] += 1
        self._first_message.setdefault(sig, message)
        if self._counts[sig] >= self.threshold:
            self.tripped = Trip(error_class, self._first_message[sig], self._counts[sig])
            return self.tripped
        return None

    def is_tripped_by(self, error_class: str, message: str) -> bool:
        """Whether a skip of this kind belongs to the error that opened the breaker."""
        if self.tripped is None:
            return False
        return self.signature(error_class, message) == self.signature(self.tripped.error_class, self.tripped.message)
