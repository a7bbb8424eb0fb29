"""What the plan learns from the journals: which prompts are done, how long answers took, who served them (the
ledger knows lengths and dollars, not latencies or providers)."""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.generation.journal import read_records

MIN_LATENCY_SAMPLES = 20


@dataclass
class JournalFacts:
    done: set[str] = field(default_factory=set)  # prompt ids with a final record (answered or skipped)
    latencies: list[float] = field(default_factory=list)  # seconds, answered prompts only
    providers: Counter[str] = field(default_factory=Counter)  # answers kept, by provider

    def __add__(self, other: "JournalFacts") -> "JournalFacts":
        return JournalFacts(self.done | other.done, self.latencies + other.latencies, self.providers + other.providers)


def journal_facts(paths: Iterable[Path]) -> JournalFacts:
    facts = JournalFacts()
    for path in paths:
        for record in read_records(path):
            facts.done.add(str(record["prompt_id"]))
            if record.get("status") != "ok":
                continue
            if record.get("latency_s") is not None:
                facts.latencies.append(float(record["latency_s"]))
            if record.get("provider"):
                facts.providers[str(record["provider"])] += 1
    return facts


def latency_estimate(own: JournalFacts, everyone: JournalFacts, prior_s: float, dataset: str) -> tuple[float, str]:
    """Mean seconds per answer: the dataset's own answers, else every dataset's, else the configured prior."""
    for facts, whose in ((own, f"{dataset}'s"), (everyone, "all datasets'")):
        if len(facts.latencies) >= MIN_LATENCY_SAMPLES:
            mean = sum(facts.latencies) / len(facts.latencies)
            return mean, f"{whose} {len(facts.latencies):,} answers: {mean:.1f} s each"
    return prior_s, f"configured prior: {prior_s:g} s per answer"
