"""Admission through the real runner: the simulator over HTTP on 127.0.0.1, a real SQLite ledger, real processes.

How many requests the *simulator* holds at once depends on this machine's speed: on a loaded 2-core box the
client's loop is so slow that answers are back at the simulator long before the client has read them, and the
simulator never sees a second wave on top of the first (its peak stayed at 584 where the ledger held over 1,000
open). What admission decided is in the ledger: the tests read it there (``AdmissionRecorder``), and keep the
simulator's peak only as an upper bound, which no timing can break.
"""

import asyncio
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eagle_assets.generation.admission import AdmissionPolicy
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.retry_policy import RetryPolicy
from eagle_assets.generation.runner import GenerationSettings, PartitionJob, PartitionReport, PartitionRunner
from resources.openrouter.client import OpenRouterClient
from resources.openrouter.providers import ProviderPolicy, ProviderTable, parse_endpoints
from resources.openrouter.secret import ApiKey
from resources.simulator.config import LatencyConfig, SimulatorConfig
from resources.simulator.server import endpoints_payload
from tests.generation.conftest import MODEL, make_prompts, sim_config
from tests.generation.forked import CTX, process
from tests.simulator.harness import run_simulator_in_thread

MAX_TOKENS = 1024


class AdmissionRecorder(BudgetLedger):
    """The real ledger, which notes after every granted reservation what it then holds open.

    ``peak_open``: requests of this dataset; ``peak_tokens_committed``: tokens produced + ``max_tokens`` of every
    open request (the token target's worst case). These are the ledger's own decisions, the same on a fast
    machine and a slow one.
    """

    def __init__(self, path: Path, dataset: str = "T1") -> None:
        super().__init__(path)
        self.dataset = dataset
        self.peak_open = 0
        self.peak_tokens_committed = 0

    def reserve_many(self, requests: Any, **kwargs: Any) -> Any:
        granted, denial = super().reserve_many(requests, **kwargs)
        if granted:
            t = self.totals(self.dataset)
            self.peak_open = max(self.peak_open, t.in_flight)
            self.peak_tokens_committed = max(self.peak_tokens_committed, t.tokens_spent + t.tokens_reserved)
        return granted, denial


class Recorded:
    """A ledger factory for ``run_partition`` that keeps the ``AdmissionRecorder`` it made, to read afterwards."""

    def __init__(self) -> None:
        self.ledger: AdmissionRecorder | None = None

    def __call__(self, path: Path) -> BudgetLedger:
        self.ledger = AdmissionRecorder(path)
        return self.ledger


def run_partition(
    base_url: str,
    tmp: Path,
    prompts: list,
    *,
    dataset: str = "T1",
    shard: str = "0000",
    budget: float = 100.0,
    token_budget: int = 10**9,
    max_in_flight: int = 64,
    max_tokens: int = MAX_TOKENS,
    policy: AdmissionPolicy | None = None,
    key_poll_s: float = 0.2,
    tail_fraction: float = 0.1,
    ledger_factory: Callable[[Path], BudgetLedger] = BudgetLedger,
) -> PartitionReport:
    """One partition through the real runner; a module-level function, so a child process can run it."""
    settings = GenerationSettings(
        model=MODEL,
        max_tokens=max_tokens,
        budget_usd=budget,
        max_in_flight=max_in_flight,
        retry=RetryPolicy(max_attempts=8, base_delay_s=0.01, max_delay_s=0.1, retry_after_cap_s=0.2),
        progress_interval_s=0.5,
        key_poll_interval_s=key_poll_s,
        commit_interval_s=0.01,
        admission=policy or AdmissionPolicy(),
        tail_fraction=tail_fraction,
    )
    job = PartitionJob(dataset, shard, prompts, token_budget, tmp / "journal" / dataset / f"{shard}.journal")

    async def go() -> PartitionReport:
        ledger = ledger_factory(tmp / "ledger.sqlite")
        try:
            async with OpenRouterClient(base_url, ApiKey("sk-test"), max_connections=max_in_flight) as client:
                table = ProviderTable(parse_endpoints(await client.endpoints(MODEL)), ProviderPolicy())
                runner = PartitionRunner(job, client, ledger, table, settings, lambda p: 24, emit=lambda s: None)
                return await runner.run()
        finally:
            ledger.close()

    return asyncio.run(go())


def prices(cfg: SimulatorConfig) -> ProviderTable:
    """The simulator's endpoints as the runner sees them (allowed providers, dearest prices)."""
    return ProviderTable(parse_endpoints(endpoints_payload(cfg)), ProviderPolicy())


