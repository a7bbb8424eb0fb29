"""Tell a request-wide error from prompts that are bad one by one.

A skip (a 400 or 403 "this prompt can never succeed") is sometimes caused by the request itself, and then every
prompt gets it alike ("Reasoning is mandatory for this endpoint", ``Input required``): skipping them all would end
the partition "completed" with nothing bought, and the journaled skips would never be asked again. The breaker
counts the skips since the last success per error class and normalized message, never the refusals about a
prompt's content (``PER_PROMPT``), and calls an error request-wide at ``threshold`` of them that are also at least
half of everything open or answered since (a wave whose fast 400s come back first is not "all alike"), or
``PROVEN_FACTOR`` times as many once the partition has a success. The first wave is held at ``threshold`` requests
until that many were accepted or answered (``holds_first_wave``). docs/errors-and-billing.md says what each costs.
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

# Skip classes about the prompt's content, never the request's configuration.
PER_PROMPT = frozenset({"moderation", "guardrail_blocked", "prompt_too_long"})
PROVEN_FACTOR = 4  # how much more evidence a partition with a success needs: its request has worked
SHARE = 0.5  # of the answers and open requests since the last success, that one cause must reach


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
            " for these prompts: fix the configuration and re-materialize (if these prompts really are bad one by"
            " one, breaker_threshold 0 journals them as skips)"
        )


class RequestWideBreaker:
    """Counts skip answers per (class, normalized message) since the last success; ``threshold`` 0 disables.

    ``proven``: the partition's journal already holds a success (a rerun), so more evidence is needed."""

    def __init__(self, threshold: int = 8, *, proven: bool = False) -> None:
        if threshold < 0:
            raise ValueError("breaker threshold must be >= 0 (0 disables it)")
        self.threshold = threshold
        self.proven = proven
        self.seen_success = False  # in this run
        self.tripped: Trip | None = None
        self._counts: Counter[Signature] = Counter()
        self._first_message: dict[Signature, str] = {}
        self._streak = 0  # skips of any kind since the last success
        self._responses = 0  # answers of any kind this run (retried errors included)
        self._accepted = 0  # requests whose 200 response head came (they passed the request's checks)

    @staticmethod
    def signature(error_class: str, message: str) -> Signature:
        return error_class, normalize_message(message)

    @property
    def needed(self) -> int:
        """Alike skips that make an error request-wide: ``threshold``, more once a success is known."""
        return self.threshold * (PROVEN_FACTOR if self.proven else 1)

    @property
    def probe_size(self) -> int:
        """Requests the first wave may take before it opens (``threshold`` of them out at once)."""
        return self.needed

    @property
    def holds_first_wave(self) -> bool:
        """Whether the runner keeps its first wave at ``threshold`` requests: no success yet, fewer than
        ``threshold`` accepted, and fewer than ``threshold`` answers came back, or (with a success known) every
        skip so far is one cause still short of ``needed``."""
        if self.threshold == 0 or self.tripped is not None or self.seen_success:
            return False
        if self._accepted >= self.threshold:
            return False
        if self._responses < self.threshold:
            return True
        return self.proven and len(self._counts) == 1 and self._streak < self.needed

    @property
    def suspect(self) -> bool:
        """Some skip that counts since the last success (or since the start)."""
        return bool(self._counts)

    def on_response(self) -> None:
        """Any answer to a request (success, skip, error to retry): the first wave opens after ``threshold``."""
        self._responses += 1

    def on_accepted(self) -> bool:
        """A request's 200 response head came; returns True when this one opens the first wave."""
        held = self.holds_first_wave
        self._accepted += 1
        return held and not self.holds_first_wave

    def on_success(self) -> None:
        self.seen_success = self.proven = True
        self._counts.clear()
        self._first_message.clear()
        self._streak = 0

    def on_skip(self, error_class: str, message: str, open_requests: int = 0) -> Trip | None:
        """One skip answer, with ``open_requests`` others still out; returns the trip when this one makes the
        error request-wide (once)."""
        if self.threshold == 0 or self.tripped is not None:
            return None
        self._streak += 1
        if error_class in PER_PROMPT:
            return None
        sig = self.signature(error_class, message)
        self._counts[sig] += 1
        self._first_message.setdefault(sig, message)
        count = self._counts[sig]
        if count >= self.needed and count >= SHARE * (self._streak + max(0, open_requests)):
            self.tripped = Trip(error_class, self._first_message[sig], count)
            return self.tripped
        return None

    def is_tripped_by(self, error_class: str, message: str) -> bool:
        """Whether a skip of this kind belongs to the error that opened the breaker."""
        if self.tripped is None:
            return False
        return self.signature(error_class, message) == self.signature(self.tripped.error_class, self.tripped.message)
