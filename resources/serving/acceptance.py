"""Acceptance length τ and per-position acceptance, computed the way each anchor computes it.

Every backend reduces to the same counts over *verifications* (target forwards that check a draft):
``accepted`` excludes the bonus token, and ``reached[j]`` counts the verifications that accepted draft position
``j + 1``. The two published definitions of τ and where each count comes from: docs/draft-and-benchmark.md,
"What is measured".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from eagle_assets.errors import EngineError

TauDefinition = Literal["output_per_verification", "accepted_per_draft"]


class AcceptanceError(EngineError, ValueError):
    """Counts that cannot come from a speculative run (negative, or more accepted than drafted)."""


@dataclass
class AcceptanceTally:
    num_steps: int  # draft tokens proposed per verification (K)
    definition: TauDefinition
    verifications: int = 0
    accepted: int | None = 0  # None: the engine does not report it (SGLang before spec_num_correct_drafts)
    reached: list[int] | None = field(default=None)  # None: the engine reports no per-position counts
    output_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise AcceptanceError(f"num_steps must be >= 1, got {self.num_steps}")

    @classmethod
    def empty(cls, num_steps: int, definition: TauDefinition) -> AcceptanceTally:
        return cls(num_steps, definition, 0, 0, [0] * num_steps, 0)

    @classmethod
    def from_rounds(cls, accepted_per_round: Iterable[int], num_steps: int, output_tokens: int) -> AcceptanceTally:
        """The in-process loop's rounds (accepted drafts per verification) as a tally."""
        rounds = list(accepted_per_round)
        reached = [sum(1 for n in rounds if n > j) for j in range(num_steps)]
        return cls(num_steps, "accepted_per_draft", len(rounds), sum(rounds), reached, output_tokens).check()

    def check(self) -> AcceptanceTally:
        """Raise when the counts are impossible; a wrong counter name or a delta over a restart shows here."""
        if self.verifications < 0 or self.output_tokens < 0 or (self.accepted is not None and self.accepted < 0):
            raise AcceptanceError(f"negative counts: {self}")
        if self.accepted is not None and self.accepted > self.verifications * self.num_steps:
            raise AcceptanceError(
                f"{self.accepted} tokens accepted in {self.verifications} verifications of {self.num_steps} drafts"
            )
        if self.reached is not None:
            if len(self.reached) != self.num_steps:
                raise AcceptanceError(f"{len(self.reached)} positions reported for {self.num_steps} draft steps")
            if any(r < 0 or r > self.verifications for r in self.reached):
                raise AcceptanceError(f"per-position counts {self.reached} outside 0..{self.verifications}")
            if any(a < b for a, b in zip(self.reached, self.reached[1:], strict=False)):
                raise AcceptanceError(f"per-position counts {self.reached} grow with the position: not a chain draft")
            if self.accepted is not None and sum(self.reached) != self.accepted:
                raise AcceptanceError(f"per-position counts {self.reached} do not add up to {self.accepted} accepted")
        return self

    @property
    def tau(self) -> float | None:
        """Tokens per verification by this tally's definition; None before any verification."""
        if self.verifications <= 0:
            return None
        if self.definition == "output_per_verification":
            return self.output_tokens / self.verifications
        if self.accepted is None:
            return None
        return 1.0 + self.accepted / self.verifications

    @property
    def position_rates(self) -> list[float] | None:
        if self.reached is None or self.verifications <= 0:
            return None
        return [r / self.verifications for r in self.reached]

    @property
    def accept_rate(self) -> float | None:
        """Accepted over proposed draft tokens (SGLang's ``spec_accept_rate``, vLLM's draft acceptance rate)."""
        if self.accepted is None or self.verifications <= 0:
            return None
        return self.accepted / (self.verifications * self.num_steps)

    def __add__(self, other: AcceptanceTally) -> AcceptanceTally:
        if (other.num_steps, other.definition) != (self.num_steps, self.definition):
            raise AcceptanceError("cannot add tallies of different draft lengths or τ definitions")
        reached = (
            [a + b for a, b in zip(self.reached, other.reached, strict=True)]
            if self.reached is not None and other.reached is not None
            else None
        )
        accepted = None if self.accepted is None or other.accepted is None else self.accepted + other.accepted
        return AcceptanceTally(
            self.num_steps,
            self.definition,
            self.verifications + other.verifications,
            accepted,
            reached,
            self.output_tokens + other.output_tokens,
        )


def reached_from_histogram(histogram: Sequence[int], num_steps: int) -> list[int]:
    """``reached[j]`` from a histogram whose entry ``k`` counts verifications that accepted exactly ``k`` drafts.

    SGLang grows it on demand, so a short one is padded; a longer one than ``num_steps + 1`` means the
    server drafts more than configured."""
    if len(histogram) > num_steps + 1 and any(histogram[num_steps + 1 :]):
        raise AcceptanceError(f"histogram {list(histogram)} accepts more than {num_steps} drafts per verification")
    counts = [*histogram[: num_steps + 1], *([0] * (num_steps + 1 - len(histogram)))]
    return [sum(counts[j + 1 :]) for j in range(num_steps)]
