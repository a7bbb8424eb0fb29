"""Published acceptance lengths of Kimi EAGLE-3 drafts, shown beside this platform's figures as reference.

All three were reported with SGLang at 3 steps, topk 1, 4 draft tokens (docs/draft-and-benchmark.md).
:func:`comparable` says whether a run was measured the same way and, when not, why, so a figure from a
2-question smoke run can never be read against a published one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS
from resources.serving.commands import SpeculativeSettings

REFERENCE_ENGINE = "sglang"
REFERENCE_SETTINGS = SpeculativeSettings(num_steps=3, eagle_topk=1, num_draft_tokens=4)
MTBENCH_TURNS = 2  # MT-Bench's questions are asked with both turns


@dataclass(frozen=True)
class ReferenceFigures:
    draft: str
    tau: dict[str, float]  # prompt-set name -> τ
    note: str = ""
    questions: dict[str, int] = field(default_factory=dict)  # per set, as published; absent: not published
    thinking: bool | None = None  # None: the publication does not say


REFERENCES: tuple[ReferenceFigures, ...] = (
    ReferenceFigures(
        "lightseekorg/kimi-k2.5-eagle3",
        {"mtbench": 2.687, "gsm8k": 3.201, "humaneval": 3.285},
        "n = 80 / 500 / 164, SpecForge bench_eagle3.py",
        {"mtbench": 80, "gsm8k": 500, "humaneval": 164},
    ),
    ReferenceFigures("AQ-MedAI Kimi-K2 (SpecBundle)", {"mtbench": 2.39, "gsm8k": 3.27, "humaneval": 3.36}),
    ReferenceFigures("nvidia Kimi-K2.6-Eagle3", {"mtbench": 2.62}, "MT-Bench only, draft length 3"),
)


def reference_benchmark_config() -> dict[str, object]:
    """The ``draft_benchmark`` config of a run whose figures are to stand beside the published ones: the
    references' steps/topk/draft tokens, greedy, batch 1, every set in full with its default max tokens
    (the set sizes are the config's defaults; the rest is spelled out so that the run's config shows it)."""
    spec = REFERENCE_SETTINGS
    return {
        "num_steps": spec.num_steps,
        "eagle_topk": spec.eagle_topk,
        "num_draft_tokens": spec.num_draft_tokens,
        "temperature": 0.0,
        "batch_size": 1,
        "max_new_tokens": 0,
    }


def published_questions(name: str) -> int | None:
    """The questions the references asked of a set, when one published it (they agree where several do)."""
    counts = {ref.questions[name] for ref in REFERENCES if name in ref.questions}
    if len(counts) > 1:
        raise ValueError(f"the references disagree on the questions of {name}: {sorted(counts)}")
    return counts.pop() if counts else None


@dataclass(frozen=True)
class SetFacts:
    """What a run measured of one set, as far as comparability goes."""

    name: str
    questions: int  # conversations in the set
    answered: int  # requests answered (MT-Bench: two per question)
    max_new_tokens: int
    complete: bool


@dataclass(frozen=True)
class Comparability:
    """``reasons``: why the run cannot be set beside the references; ``unknowns``: what they did not publish."""

    reasons: tuple[str, ...] = ()
    unknowns: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        head = "comparable" if self.ok else "not comparable: " + "; ".join(self.reasons)
        return head + (f" (not published by the references: {'; '.join(self.unknowns)})" if self.unknowns else "")

    def short(self) -> str:
        """For a plot title: the verdict and the first reason."""
        if self.ok:
            return "comparable"
        more = f" (+{len(self.reasons) - 1} more)" if len(self.reasons) > 1 else ""
        return f"not comparable: {self.reasons[0]}{more}"


def _set_reasons(s: SetFacts) -> list[str]:
    spec = PROMPT_SETS[s.name]
    label = spec.label
    out = []
    if not s.complete:
        out.append(f"{label} pass incomplete")
    want = published_questions(s.name)
    if want is not None and s.questions != want:
        out.append(f"{s.questions} of the {want} {label} questions")
    turns = MTBENCH_TURNS if s.name == "mtbench" else 1
    if s.complete and s.answered != s.questions * turns:
        out.append(f"{label}: {s.answered} answers to {s.questions} questions of {turns} turn(s)")
    if s.max_new_tokens != spec.default_max_new_tokens:
        out.append(f"{label} max_new_tokens {s.max_new_tokens}, not {spec.default_max_new_tokens}")
    return out


def _on(thinking: bool) -> str:
    return "on" if thinking else "off"


def _thinking_reasons(thinking: bool) -> tuple[list[str], list[str]]:
    recorded = {ref.thinking for ref in REFERENCES if ref.thinking is not None}
    if not recorded:
        return [], [f"whether the target was thinking (this run: thinking {_on(thinking)})"]
    if thinking not in recorded:
        return [f"thinking {_on(thinking)}; the references recorded {'/'.join(_on(t) for t in recorded)}"], []
    return [], []


def comparable(
    engine: str, settings: SpeculativeSettings, temperature: float, thinking: bool, sets: Sequence[SetFacts]
) -> Comparability:
    """Whether the run's τ may be read against the published ones: same engine, settings, greedy decoding,
    full sets at the published sizes with their default max tokens, every pass complete, and the thinking
    setting where a reference recorded it. Sets without a published figure (held-out) are not judged."""
    reasons: list[str] = []
    if engine != REFERENCE_ENGINE:
        reasons.append(f"engine {engine}, not {REFERENCE_ENGINE}")
    if settings != REFERENCE_SETTINGS:
        reasons.append(
            f"steps/topk/draft tokens {settings.num_steps}/{settings.eagle_topk}/{settings.num_draft_tokens}, "
            f"not {REFERENCE_SETTINGS.num_steps}/{REFERENCE_SETTINGS.eagle_topk}/{REFERENCE_SETTINGS.num_draft_tokens}"
        )
    if temperature != 0.0:
        reasons.append(f"temperature {temperature}, not greedy")
    published = {n for ref in REFERENCES for n in ref.tau}
    judged = [s for s in sets if s.name in published]
    if not judged:
        reasons.append("no set with a published figure was run")
    unknowns: list[str] = []
    for s in judged:
        reasons += _set_reasons(s)
        if published_questions(s.name) is None:
            unknowns.append(f"the number of {PROMPT_SETS[s.name].label} questions")
    more_reasons, more_unknowns = _thinking_reasons(thinking)
    return Comparability(tuple(reasons + more_reasons), tuple(unknowns + more_unknowns))