def journal(tmp: Path, dataset: str = "T1", shard: str = "0000") -> list[dict[str, Any]]:
    return read_records(tmp / "journal" / dataset / f"{shard}.journal")


def totals(tmp: Path, dataset: str | None = None):
    led = BudgetLedger(tmp / "ledger.sqlite")
    try:
        return led.totals(dataset)
    finally:
        led.close()


def assert_consistent(tmp: Path, stats: dict[str, Any], dataset: str = "T1") -> list[dict[str, Any]]:
    """Every billed answer journaled once, nothing held afterwards, the ledger's spend = the simulator's bill."""
    recs = journal(tmp, dataset)
    ids = [r["prompt_id"] for r in recs]
    assert len(ids) == len(set(ids))
    assert stats["hashes_billed_more_than_once"] == []
    t = totals(tmp)
    assert t.usd_reserved == 0 and t.in_flight == 0
    assert t.usd_spent == pytest.approx(stats["billed_usd"], rel=1e-9)
    return recs


def test_hard_mode_without_a_tail_cut_spends_up_to_the_last_worst_case(tmp_path):
    cfg = sim_config(latency=LatencyConfig.fixed(0.02), mean_completion_tokens=60)
    budget = 0.1
    with run_simulator_in_thread(cfg) as sim:
        report = run_partition(
            sim.base_url,
            tmp_path,
            make_prompts(2000),
            budget=budget,
            max_in_flight=300,
            policy=AdmissionPolicy(mode="hard"),
            tail_fraction=0.0,
        )
        stats = sim.stats(0)
    assert report.stop_reason == "budget", report.summary()
    assert_consistent(tmp_path, stats)
    table = prices(cfg)  # max_tokens and the prompt estimate (24 tokens + margin) at the dearest allowed prices
    worst = MAX_TOKENS * table.max_completion_price + (24 * 1.1 + 16) * table.max_prompt_price
    spent = totals(tmp_path).usd_spent
    assert budget - worst <= spent <= budget  # stopped only when one more worst case did not fit


