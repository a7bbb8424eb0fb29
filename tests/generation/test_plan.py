"""The plan's maths on its own: projections checked against simulated runs, proposals against their budget,
and what generation does with each decision."""

import math
from dataclasses import replace

import numpy as np
import pytest

from eagle_assets.generation.admission import Moments
from eagle_assets.generation.journal import Journal
from eagle_assets.generation.plan import (
    DatasetInput,
    EndpointPrice,
    LengthStats,
    Money,
    PlanInputError,
    PlanRefusal,
    choose_length_stats,
    make_plan,
    plan_gate,
    price_model,
    project_dataset,
)
from eagle_assets.generation.plan_inputs import journal_facts, latency_estimate

MAX_TOKENS = 1638
ENDPOINTS = [
    EndpointPrice("Chutes", 0.45e-6, 2.00e-6),
    EndpointPrice("Moonshot AI", 0.60e-6, 2.50e-6),
    EndpointPrice("Parasail", 0.55e-6, 2.80e-6),
]
PRICES = price_model(ENDPOINTS)


def lengths(rng: np.random.Generator, size: int, mean: float = 300.0, sigma: float = 0.6) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2
    return np.minimum(np.maximum(rng.lognormal(mu, sigma, size), 8), MAX_TOKENS).astype(np.int64)


def dataset(name: str, target: int, pending: int, stats: LengthStats, rng: np.random.Generator) -> DatasetInput:
    prompts = rng.integers(20, 400, pending).tolist()
    return DatasetInput(name, target, 0, 0.0, pending, prompts, stats, 2.0, "test")


def money(available: float) -> Money:
    return Money(available, 0.0, 0.0, None, "none", 0.0)


def run_to_target(answer_lengths: np.ndarray, prompt_tokens: list[int], target: int) -> tuple[int, int, int]:
    """What a run does: answers in order until the target is reached or the prompts run out."""
    produced = np.cumsum(answer_lengths)
    k = int(np.searchsorted(produced, target)) + 1 if produced[-1] >= target else len(answer_lengths)
    return k, int(produced[k - 1]), int(sum(prompt_tokens[:k]))


@pytest.mark.parametrize("target", [150_000, 10**9])  # the target ends it / the prompts run out first
def test_projection_matches_simulated_runs_and_its_interval_covers_them(target):
    """Each trial: a pilot of 200 answers, the plan made from it, then the run itself (fresh draws)."""
    rng = np.random.default_rng(3)
    prompts = rng.integers(20, 400, 1500).tolist()
    inside, errors, trials = 0, [], 300
    for _ in range(trials):
        stats = LengthStats.measured(Moments.of(lengths(rng, 200)), "a pilot of 200")
        inp = DatasetInput("B1", target, 0, 0.0, 1500, prompts, stats, 2.0, "test")
        proj = project_dataset(inp, PRICES, in_flight=2000)
        assert proj.bound == ("target" if target == 150_000 else "prompts")
        k, tokens, prompt = run_to_target(lengths(rng, 1500), prompts, target)
        usd = prompt * PRICES.prompt + tokens * PRICES.completion
        inside += (
            proj.usd.low <= usd <= proj.usd.high
            and proj.output_tokens.low <= tokens <= proj.output_tokens.high
            and proj.requests.low - 1 <= k <= proj.requests.high + 1
            and proj.prompt_tokens.low - 400 <= prompt <= proj.prompt_tokens.high + 400
        )
        errors.append(abs(usd / proj.usd.expected - 1))
        assert proj.usd_dearest > proj.usd.high  # every request at Parasail's price would cost more
    assert inside >= 0.9 * trials  # a 95% interval, of the dollars, tokens, requests and prompt tokens at once
    assert inside < trials or target > 10**8  # and not so wide that it never misses a requests count
    if target == 150_000:  # bound by the target: tokens are the target, the error is in the prompt share only
        assert max(errors) < 0.03
    else:  # bound by the prompts: the error is the pilot's (CV / sqrt(200) ≈ 4.5%, one sigma)
        assert float(np.median(errors)) < 0.05


def test_projection_from_a_prior_is_wide_and_says_so():
    rng = np.random.default_rng(4)
    prior = LengthStats.prior(3000.0, 2000.0, 0.5)
    proj = project_dataset(dataset("B2", 10**9, 400, prior, rng), PRICES, in_flight=2000)
    assert proj.output_tokens.high > 2 * proj.output_tokens.low
    assert "configured prior" in proj.lengths_source and "± 50%" in proj.lengths_source


def test_wall_time_at_the_in_flight_cap():
    rng = np.random.default_rng(5)
    stats = LengthStats(300.0, 200.0, 1.0, 5000, "x")
    inp = replace(dataset("B3", 1_000_000, 10_000, stats, rng), latency_s=60.0)
    proj = project_dataset(inp, PRICES, in_flight=2000)
    assert proj.requests.expected == pytest.approx(1_000_000 / 300)
    assert proj.wall_s == pytest.approx(60.0 * (1_000_000 / 300) / 2000)
    assert project_dataset(inp, PRICES, in_flight=20_000).wall_s == 60.0  # one wave at most
    plan = make_plan([inp, replace(inp, name="B4")], PRICES, money(1e6), 2000)
    assert plan.wall_s == pytest.approx(2 * proj.wall_s)  # the cap is shared


