"""The benchmark prompt sets the published Kimi drafts are measured on, as conversations to send.

Rows come from the Hub at pinned revisions in the sets' published column layouts and become conversations the
way SpecForge's ``benchmarks/benchmarker`` turns them into requests (docs/draft-and-benchmark.md); where SpecForge
sends raw text, these go through the target's chat template (``formatting.py``), as they are served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eagle_assets.errors import DataError

MTBENCH_SYSTEM_PROMPT = (
    "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being safe.  "
    "Your answers should not include any harmful, unethical, racist, sexist, toxic, dangerous, or illegal content. "
    "Please ensure that your responses are socially unbiased and positive in nature.\n\n"
    "If a question does not make any sense, or is not factually coherent, explain why instead of answering something "
    "not correct. If you don't know the answer to a question, please don't share false information."
)


class PromptSetError(DataError, ValueError):
    """A prompt set's rows are not in the layout it needs, or it yields no conversation."""


@dataclass(frozen=True)
class HubSet:
    """Where a set lives on the Hub, pinned: ``revision`` is a commit (a branch name is resolved and recorded)."""

    repo_id: str
    revision: str
    config: str | None
    split: str

    @property
    def source(self) -> str:
        return f"hf:{self.repo_id}"


@dataclass(frozen=True)
class PromptSetSpec:
    name: str
    label: str
    hub: HubSet | None  # None: the corpus's held-out split
    default_prompts: int
    default_max_new_tokens: int  # per turn (SpecForge's per-benchmark defaults)


# Revisions: the commits other pinned evaluations use (openai/gsm8k and openai/openai_humaneval as in
# lighteval's tasks; HuggingFaceH4/mt_bench_prompts as in several public speculative-decoding
# benchmarks), so a moved branch never changes the questions behind a figure. The benchmark config's
# ``revisions`` names another commit per set; the commit read is recorded with the results either way.
MTBENCH_REVISION = "e3a795c5e9a82ee40611c416b8a7786c73198991"
PROMPT_SETS: dict[str, PromptSetSpec] = {
    "mtbench": PromptSetSpec(
        "mtbench", "MT-Bench", HubSet("HuggingFaceH4/mt_bench_prompts", MTBENCH_REVISION, None, "train"), 80, 2048
    ),
    "gsm8k": PromptSetSpec(
        "gsm8k",
        "GSM8K",
        HubSet("openai/gsm8k", "e53f048856ff4f594e959d75785d2c2d37b678ee", "main", "test"),
        500,
        512,
    ),
    "humaneval": PromptSetSpec(
        "humaneval",
        "HumanEval",
        HubSet("openai/openai_humaneval", "e9b53e1677523f1e61e4d0960fd7502694a24bd4", "openai_humaneval", "test"),
        164,
        1024,
    ),
    "heldout": PromptSetSpec("heldout", "held-out corpus", None, 80, 1024),
}


@dataclass
class Conversation:
    """User turns sent one after the other, each with the target's previous answers as history."""

    id: str
    user_turns: list[str] = field(default_factory=list)
    system: str | None = None
    prompt_ids: list[int] | None = None  # a pre-tokenized single turn (held-out prompts)

    @property
    def turns(self) -> int:
        return 1 if self.prompt_ids is not None else len(self.user_turns)


def _need(row: Mapping[str, Any], keys: Sequence[str], set_name: str, index: int) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise PromptSetError(f"{set_name} row {index} has no {missing} (columns: {sorted(row)})")


def mtbench_conversations(rows: Sequence[Mapping[str, Any]], limit: int) -> list[Conversation]:
    out = []
    for i, row in enumerate(rows[:limit]):
        turns = row.get("prompt", row.get("turns"))
        if not isinstance(turns, list | tuple) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise PromptSetError(
                f"mtbench row {i}: 'prompt' (or 'turns') must be a list of texts (columns: {sorted(row)})"
            )
        qid = row.get("prompt_id", row.get("question_id", i))
        out.append(Conversation(f"mtbench-{qid}", list(turns), MTBENCH_SYSTEM_PROMPT))
    return out


def gsm8k_few_shot(rows: Sequence[Mapping[str, Any]], shots: int) -> str:
    if len(rows) <= shots:
        raise PromptSetError(f"gsm8k: {len(rows)} rows, but its {shots}-shot prompt takes {shots} and asks the rest")
    for i, row in enumerate(rows[:shots]):
        _need(row, ("question", "answer"), "gsm8k", i)
    return "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:shots])


def gsm8k_conversations(rows: Sequence[Mapping[str, Any]], limit: int, shots: int = 5) -> list[Conversation]:
    """``limit`` questions from row ``shots`` on: the rows before are the examples (SpecForge skips them too)."""
    prefix = gsm8k_few_shot(rows, shots)
    out = []
    for i, row in enumerate(rows[shots : shots + limit], start=shots):
        _need(row, ("question",), "gsm8k", i)
        out.append(Conversation(f"gsm8k-{i}", [f"{prefix}Question: {row['question']}\nAnswer:"]))
    return out


def humaneval_conversations(rows: Sequence[Mapping[str, Any]], limit: int) -> list[Conversation]:
    out = []
    for i, row in enumerate(rows[:limit]):
        _need(row, ("task_id", "prompt"), "humaneval", i)
        out.append(Conversation(str(row["task_id"]), [str(row["prompt"])]))
    return out


def heldout_conversations(prompts: Sequence[Sequence[int]]) -> list[Conversation]:
    return [Conversation(f"heldout-{i}", prompt_ids=list(p)) for i, p in enumerate(prompts)]


BUILDERS = {"mtbench": mtbench_conversations, "gsm8k": gsm8k_conversations, "humaneval": humaneval_conversations}


def conversations_from_rows(name: str, rows: Sequence[Mapping[str, Any]], limit: int) -> list[Conversation]:
    """A Hub set's rows as conversations; an empty result from rows is an error, never an empty benchmark."""
    if name not in BUILDERS:
        raise PromptSetError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    if not rows:
        raise PromptSetError(f"{name}: the source has no rows")
    convs = BUILDERS[name](rows, limit)
    if not convs:
        raise PromptSetError(f"{name}: {len(rows)} rows gave no conversation (limit {limit})")
    return convs
