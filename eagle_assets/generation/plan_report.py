"""The plan as the UI shows it: one Markdown table per question (what it costs, what is available, what fits).

Rendering only; every number comes from ``plan.Plan``.
"""

from eagle_assets.generation.plan import Plan, Span
from eagle_assets.generation.runner import format_duration


def _tokens(s: Span) -> str:
    return f"{s.expected:,.0f} ({s.low:,.0f}–{s.high:,.0f})"


def _usd(s: Span) -> str:
    return f"${s.expected:,.2f} (${s.low:,.2f}–${s.high:,.2f})"


def plan_markdown(plan: Plan) -> str:
    rows = [
        "| dataset | ends at | requests | output tokens | prompt tokens | $ expected (95%) | $ all at dearest"
        " | wall alone | answer lengths from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d in plan.datasets:
        rows.append(
            f"| {d.name} | {d.bound} | {_tokens(d.requests)} | {_tokens(d.output_tokens)} | {_tokens(d.prompt_tokens)}"
            f" | {_usd(d.usd)} | ${d.usd_dearest:,.2f} | {format_duration(d.wall_s)} | {d.lengths_source} |"
        )
    dearest = sum(d.usd_dearest for d in plan.datasets)
    rows.append(
        f"| **total** | | {_tokens(plan.total_requests)} | {_tokens(plan.total_tokens)} |"
        f" {_tokens(sum((d.prompt_tokens for d in plan.datasets), Span(0.0, 0.0, 0.0)))} | **{_usd(plan.total_usd)}**"
        f" | ${dearest:,.2f} | {format_duration(plan.wall_s)} all at once | |"
    )
    m = plan.money
    key = "no cap visible" if m.key_remaining_usd is None else f"${m.key_remaining_usd:,.2f} ({m.cap_source})"
    money = [
        "| money | USD |",
        "|---|---|",
        f"| budget_usd | ${m.budget_usd:,.2f} |",
        f"| spent (ledger) | ${m.spent_usd:,.2f} |",
        f"| held by requests in flight | ${m.held_usd:,.2f} |",
        f"| budget left | ${m.budget_left_usd:,.2f} |",
        f"| key's remaining credit | {key} |",
        f"| left unspent by the budget's tail | ${m.reserve_usd:,.2f} |",
        f"| **available to this plan** | **${m.available_usd:,.2f}** |",
    ]
    verdict = f"**{'Fits' if plan.fits else 'Does not fit'}.** {plan.summary()}"
    parts = [
        verdict,
        "\n".join(rows),
        "\n".join(money),
        f"Prices: {plan.prices_source}. In flight: {plan.in_flight:,}.",
    ]
    if plan.proposals:
        head = "| dataset | requested target | " + " | ".join(f"{r} share" for r in plan.proposals) + " |"
        lines = [head, "|---|---|" + "---|" * len(plan.proposals)]
        for d in plan.datasets:
            props = " | ".join(f"{plan.proposals[r][d.name]:,}" for r in plan.proposals)
            lines.append(f"| {d.name} | {d.token_target:,} | {props} |")
        what = {
            "wait": "generation waits: it refuses to start until the plan is re-made with another on_overrun",
            "scale_down": f"generation uses the {plan.proposal_rule} targets",
            "proceed": "generation proceeds to the requested targets until the money runs out",
        }[plan.on_overrun]
        parts += [f"Output-token targets that fit ({what}):", "\n".join(lines)]
    return "\n\n".join(parts)