def test_prices_follow_the_routing_mix_among_allowed_endpoints():
    assert PRICES.completion == 2.00e-6 and PRICES.max_completion == 2.80e-6 and "Chutes" in PRICES.source
    mixed = price_model(ENDPOINTS, {"Chutes": 300, "Moonshot AI": 100, "Fireworks": 999})  # Fireworks: not allowed
    assert mixed.completion == pytest.approx((3 * 2.00e-6 + 2.50e-6) / 4)
    assert "Fireworks" not in mixed.source
    with pytest.raises(PlanInputError, match="no allowed endpoint"):
        price_model([])


def _eight(rng: np.random.Generator, target: int) -> list[DatasetInput]:
    stats = LengthStats.measured(Moments.of(lengths(rng, 2000)), "x")
    return [dataset(f"B{i}", target * (1 + i % 3), 20_000, stats, rng) for i in range(1, 9)]


@pytest.mark.parametrize("rule", ["equal", "proportional"])
def test_proposals_fit_the_money_and_use_it(rule):
    rng = np.random.default_rng(6)
    inputs = _eight(rng, 600_000)
    full = make_plan(inputs, PRICES, money(1e6), 2000)
    assert full.fits and not full.proposals
    plan = make_plan(inputs, PRICES, money(0.5 * full.total_usd.high), 2000, "scale_down", rule)
    assert not plan.fits and plan.decision == "scale_down"
    targets = plan.targets()
    scaled = make_plan([replace(i, token_target=targets[i.name]) for i in inputs], PRICES, plan.money, 2000)
    assert scaled.fits
    assert scaled.total_usd.high >= 0.99 * plan.money.available_usd  # the money is used, not left idle
    requested = {i.name: i.token_target for i in inputs}
    if rule == "proportional":
        ratios = {targets[n] / requested[n] for n in requested}
        assert max(ratios) - min(ratios) < 1e-3
    else:
        # One level for all, or what a dataset asked for if that is less (water-filling).
        level = max(targets.values())
        assert all(targets[n] == min(requested[n], level) for n in requested)
        assert level < max(requested.values())
    assert all(targets[n] <= requested[n] for n in requested)


def test_a_plan_that_does_not_fit_each_choice_and_the_gate():
    rng = np.random.default_rng(7)
    inputs = _eight(rng, 600_000)
    need = make_plan(inputs, PRICES, money(1e6), 2000).total_usd.high
    docs = {c: make_plan(inputs, PRICES, money(need / 3), 2000, c).to_json() for c in ("wait", "scale_down", "proceed")}
    requested = inputs[0].token_target
    with pytest.raises(PlanRefusal, match="does not fit and says wait") as err:
        plan_gate(docs["wait"], "B1", requested)
    assert "proportional: B1" in str(err.value) and "on_overrun: scale_down" in str(err.value)
    down = plan_gate(docs["scale_down"], "B1", requested)
    assert 0 < down.token_target < requested and "scaled down" in down.note
    assert plan_gate(docs["proceed"], "B1", requested).token_target == requested
    assert plan_gate(None, "B1", requested).note.startswith("no generation plan recorded")
    with pytest.raises(PlanRefusal, match="stale"):
        plan_gate(docs["proceed"], "B1", requested + 1)  # the dataset's target changed since the plan
    with pytest.raises(PlanRefusal, match="stale"):
        plan_gate(docs["proceed"], "B9", requested)
    fits = make_plan(inputs, PRICES, money(10 * need), 2000, "wait").to_json()
    assert fits["decision"] == "fits" and plan_gate(fits, "B1", requested).token_target == requested


def test_length_statistics_come_from_the_dataset_then_its_model_then_the_prior():
    rng = np.random.default_rng(8)
    prior = LengthStats.prior(3000.0, 2000.0, 0.5)
    big, small = Moments.of(lengths(rng, 500)), Moments.of(lengths(rng, 50, mean=900))
    ledger = {"B1": ("m", big), "B2": ("m", small), "B3": ("other", big)}
    assert "B1's answers" in choose_length_stats("B1", "m", ledger, 200, prior).source
    pooled = choose_length_stats("B2", "m", ledger, 200, prior)  # its own 50 are too few: B1's, same model
    assert "other datasets of m (B1: 500" in pooled.source and pooled.mean == pytest.approx(big.mean)
    assert choose_length_stats("B4", "x", ledger, 200, prior) is prior
    assert "pilot of 50" in choose_length_stats("B2", "m", ledger, 50, prior, pilot=50).source
    assert choose_length_stats("B3", "m", ledger, 200, prior).source.startswith("other datasets")  # B3: other model


