"""Regeneration modes (what is asked for a conversation) and the seeded asking order (a bijection that
spreads a token target over the whole set)."""

import itertools
from collections import Counter

import pytest

from eagle_assets.datasets.formats import RowError
from eagle_assets.datasets.regeneration import (
    answer_message,
    chain_end,
    single_request,
    turn_inputs,
    turn_prompt_id,
    turn_request,
)
from eagle_assets.datasets.sampling import RowOrder

CONV = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "u1"},
    {
        "role": "assistant",
        "content": "a1",
        "tool_calls": [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    },
    {"role": "tool", "content": "result", "tool_call_id": "functions.f:0"},
    {"role": "assistant", "content": "a1b"},
    {"role": "user", "content": "u2"},
    {"role": "assistant", "content": "a2"},
    {"role": "system", "content": "S2"},
    {"role": "user", "content": "u3"},
]


def test_single_request_modes():
    assert single_request(CONV, "last_user") == CONV  # ends with the user: asked as it is
    assert single_request(CONV[:7], "last_user") == CONV[:6]  # ends with the assistant: that answer is redone
    assert single_request(CONV, "first_turn") == CONV[:2]
    with pytest.raises(RowError, match="no user message"):
        single_request([{"role": "system", "content": "S"}], "last_user")


def test_every_turn_drops_the_sets_answers_and_carries_the_targets_own():
    inputs = turn_inputs(CONV)
    assert inputs == [[CONV[0], CONV[1]], [CONV[5]], [CONV[7], CONV[8]]]  # original answers and tool results dropped
    assert turn_inputs(CONV, max_turns=2) == inputs[:2]
    r1 = {"prompt_id": "c#t1", "status": "ok", "content": "mine 1", "reasoning": "thought 1", "finish_reason": "stop"}
    r2 = {"prompt_id": "c#t2", "status": "ok", "content": "mine 2", "reasoning": None, "finish_reason": "stop"}
    assert turn_request(inputs, []) == [CONV[0], CONV[1]]
    assert turn_request(inputs, [r1, r2]) == [
        CONV[0],
        CONV[1],
        {"role": "assistant", "content": "mine 1", "reasoning_content": "thought 1"},
        CONV[5],
        {"role": "assistant", "content": "mine 2"},
        CONV[7],
        CONV[8],
    ]
    with pytest.raises(IndexError):
        turn_request(inputs, [r1, r2, r1])
    assert turn_prompt_id("abc", 0) == "abc#t1"
    assert answer_message({"content": None}) == {"role": "assistant", "content": ""}


def test_a_chain_stops_after_an_answer_that_is_no_history():
    assert chain_end({"status": "ok", "finish_reason": "stop"}) is None
    assert chain_end({"status": "ok", "finish_reason": "length"}).reason == "previous_turn_cut"
    assert chain_end({"status": "ok", "finish_reason": "tool_calls", "tool_calls": [{}]}).reason == (
        "previous_turn_called_tools"
    )
    assert chain_end({"status": "skipped", "prompt_id": "x#t1"}).reason == "previous_turn_skipped"


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_the_order_is_a_seeded_permutation(n):
    order = RowOrder(n, seed=5)
    rows = [order.row(p) for p in range(n)]
    assert sorted(rows) == list(range(n))
    assert rows == [RowOrder(n, seed=5).row(p) for p in range(n)]
    if n > 16:
        assert rows != list(range(n)) and rows != [RowOrder(n, seed=6).row(p) for p in range(n)]
    shards = [order.shard_rows(k, 7) for k in range(-(-n // 7))]
    assert [r for s in shards for r in s] == rows  # shards partition the order
    assert RowOrder(n, shuffled=False).shard_rows(0, 3) == list(range(min(3, n)))
    with pytest.raises(IndexError):
        order.row(n)


def test_a_prefix_of_the_order_is_spread_over_the_set():
    """The first 10% of positions (what a token target might reach) fall evenly into the set's ten deciles."""
    n = 20_000
    order = RowOrder(n, seed=0)
    deciles = Counter(order.row(p) * 10 // n for p in range(n // 10))
    assert set(deciles) == set(range(10))
    assert max(deciles.values()) < 1.25 * (n // 100)  # within 25% of the expected 200 each
    # and no more clustered than a random sample: the mean gap between sorted picks is ~10
    picks = sorted(order.row(p) for p in range(n // 10))
    gaps = [b - a for a, b in itertools.pairwise(picks)]
    assert 9 < sum(gaps) / len(gaps) < 11
    assert max(gaps) < 200  # a uniform sample of 2,000 in 20,000 has a largest gap near 10·ln(2000) ≈ 76
