"""Lazy settlement of attempts whose bill is unknown: provisional charges, lookups with backoff, the
end of a run, the next run; against the real ledger, the recorded /generation bodies and the simulator."""

import asyncio
import json
from pathlib import Path

import pytest

from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.settlement import LazySettler, SettlementSchedule, settle_pending
from resources.simulator.faults import FaultConfig
from tests.generation.conftest import make_prompts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openrouter"
KNOWN = json.loads((FIXTURES / "account/generation.json").read_text())["data"]


class RecordedGeneration:
    """/generation as recorded: 404 (``generation_404.json``) for the first ``unknown_for`` lookups of the
    known id, then its body (``generation.json``); 404 for any other id."""

    def __init__(self, unknown_for: int) -> None:
        self.unknown_for = unknown_for
        self.calls: list[str] = []

    async def __call__(self, gen_id: str) -> dict | None:
        self.calls.append(gen_id)
        if gen_id == KNOWN["id"] and self.calls.count(gen_id) > self.unknown_for:
            return KNOWN
        return None


def _charge(led: BudgetLedger, settler: LazySettler, prompt: str, gen_id: str | None, usd: float = 0.05) -> None:
    (res,), _ = led.reserve_many([("B1", "B1/0", prompt, usd, 100)], budget_usd=10, token_budget=None)
    settler.charge(res, usd, gen_id)


async def test_lookups_back_off_until_generation_knows_the_attempt_then_resolve(tmp_path):
    led = BudgetLedger(tmp_path / "l.sqlite")
    lookup = RecordedGeneration(unknown_for=2)
    schedule = SettlementSchedule(first_lookup_s=10, backoff=3, max_interval_s=100, write_off_after_s=1000)
    settler = LazySettler(led, lookup, schedule)
    _charge(led, settler, "p0", KNOWN["id"])
    _charge(led, settler, "p1", "gen-never-indexed")
    _charge(led, settler, "p2", None)  # no id: final at once, never looked up
    t0 = max(a.charged_at for a in led.uncertain_attempts())
    assert led.totals().usd_spent == pytest.approx(0.15) and len(led.uncertain_attempts()) == 2
    assert await settler.round(t0) == 0  # both 404: next lookups 10 s later
    assert [a.next_lookup - t0 for a in led.uncertain_attempts()] == [pytest.approx(10), pytest.approx(10)]
    assert await settler.round(t0 + 5) == 0 and len(lookup.calls) == 2  # not due yet
    assert await settler.round(t0 + 10) == 0  # the second 404: 30 s later
    assert [a.next_lookup - t0 for a in led.uncertain_attempts()] == [pytest.approx(40), pytest.approx(40)]
    assert await settler.round(t0 + 40) == 1  # indexed at last
    assert led.totals().usd_spent == pytest.approx(0.05 + 0.05 + KNOWN["total_cost"])
    assert settler.tally.refunded_own_usd == pytest.approx(0.05 - KNOWN["total_cost"])
    (left,) = led.uncertain_attempts()
    assert left.generation_id == "gen-never-indexed" and left.lookups == 3
    assert left.next_lookup - t0 == pytest.approx(40 + 90)
    # Past write_off_after_s the provisional charge stands for good and lookups stop.
    assert await settler.round(t0 + 1001) == 0
    assert led.uncertain_attempts() == [] and settler.tally.written_off == 1
    assert led.totals().usd_spent == pytest.approx(0.10 + KNOWN["total_cost"])
    led.close()


async def test_settle_pending_waits_out_the_window_outside_a_run(tmp_path):
    led = BudgetLedger(tmp_path / "l.sqlite")
    settler = LazySettler(led, None)  # a run without lookups (no /generation): charges only
    _charge(led, settler, "p0", KNOWN["id"])
    tally = await settle_pending(led, RecordedGeneration(unknown_for=1), wait_s=5.0)
    assert tally.resolved == 1 and tally.pending_own == 0 and led.uncertain_attempts() == []
    assert led.totals().usd_spent == pytest.approx(KNOWN["total_cost"])
    led.close()


