"""vLLM's speculative-decoding counters, scraped from ``/metrics`` before and after a run.

vLLM reports acceptance per server, not per request, as Prometheus counters (names, labels and commit followed:
docs/draft-and-benchmark.md, "Engine versions followed"). Series of every ``engine`` (data-parallel ranks) are
summed. The counters are global: a delta is this benchmark's only if nothing else used the server between the
two scrapes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from resources.serving.acceptance import AcceptanceError, AcceptanceTally
from resources.serving.errors import EngineResponseError, SpeculationMissing
from resources.serving.prometheus import Sample, matching, parse_metrics

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


def _sum(samples: list[Sample], name: str) -> float | None:
    found = matching(samples, name)
    return sum(s.value for s in found) if found else None


@dataclass(frozen=True)
class SpecDecodeCounters:
    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]
    generation_tokens: float

    @classmethod
    def from_metrics_text(cls, text: str) -> SpecDecodeCounters:
        samples = parse_metrics(text)
        drafts = _sum(samples, DRAFTS)
        if drafts is None:
            raise SpeculationMissing(
                f"no {DRAFTS} in /metrics: the server runs without --speculative-config "
                "(or is a vLLM without V1 spec-decode metrics)"
            )
        values = {n: _sum(samples, n) for n in (DRAFT_TOKENS, ACCEPTED, GENERATION_TOKENS)}
        missing = [n for n, v in values.items() if v is None]
        if missing:
            raise EngineResponseError(f"/metrics has {DRAFTS} but not {', '.join(missing)}")
        by_pos: dict[int, float] = defaultdict(float)
        for s in matching(samples, ACCEPTED_PER_POS):
            pos = s.label("position")
            if pos is None or not pos.isdigit():
                raise EngineResponseError(f"{ACCEPTED_PER_POS} sample without a numeric position label: {s}")
            by_pos[int(pos)] += s.value
        if sorted(by_pos) != list(range(len(by_pos))):
            raise EngineResponseError(f"{ACCEPTED_PER_POS} positions {sorted(by_pos)} are not 0..K-1")
        return cls(
            drafts,
            values[DRAFT_TOKENS] or 0.0,
            values[ACCEPTED] or 0.0,
            tuple(by_pos[i] for i in range(len(by_pos))),
            values[GENERATION_TOKENS] or 0.0,
        )

    @property
    def num_speculative_tokens(self) -> int:
        return len(self.per_position)

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        """The run's own counts; counters that went down mean the server restarted between the scrapes."""
        if self.num_speculative_tokens != before.num_speculative_tokens:
            raise EngineResponseError("the number of draft positions changed between two scrapes")
        delta = SpecDecodeCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(self.per_position, before.per_position, strict=True)),
            self.generation_tokens - before.generation_tokens,
        )
        if min(delta.drafts, delta.draft_tokens, delta.accepted, delta.generation_tokens, *delta.per_position) < 0:
            raise EngineResponseError(f"vLLM counters went down between two scrapes (server restarted?): {delta}")
        return delta

    def tally(self, num_steps: int, output_tokens: int) -> AcceptanceTally:
        """The delta as a tally; ``output_tokens`` are the completion tokens the requests reported."""
        if self.num_speculative_tokens != num_steps:
            raise SpeculationMissing(
                f"the server drafts {self.num_speculative_tokens} tokens per step, the benchmark asked for {num_steps}"
            )
        counts = [self.drafts, self.accepted, *self.per_position]
        if any(c != int(c) for c in counts):
            raise EngineResponseError(f"non-integer spec-decode counter deltas: {self}")
        try:
            return AcceptanceTally(
                num_steps,
                "accepted_per_draft",
                int(self.drafts),
                int(self.accepted),
                [int(p) for p in self.per_position],
                output_tokens,
            ).check()
        except AcceptanceError as exc:
            raise EngineResponseError(f"impossible spec-decode counter deltas: {exc}") from None
