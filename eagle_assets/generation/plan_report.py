"""The plan as the UI shows it: one Markdown table per question (what it costs, what is available, what fits);
and ``plan_outcome``, the recorded plan against what generation then did. Rendering only."""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eagle_assets.generation.plan import Plan, Span
from eagle_assets.generation.runner import format_duration
from eagle_assets.markdown import table


def _tokens(s: Span) -> str:
    return f"{s.expected:,.0f} ({s.low:,.0f}–{s.high:,.0f})"


def _usd(s: Span) -> str:
    return f"${s.expected:,.2f} (${s.low:,.2f}–${s.high:,.2f})"


def plan_markdown(plan: Plan) -> str:
    rows: list[list[object]] = [
        [
            d.name,
            d.bound,
            _tokens(d.requests),
            _tokens(d.output_tokens),
            _tokens(d.prompt_tokens),
            _usd(d.usd),
            f"${d.usd_dearest:,.2f}",
            format_duration(d.wall_s),
            d.lengths_source,
        ]
        for d in plan.datasets
    ]
    dearest = sum(d.usd_dearest for d in plan.datasets)
    rows.append(
        [
            "**total**",
            "",
            _tokens(plan.total_requests),
            _tokens(plan.total_tokens),
            _tokens(sum((d.prompt_tokens for d in plan.datasets), Span(0.0, 0.0, 0.0))),
            f"**{_usd(plan.total_usd)}**",
            f"${dearest:,.2f}",
            f"{format_duration(plan.wall_s)} all at once",
            "",
        ]
    )
    m = plan.money
    key = "no cap visible" if m.key_remaining_usd is None else f"${m.key_remaining_usd:,.2f} ({m.cap_source})"
    money = [
        ("budget_usd", f"${m.budget_usd:,.2f}"),
        ("spent (ledger)", f"${m.spent_usd:,.2f}"),
        ("held by requests in flight", f"${m.held_usd:,.2f}"),
        ("budget left", f"${m.budget_left_usd:,.2f}"),
        ("key's remaining credit", key),
        ("left unspent by the budget's tail", f"${m.reserve_usd:,.2f}"),
        ("**available to this plan**", f"**${m.available_usd:,.2f}**"),
    ]
    verdict = f"**{'Fits' if plan.fits else 'Does not fit'}.** {plan.summary()}"
    parts = [
        verdict,
        table(
            [
                "dataset",
                "ends at",
                "requests",
                "output tokens",
                "prompt tokens",
                "$ expected (95%)",
                "$ all at dearest",
                "wall alone",
                "answer lengths from",
            ],
            rows,
        ),
        table(["money", "USD"], money),
        f"Prices: {plan.prices_source}. In flight: {plan.in_flight:,}.",
    ]
    if plan.proposals:
        head = ["dataset", "requested target", *(f"{r} share" for r in plan.proposals)]
        targets = [
            [d.name, f"{d.token_target:,}", *(f"{plan.proposals[r][d.name]:,}" for r in plan.proposals)]
            for d in plan.datasets
        ]
        what = {
            "wait": "generation waits: it refuses to start until the plan is re-made with another on_overrun",
            "scale_down": f"generation uses the {plan.proposal_rule} targets",
            "proceed": "generation proceeds to the requested targets until the money runs out",
        }[plan.on_overrun]
        parts += [f"Output-token targets that fit ({what}):", table(head, targets)]
    return "\n\n".join(parts)


@dataclass(frozen=True)
class PlanOutcome:
    """A recorded plan's projection for what was left against what generation then spent and produced.

    What was spent when the plan was made (its pilot's answers, kept as data, or earlier runs') is apart: the
    projection is of the rest.
    """

    projected_usd: float
    projected_tokens: float
    spent_usd: float
    produced_tokens: int
    before_usd: float
    before_tokens: int

    @property
    def usd_error(self) -> float:
        """spent / projected − 1 (NaN when nothing was projected)."""
        return self.spent_usd / self.projected_usd - 1 if self.projected_usd else math.nan

    @property
    def tokens_error(self) -> float:
        return self.produced_tokens / self.projected_tokens - 1 if self.projected_tokens else math.nan

    def within(self, fraction: float) -> bool:
        return abs(self.usd_error) <= fraction and abs(self.tokens_error) <= fraction

    def lines(self) -> list[str]:
        """The projection, then what happened; the errors when something was projected."""
        errors = (
            f": {100 * self.usd_error:+.1f}% dollars, {100 * self.tokens_error:+.1f}% output tokens against the plan"
            if self.projected_usd and self.projected_tokens
            else ""
        )
        return [
            f"plan: ${self.projected_usd:.4f} and {self.projected_tokens:,.0f} output tokens projected for the rest"
            f" (spent before it, its pilot's answers kept as data: ${self.before_usd:.4f} and {self.before_tokens:,})",
            f"generation then spent ${self.spent_usd:.4f} and produced {self.produced_tokens:,} output tokens{errors}",
        ]


def plan_outcome(doc: Mapping[str, Any], totals: Mapping[str, tuple[float, int]]) -> PlanOutcome:
    """``doc``: the recorded plan (``plan_file.read_plan``); ``totals``: dataset → (USD spent, output tokens) in the
    ledger now, for the datasets to compare (the plan's others are left out)."""
    rows = [d for d in doc["datasets"] if d["name"] in totals]
    return PlanOutcome(
        projected_usd=sum(d["usd"]["expected"] for d in rows),
        projected_tokens=sum(d["output_tokens"]["expected"] for d in rows),
        spent_usd=sum(totals[d["name"]][0] - d["spent_usd"] for d in rows),
        produced_tokens=sum(totals[d["name"]][1] - d["produced_tokens"] for d in rows),
        before_usd=sum(d["spent_usd"] for d in rows),
        before_tokens=sum(d["produced_tokens"] for d in rows),
    )
