"""What is still to be asked of a dataset, in the order generation asks it: for the plan and its pilot.

Counting is cheap (the whole-set scan and the journals); prompt lengths are exact but read only as far as the plan
needs them, shard after shard. A later ``every_turn`` turn carries answers not bought yet: its length is its own
messages with empty answers, plus the expected answer length for each earlier turn (an upper side: the history
drops reasoning).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.datasets.prompts import Conversation, Prompt
from eagle_assets.datasets.regeneration import turn_prompt_id, turn_request
from eagle_assets.generation.partition_inputs import partition_inputs, scanned_source
from eagle_assets.generation.plan_inputs import JournalFacts, journal_facts
from eagle_assets.generation.turn_chains import TurnChains

JournalPath = Callable[[str, str], Path]  # (dataset, shard) → the partition's journal


@dataclass
class PendingRequest:
    shard: str
    prompt: Prompt  # for a later turn: rendered with empty earlier answers
    earlier_turns: int = 0  # answers this request will carry as history
    conversation: Conversation | None = None  # every_turn: the conversation it belongs to


@dataclass
class DatasetQueue:
    spec: DatasetSpec
    total_requests: int  # the whole set, every turn counted
    facts: JournalFacts  # what the journals hold
    journal_path: JournalPath
    cache_dir: Path
    shards: list[str] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return max(0, self.total_requests - len(self.facts.done))

    def requests(self) -> Iterator[PendingRequest]:
        """Pending requests in asking order: shard by shard; within an every_turn shard, turn by turn."""
        for shard in self.shards:
            inputs = partition_inputs(self.spec, shard, self.cache_dir)
            if inputs.chains is None:
                for p in inputs.prompts:
                    if p.prompt_id not in self.facts.done:
                        yield PendingRequest(shard, p)
                continue
            convs = inputs.shard.conversations
            for k in range(max((c.turn_count for c in convs), default=0)):
                for c in convs:
                    if k >= c.turn_count or turn_prompt_id(c.conversation_id, k) in self.facts.done:
                        continue
                    assert c.turns is not None
                    empty = [{"content": ""}] * k
                    messages = turn_request(c.turns, empty)
                    yield PendingRequest(
                        shard,
                        Prompt(turn_prompt_id(c.conversation_id, k), messages, c.tools, c.line, c.index),
                        k,
                        c,
                    )

    def prompt_tokens(self, count: int, estimate: Callable[[Prompt], int], mean_answer: float) -> list[int]:
        """Exact prompt lengths of the first ``count`` pending requests (later turns: see the module docstring)."""
        out: list[int] = []
        if count <= 0:
            return out
        for r in self.requests():
            out.append(estimate(r.prompt) + round(r.earlier_turns * mean_answer))
            if len(out) >= count:
                break
        return out

    def pilot(self, count: int) -> list[tuple[str, list[Prompt], TurnChains | None]]:
        """Per shard, what a pilot of about ``count`` requests asks: the first pending prompts, or for every_turn
        whole conversations (their later turns follow their own answers) until ``count`` turns are covered."""
        picked: dict[str, list[Prompt]] = {}
        convs: dict[str, list[Conversation]] = {}
        turns = 0
        for r in self.requests():
            if turns >= count:
                break
            if r.conversation is None:
                picked.setdefault(r.shard, []).append(r.prompt)
                turns += 1
            elif r.earlier_turns == 0:
                convs.setdefault(r.shard, []).append(r.conversation)
                turns += r.conversation.turn_count
        out: list[tuple[str, list[Prompt], TurnChains | None]] = [(s, ps, None) for s, ps in picked.items()]
        out += [(s, [], TurnChains(cs)) for s, cs in convs.items()]
        return out


def dataset_queue(spec: DatasetSpec, cache_dir: Path, journal_path: JournalPath) -> DatasetQueue:
    """The dataset scanned (cached after the first time) and its journals read; refuses a set too broken to use."""
    _, _, scan, _ = scanned_source(spec, cache_dir)
    shards = spec.shard_keys()
    facts = journal_facts(journal_path(spec.name, s) for s in shards)
    return DatasetQueue(spec, scan.requests, facts, journal_path, cache_dir, shards)
