"""Tallies the benchmark makes itself: the in-process loop's rounds, and the sum of several sets' tallies.

What a tally means (τ and per-position acceptance, each anchor's definition): ``resources/serving/acceptance.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from resources.serving.acceptance import AcceptanceTally, TauDefinition


def tally_from_rounds(accepted_per_round: Iterable[int], num_steps: int, output_tokens: int) -> AcceptanceTally:
    """The in-process loop's rounds (accepted drafts per verification) as a tally."""
    rounds = list(accepted_per_round)
    reached = [sum(1 for n in rounds if n > j) for j in range(num_steps)]
    tally = AcceptanceTally(num_steps, "accepted_per_draft", len(rounds), sum(rounds), reached, output_tokens)
    return tally.check()


def sum_tallies(tallies: Iterable[AcceptanceTally], num_steps: int, definition: TauDefinition) -> AcceptanceTally:
    total = AcceptanceTally.empty(num_steps, definition)
    for t in tallies:
        total = total + t
    return total