# --- through the engine against the simulator -----------------------------------------------------
def _books(harness):
    led = harness.ledger()
    try:
        return led.totals().usd_spent, led.uncertain_attempts(), led.spend_by_kind()
    finally:
        led.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_partial_answers_ending_in_an_error_are_settled_from_generation(harness, stream):
    harness.sim.set_faults(FaultConfig(finish_error=0.3))
    prompts = make_prompts(40, tag=f"pe{int(stream)}")
    report = harness.run(prompts, stream=stream, max_attempts=12, idle_s=2.0, timeout_s=5.0)
    assert report.complete and report.stop_reason == "completed", report.summary()
    assert report.errors["finish_error"] > 0
    stats = harness.sim.stats(0)
    partial = [g for g in harness.sim.stats()["generations"] if g["finish_reason"] == "error"]
    assert partial and all(g["billed"] for g in partial)  # the simulator bills output before an error
    spent, pending, kinds = _books(harness)
    # Not assumed free: each was settled from /generation by its id, to the cent.
    assert spent == pytest.approx(stats["billed_usd"], rel=1e-9) and pending == []
    assert kinds["uncertain_settled"] == pytest.approx(sum(g["cost"] for g in partial), rel=1e-9)
    assert report.uncertain_usd == pytest.approx(kinds["uncertain_settled"], rel=1e-9)


@pytest.mark.sim(generation_404_ms=600)
def test_attempts_generation_does_not_know_yet_are_settled_later_in_the_run(harness):
    harness.sim.set_faults(FaultConfig(truncated_json=0.3))
    report = harness.run(make_prompts(40, tag="late"), max_attempts=12)
    assert report.complete and report.errors["malformed"] > 0
    spent, pending, _ = _books(harness)
    assert pending == [] and report.uncertain_pending == 0
    assert spent == pytest.approx(harness.sim.stats(0)["billed_usd"], rel=1e-9)


@pytest.mark.sim(generation_404_ms=60_000)
def test_what_a_run_leaves_uncertain_is_charged_provisionally_and_settled_by_the_next(harness):
    harness.sim.set_faults(FaultConfig(truncated_json=0.3))
    prompts = make_prompts(30, tag="next")
    quick = SettlementSchedule(first_lookup_s=0.05, loop_interval_s=0.1, final_wait_s=0.3)
    first = harness.run(prompts, max_attempts=12, settlement=quick)
    assert first.complete and first.uncertain_pending > 0
    spent, pending, _ = _books(harness)
    billed = harness.sim.stats(0)["billed_usd"]
    assert len(pending) == first.uncertain_pending and spent > billed  # conservative meanwhile, never below
    assert all(a.partition == "T1/0000" and a.generation_id.startswith("gen-") for a in pending)
    harness.sim.set_generation_window(0)  # /generation has indexed them by the next run
    second = harness.run(prompts)
    assert second.requests == 0 and second.settled_earlier_usd == pytest.approx(spent - billed, rel=1e-6)
    spent2, pending2, _ = _books(harness)
    assert pending2 == [] and spent2 == pytest.approx(billed, rel=1e-9)


def test_a_request_goes_out_only_once_the_ledger_knows_it_may_be_billed(tmp_path):
    async def go() -> None:
        path = tmp_path / "l.sqlite"
        led = BudgetLedger(path)
        settler = LazySettler(led, None, SettlementSchedule(note_flush_s=0.01))
        g, _ = led.reserve_many(
            [("B1", "B1/0", f"p{i}", 0.30, 100) for i in range(3)], budget_usd=10, token_budget=None
        )
        loop = asyncio.create_task(settler.run())
        try:
            # Two sends wait for one flush together; the third reservation stays reserved ahead.
            await asyncio.wait_for(asyncio.gather(settler.sending(g[0]), settler.sending(g[1])), 5)
            settler.note(g[0], "gen-sent-0")
            await asyncio.sleep(0.05)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
        led.close()  # like a kill: the open reservations are orphaned
        after = BudgetLedger(path)
        try:
            assert after.totals().usd_spent == pytest.approx(0.60)  # g0 provisional, g1 worst case, g2 released
            assert [(a.generation_id, a.prompt_id) for a in after.uncertain_attempts()] == [("gen-sent-0", "p0")]
        finally:
            after.close()

    asyncio.run(go())


def test_settler_loop_survives_a_failing_lookup(tmp_path):
    async def broken(_: str) -> dict | None:
        raise ConnectionError("no route to host")

    async def go() -> int:
        led = BudgetLedger(tmp_path / "l.sqlite")
        settler = LazySettler(led, broken, SettlementSchedule(first_lookup_s=1.0))
        _charge(led, settler, "p0", KNOWN["id"])
        resolved = await settler.round()
        left = led.uncertain_attempts()
        led.close()
        assert left[0].lookups == 1  # counted and rescheduled, the charge stands
        return resolved

    assert asyncio.run(go()) == 0
