"""Per-benchmark results of a serving run, and the tables that show them beside the published figures.

A set's row joins the speculative pass and the baseline pass of the same prompts (speedup: their tokens/s
ratio). A set whose pass was cut short is kept, marked incomplete, so a failure still shows what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eagle_assets.benchmarks.prompt_sets import PROMPT_SETS
from eagle_assets.benchmarks.reference import REFERENCES, Comparability, SetFacts
from eagle_assets.benchmarks.serving_run import SetPass
from eagle_assets.markdown import table


@dataclass
class SetResult:
    name: str
    draft: SetPass
    baseline: SetPass | None = None

    @property
    def label(self) -> str:
        spec = PROMPT_SETS.get(self.name)
        return spec.label if spec else self.name

    @property
    def tau(self) -> float | None:
        return None if self.draft.tally is None else self.draft.tally.tau

    @property
    def position_rates(self) -> list[float] | None:
        return None if self.draft.tally is None else self.draft.tally.position_rates

    @property
    def speedup(self) -> float | None:
        a = self.draft.tokens_per_s
        b = None if self.baseline is None else self.baseline.tokens_per_s
        return a / b if a and b else None

    @property
    def complete(self) -> bool:
        return self.draft.complete and (self.baseline is None or self.baseline.complete)

    @property
    def warnings(self) -> dict[str, int]:
        """Both passes' warnings, message -> answers it applied to."""
        out = dict(self.draft.warnings)
        for message, n in (self.baseline.warnings if self.baseline else {}).items():
            out[message] = out.get(message, 0) + n
        return out

    def facts(self, max_new_tokens: int) -> SetFacts:
        """The draft pass as comparability sees it; the baseline counts through ``complete``."""
        return SetFacts(self.name, self.draft.conversations, len(self.draft.records), max_new_tokens, self.complete)

    def summary(self) -> dict[str, Any]:
        t = self.draft.tally
        return {
            "set": self.name,
            "conversations": self.draft.conversations,
            "requests": len(self.draft.records),
            "output_tokens": self.draft.output_tokens,
            "tau": _r(self.tau),
            "tau_definition": None if t is None else t.definition,
            "per_position_accept_rate": None if self.position_rates is None else [_r(x) for x in self.position_rates],
            "accept_rate": _r(None if t is None else t.accept_rate),
            "verifications": None if t is None else t.verifications,
            "tokens_per_s": _r(self.draft.tokens_per_s),
            "wall_s": _r(self.draft.wall_s),
            "baseline_tokens_per_s": _r(None if self.baseline is None else self.baseline.tokens_per_s),
            "baseline_wall_s": _r(None if self.baseline is None else self.baseline.wall_s),
            "speedup": _r(self.speedup),
            "complete": self.complete,
            "warnings": self.warnings,
        }


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def results_table(results: Sequence[SetResult], num_steps: int) -> str:
    labels = [f"pos {i + 1}" for i in range(num_steps)]
    head = ["benchmark", "τ", *labels, "tok/s with draft", "tok/s without", "speedup", "requests"]
    lines = []
    for r in results:
        rates: Sequence[float | None] = r.position_rates or [None] * num_steps
        done = "" if r.complete else " (incomplete)"
        cells = [
            r.label + done,
            _f(r.tau),
            *(_f(x) for x in rates),
            _f(r.draft.tokens_per_s, "{:.1f}"),
            _f(None if r.baseline is None else r.baseline.tokens_per_s, "{:.1f}"),
            _f(r.speedup, "{:.2f}×"),
            str(len(r.draft.records)),
        ]
        lines.append(cells)
    return table(head, lines)


def _reference_source(ref_note: str, questions: dict[str, int]) -> str:
    counts = "" if questions else "; questions per set not published"
    return "reference (published)" + (f"; {ref_note}" if ref_note else "") + counts


def reference_table(results: Sequence[SetResult], ours_label: str, verdict: Comparability) -> str:
    """Our τ per benchmark in the first row, with the comparability verdict and its reasons, then the
    published figures (marked reference)."""
    names = ["mtbench", "gsm8k", "humaneval"]
    ours = {r.name: r.tau for r in results}
    head = ["draft", *(PROMPT_SETS[n].label for n in names), "source"]
    lines = [[ours_label, *(_f(ours.get(n)) for n in names), f"this run; {verdict.describe()}"]]
    for ref in REFERENCES:
        lines.append([ref.draft, *(_f(ref.tau.get(n)) for n in names), _reference_source(ref.note, ref.questions)])
    return table(head, lines)