@pytest.mark.parametrize("mode", ["statistical", "hard"])
def test_dollar_budget_statistical_keeps_the_cap_busy_hard_holds_worst_cases(tmp_path, mode):
    # Statistical: slow enough answers that 300 in flight is bound by admission, not by this machine's CPU.
    # Hard: its worst-case waves shrink by ~13% each, so many short ones.
    latency = 0.3 if mode == "statistical" else 0.05
    cfg = sim_config(latency=LatencyConfig.fixed(latency), mean_completion_tokens=60)
    budget, cap = 0.3, 300
    recorded = Recorded()
    with run_simulator_in_thread(cfg) as sim:
        report = run_partition(
            sim.base_url,
            tmp_path,
            make_prompts(4000),
            budget=budget,
            max_in_flight=cap,
            policy=AdmissionPolicy(mode=mode),
            ledger_factory=recorded,
        )
        stats = sim.stats(0)
    assert report.stop_reason == "budget", report.summary()
    assert_consistent(tmp_path, stats)
    spent = totals(tmp_path).usd_spent
    assert spent <= budget and stats["billed_usd"] <= budget
    worst = MAX_TOKENS * prices(cfg).max_completion_price  # the dearest allowed completion price
    assert recorded.ledger is not None
    admitted = recorded.ledger.peak_open  # the most requests the ledger held open at once
    assert stats["peak_in_flight"] <= admitted  # the simulator never sees more than was admitted
    if mode == "hard":
        assert admitted <= budget // worst  # never more than the worst cases fit
    else:
        # ~300 open (the cap), though 300 worst cases would be $0.86 of the $0.30
        assert admitted >= 0.9 * cap > 2 * (budget // worst)
        # It stops when what is left could not pay for a tail batch (10% of the cap) once the requests in flight
        # settle: here, with a budget only ~100 worst cases deep, that is up to 30 worst cases ($0.09).
        assert spent >= budget - 30 * worst


def test_token_target_admits_past_max_tokens_and_bounds_the_overshoot(tmp_path):
    cfg = sim_config(latency=LatencyConfig.fixed(0.3), mean_completion_tokens=60)
    # max_tokens 256 against answers of ~100 tokens; the tolerance (1% of the budget) is ~6 max_tokens, as in
    # production (10M against 16,384).
    budget, max_tokens = 150_000, 256
    policy = AdmissionPolicy(min_samples=50)
    recorded = Recorded()
    with run_simulator_in_thread(cfg) as sim:
        report = run_partition(
            sim.base_url,
            tmp_path,
            make_prompts(3000),
            token_budget=budget,
            max_in_flight=1000,
            max_tokens=max_tokens,
            policy=policy,
            ledger_factory=recorded,
        )
        stats = sim.stats(0)
    assert report.stop_reason == "tokens", report.summary()
    recs = assert_consistent(tmp_path, stats)
    produced = sum(r["completion_tokens"] for r in recs if r["status"] == "ok")
    assert produced == totals(tmp_path, "T1").tokens_spent == report.output_tokens
    assert budget * 0.95 <= produced <= budget * (1 + policy.token_overshoot)
    # Once answers were measured, the ledger held more requests open than max_tokens alone would ever allow
    # (budget // max_tokens = 585), committing more max_tokens than the budget had left.
    assert recorded.ledger is not None
    assert recorded.ledger.peak_open > budget // max_tokens
    assert recorded.ledger.peak_tokens_committed > budget
    assert stats["peak_in_flight"] <= recorded.ledger.peak_open


def test_credits_402_stops_admission_and_in_flight_answers_are_journaled(tmp_path):
    """The key's balance drops behind the ledger's back (another spender): the 402s stop the run, resumably."""
    cfg = sim_config(latency=LatencyConfig.fixed(0.3), mean_completion_tokens=60, credits=50.0)
    # Enough that the 402s come well before the end (they stop the run at ~200-400 answered): the rest is the resume's.
    prompts = make_prompts(1000)
    with run_simulator_in_thread(cfg) as sim:

        def other_spender() -> None:
            # Once the first answers are billed (~200 requests then in flight), not after a fixed time: on a
            # loaded machine nothing may have been billed yet after half a second.
            deadline = time.monotonic() + 120
            while sim.call(lambda: sim.state.stats.billed_requests) < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            sim.call(lambda: setattr(sim.state.account, "usage", sim.state.account.limit - 0.001))

        spender = threading.Thread(target=other_spender)
        spender.start()
        report = run_partition(sim.base_url, tmp_path, prompts, max_in_flight=200, key_poll_s=3600)
        spender.join()
        stats = sim.stats(None)
        assert report.stop_reason == "credits", report.summary()
        assert report.errors["credits_exhausted"] >= 1
        recs = assert_consistent(tmp_path, stats)
        # Every request the simulator accepted and billed was journaled: the in-flight ones finished.
        billed = [g for g in stats["generations"] if g["cost"] > 0]
        assert len([r for r in recs if r["status"] == "ok"]) == len(billed) > 0
        assert 0 < report.done < len(prompts)
        # After a top-up the same partition resumes and completes, nothing bought twice.
        sim.topup(100.0)
        report2 = run_partition(sim.base_url, tmp_path, prompts, max_in_flight=200)
        assert report2.stop_reason == "completed" and report2.already_done == report.done
        assert_consistent(tmp_path, sim.stats(0))
        assert {r["prompt_id"] for r in journal(tmp_path)} == {p.prompt_id for p in prompts}


class SharingRecorder(AdmissionRecorder):
    """The real ledger, which at its first lease puts what it wants on record and then waits until the other
    process has done the same, before either admits anything: the two then run side by side by construction,
    not by how fast each was started. It notes every limit the ledger granted while the other wanted slots, with
    how many the other wanted."""

    def __init__(self, path: Path, dataset: str, both_declared: Any) -> None:
        super().__init__(path, dataset)
        self.both_declared = both_declared
        self.declared = False
        self.limits_while_other_wanted: list[tuple[int, int]] = []  # (limit granted, slots the other wanted)

    def lease_slots(self, want: int, in_use: int, capacity: int) -> int:
        if not self.declared:
            super().lease_slots(want, in_use, capacity)  # on record, its limit unused: nothing admitted yet
            self.both_declared.wait(timeout=120)
            self.declared = True
        limit = super().lease_slots(want, in_use, capacity)
        with self.db.read() as cur:
            row = cur.execute("SELECT COALESCE(SUM(want), 0) FROM slots WHERE owner != ?", (self.owner,)).fetchone()
        if row[0] > 0:
            self.limits_while_other_wanted.append((limit, int(row[0])))
        return limit


def _partition_process(base_url: str, tmp: str, dataset: str, n: int, cap: int, both_declared, out) -> None:
    made: list[SharingRecorder] = []

    def factory(path: Path) -> BudgetLedger:
        made.append(SharingRecorder(path, dataset, both_declared))
        return made[-1]

    try:
        report = run_partition(
            base_url,
            Path(tmp),
            make_prompts(n, tag=dataset),
            dataset=dataset,
            max_in_flight=cap,
            ledger_factory=factory,
        )
    except BaseException:
        out.put((dataset, traceback.format_exc(), 0, []))
        raise
    out.put((dataset, report.stop_reason, report.done, made[0].limits_while_other_wanted))


def test_two_processes_share_one_account_wide_in_flight_cap(tmp_path):
    cap = 60
    cfg = sim_config(latency=LatencyConfig.fixed(0.2), mean_completion_tokens=40)
    out = CTX.Queue()
    both_declared = CTX.Barrier(2)
    with run_simulator_in_thread(cfg) as sim:
        procs = [
            process(_partition_process, sim.base_url, str(tmp_path), d, 600, cap, both_declared, out)
            for d in ("D1", "D2")
        ]
        for p in procs:
            p.start()
        results = {r[0]: r for r in (out.get(timeout=180) for _ in procs)}
        for p in procs:
            p.join(30)
        stats = sim.stats(0)
    assert all(r[1] == "completed" and r[2] == 600 for r in results.values()), results
    # Each process was allowed 60 on its own; together they never had more than 60 at the simulator ...
    assert stats["peak_in_flight"] <= cap
    # ... and, both on record before either admitted, the ledger split the cap between them: every limit it
    # granted one while the other wanted at least half was at most half, and each was granted its full half
    # (neither starved by the other). These are the ledger's decisions, not how fast either process ran.
    half = cap // 2
    for dataset, _, _, limits in results.values():
        contested = [limit for limit, other in limits if other >= half]
        assert contested and max(contested) == half, (dataset, limits)
    t = totals(tmp_path)
    assert t.in_flight == 0 and t.usd_reserved == 0


def test_token_shortfall_ends_the_run_instead_of_a_last_round_for_the_rest(tmp_path):
    """With ``token_shortfall`` the run ends once less than that share of the target is left in expectation,
    instead of a last round of requests for it; without, it goes on to within 1% of the target."""
    cfg = sim_config(latency=LatencyConfig.fixed(0.3), mean_completion_tokens=60)
    budget, max_tokens = 150_000, 256
    produced: dict[float, int] = {}
    with run_simulator_in_thread(cfg) as sim:
        for shortfall in (0.0, 0.08):
            work = tmp_path / f"short-{shortfall}"
            policy = AdmissionPolicy(min_samples=50, token_shortfall=shortfall)
            report = run_partition(
                sim.base_url,
                work,
                make_prompts(3000),
                token_budget=budget,
                max_in_flight=1000,
                max_tokens=max_tokens,
                policy=policy,
            )
            assert report.stop_reason == "tokens", report.summary()
            assert ("token_shortfall" in report.stop_detail) == (shortfall > 0)
            produced[shortfall] = totals(work, "T1").tokens_spent
    assert budget * 0.97 <= produced[0.0] <= budget * 1.01
    # It ended short of the target by about the shortfall (never over), and short of the run without it.
    assert budget * (1 - 0.08 - 0.03) <= produced[0.08] < produced[0.0]
    assert produced[0.08] <= budget * 1.01


def test_token_shortfall_is_a_share_of_the_target():
    with pytest.raises(ValueError, match="token_shortfall"):
        AdmissionPolicy(token_shortfall=1.0)
    with pytest.raises(ValueError, match="token_shortfall"):
        AdmissionPolicy(token_shortfall=-0.1)


def test_reservations_ahead_of_the_workers_never_pass_their_share(tmp_path):
    """Prompts reserved and not yet sent hold budget another host could be spending: with a share of 16 slots,
    a run holds 16 running, up to 16 ready and the answers awaiting their commit, not four chunks (256) ahead."""
    cfg = sim_config(latency=LatencyConfig.fixed(0.05), mean_completion_tokens=30)
    recorded = Recorded()
    with run_simulator_in_thread(cfg) as sim:
        report = run_partition(
            sim.base_url, tmp_path, make_prompts(400), max_in_flight=16, max_tokens=64, ledger_factory=recorded
        )
    assert report.stop_reason == "completed", report.summary()
    assert recorded.ledger is not None
    assert 16 <= recorded.ledger.peak_open <= 64  # 280 when four chunks were reserved ahead of any share