def test_journal_facts_and_latency(tmp_path):
    with Journal(tmp_path / "0000.journal") as j:
        j.append_many(
            [{"prompt_id": f"p{i}", "status": "ok", "latency_s": 1.0 + i % 3, "provider": "Chutes"} for i in range(30)]
            + [{"prompt_id": "s1", "status": "skipped"}]
        )
    facts = journal_facts([tmp_path / "0000.journal", tmp_path / "missing.journal"])
    assert len(facts.done) == 31 and facts.providers == {"Chutes": 30}
    mean, source = latency_estimate(facts, facts, 90.0, "B1")
    assert mean == pytest.approx(sum(1.0 + i % 3 for i in range(30)) / 30) and "B1's 30 answers" in source
    assert latency_estimate(journal_facts([]), journal_facts([]), 90.0, "B1") == (
        90.0,
        "configured prior: 90 s per answer",
    )


def test_bad_input_is_refused_by_name():
    rng = np.random.default_rng(9)
    stats = LengthStats(300.0, 200.0, 1.0, 5000, "x")
    with pytest.raises(PlanInputError, match="B1: 10 prompts pending but no prompt token counts"):
        DatasetInput("B1", 100, 0, 0.0, 10, [], stats, 1.0, "x")
    with pytest.raises(PlanInputError, match="on_overrun"):
        make_plan([dataset("B1", 100, 10, stats, rng)], PRICES, money(1.0), 10, "hope")
    with pytest.raises(PlanInputError, match="twice"):
        make_plan([dataset("B1", 100, 10, stats, rng)] * 2, PRICES, money(1.0), 10)


def test_the_queue_counts_every_turn_and_prices_later_turns_with_the_answers_they_carry(tmp_path):
    """An every_turn dataset: each turn is a request; a later turn's prompt carries the earlier answers."""
    import orjson

    from eagle_assets.datasets.config import DatasetSpec
    from eagle_assets.generation.plan_queue import dataset_queue

    rows = []
    for i in range(6):
        msgs = []
        for t in range(3):
            msgs += [
                {"role": "user", "content": f"conversation {i}, question {t}: why?"},
                {"role": "assistant", "content": "the set's answer, dropped"},
            ]
        rows.append({"id": f"c{i}", "messages": msgs})
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    spec = DatasetSpec("MT", path, 10**9, 4, regenerate="every_turn")
    journals = tmp_path / "journal"
    with Journal(journals / "MT" / "0000.journal") as j:  # one first turn is done already
        j.append_many([{"prompt_id": "c0#t1", "status": "ok", "latency_s": 1.0, "provider": "Chutes"}])
    queue = dataset_queue(spec, tmp_path / "cache", lambda d, s: journals / d / f"{s}.journal")
    assert queue.total_requests == 18 and queue.pending == 17
    requests = list(queue.requests())
    assert len(requests) == 17 and "c0#t1" not in {r.prompt.prompt_id for r in requests}
    assert sum(r.earlier_turns == 0 for r in requests) == 5
    for shard in ("0000", "0001"):  # shard by shard; within one, every first turn before any second turn
        turns = [r.earlier_turns for r in requests if r.shard == shard]
        assert turns == sorted(turns) and len(turns) in ((11, 12) if shard == "0000" else (5, 6))
    flat = queue.prompt_tokens(17, lambda p: 10 * len(p.messages), mean_answer=0.0)
    carried = queue.prompt_tokens(17, lambda p: 10 * len(p.messages), mean_answer=300.0)
    assert [c - f for c, f in zip(carried, flat, strict=True)] == [300 * r.earlier_turns for r in requests]
    assert flat[-1] == 10 * 5  # a third turn: two earlier turns (question + answer each) and its own question
    pilot = queue.pilot(7)
    assert sum(chains.total for _, _, chains in pilot if chains is not None) >= 7  # whole conversations


def test_where_a_token_target_really_stops_matches_the_runner(harness):
    """The real runner against the simulator: a 30,000-token target with max_tokens 256 (117 of them) stops short
    of it by the overshoot guard's margin, where ``token_target_stop`` says."""
    from eagle_assets.generation.ledger import BudgetLedger
    from eagle_assets.generation.plan import token_target_stop
    from tests.generation.conftest import make_prompts

    target = 30_000
    report = harness.run(make_prompts(2000), token_budget=target, max_tokens=256, max_in_flight=64)
    assert report.stop_reason == "tokens", report.summary()
    led = BudgetLedger(harness.ledger_path)
    try:
        moments, produced = led.length_moments("T1"), led.totals("T1").tokens_spent
    finally:
        led.close()
    stop = token_target_stop(target, LengthStats.measured(moments, "run"), 256, 64, moments.n)
    assert stop.low < 0.99 * target  # the guard's margin is real at this ratio ...
    assert stop.low <= produced <= stop.high  # ... and the runner stops inside it
    assert abs(produced - stop.expected) < 0.04 * target
