"""The generation plan and the account's observations on a real Dagster instance, against the simulator.

A plan that fits, then generation, then the account's observation history holding the ledger's numbers;
and a plan that does not fit under each of its three choices (wait, scale down, proceed).
"""

import json

import dagster as dg
import pytest

from eagle_assets.assets.account import openrouter_account
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.plan import build_plan_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.keys import ACCOUNT_KEY
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.generation.test_dagster_generation import resource_for, write_prompts
from tests.simulator.harness import run_simulator_in_thread


@pytest.fixture
def forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def plan_config(**kw) -> dict:
    return {"ops": {"generation_plan": {"config": {"pilot_prompts": 20, **kw}}}}


def ledger_totals(forge_home, dataset: str | None = None):
    led = BudgetLedger(forge_home / "state" / "ledger.sqlite")
    try:
        return led.totals(dataset)
    finally:
        led.close()


def sim_config(**kw) -> SimulatorConfig:
    return SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=50, tokenizer_dir=resolve_tokenizer_dir(), **kw
    )


def test_a_plan_that_fits_then_generation_and_the_account_observed_with_the_ledgers_numbers(tmp_path, forge_home):
    spec = DatasetSpec("P1", write_prompts(tmp_path / "p1.jsonl", 80, tag="f"), 10**9, 80)
    plan, gen = build_plan_asset([spec]), build_generated_asset(spec)
    with run_simulator_in_thread(sim_config()) as sim, dg.instance_for_test() as instance:
        resources = {"openrouter": resource_for(sim.base_url, budget_usd=10.0), "duckdb": DuckDBResource()}
        result = dg.materialize([plan], instance=instance, resources=resources, run_config=plan_config())
        assert result.success
        md = result.asset_materializations_for_node("generation_plan")[0].metadata
        assert md["decision"].value == "fits" and md["fits"].value is True
        table = md["plan"].value
        assert "P1's answers in the ledger (pilot of 20, 20 in all)" in table
        assert "routing of 20 answers so far: Chutes 100%" in table
        assert md["cost_plot"].value.startswith("![generation plan](data:image/png;base64,")
        # The pilot's answers are part of the data: partition 0000's journal holds them, generation skips them.
        assert len(read_records(forge_home / "journal" / "P1" / "0000.journal")) == 20
        doc = json.loads((forge_home / "state" / "generation_plan.json").read_text())
        (projected,) = doc["datasets"]
        assert projected["bound"] == "prompts" and projected["requests"]["expected"] == 60

        before = ledger_totals(forge_home)
        run = dg.materialize([gen], partition_key="0000", instance=instance, resources=resources)
        assert run.success
        gmd = run.asset_materializations_for_node(gen.node_def.name)[0].metadata
        assert gmd["new_this_run"].value == 60  # the pilot's 20 were not bought twice
        assert "$/M output tokens" in gmd["providers"].value and gmd["usd_per_m_output_tokens"].value > 0
        totals = ledger_totals(forge_home)
        # What the plan projected against what the run then produced and spent (60 answers: a wide interval).
        produced, spent = totals.tokens_spent - before.tokens_spent, totals.usd_spent - before.usd_spent
        assert projected["output_tokens"]["low"] <= produced <= projected["output_tokens"]["high"]
        assert projected["usd"]["low"] <= spent <= projected["usd"]["high"]

        # The account's observations: the run left some, the last one with the ledger's final numbers.
        records = instance.fetch_observations(ACCOUNT_KEY, limit=100).records
        assert len(records) >= 2  # at least at the start and the end of the generation run
        last = records[0].asset_observation.metadata
        assert last["spent_usd"].value == pytest.approx(totals.usd_spent, abs=1e-6)
        assert last["output_tokens"].value == totals.tokens_spent and last["in_flight"].value == 0
        assert last["remaining_credit_usd"].value == pytest.approx(sim.stats(0)["credits"]["remaining"], abs=1e-6)
        assert last["observed_by"].value == "generation P1/0000"
        # The source asset's own observe step (the UI's "Observe sources") reads the same numbers.
        observed = dg.materialize([openrouter_account], instance=instance, resources=resources)
        assert observed.success
        latest = instance.fetch_observations(ACCOUNT_KEY, limit=1).records[0].asset_observation.metadata
        assert latest["spent_usd"].value == pytest.approx(totals.usd_spent, abs=1e-6)
        assert latest["remaining_credit_usd"].value == pytest.approx(sim.stats(0)["credits"]["remaining"], abs=1e-6)


@pytest.mark.parametrize("choice", ["wait", "scale_down", "proceed"])
def test_a_plan_that_does_not_fit(tmp_path, forge_home, choice):
    spec = DatasetSpec("P2", write_prompts(tmp_path / "p2.jsonl", 200, tag="n"), 10**9, 200)
    plan, gen = build_plan_asset([spec]), build_generated_asset(spec)
    with run_simulator_in_thread(sim_config()) as sim, dg.instance_for_test() as instance:
        resources = {"openrouter": resource_for(sim.base_url, budget_usd=0.02), "duckdb": DuckDBResource()}
        result = dg.materialize(
            [plan], instance=instance, resources=resources, run_config=plan_config(on_overrun=choice)
        )
        assert result.success
        md = result.asset_materializations_for_node("generation_plan")[0].metadata
        assert md["fits"].value is False and md["decision"].value == choice
        assert "Output-token targets that fit" in md["plan"].value
        doc = json.loads((forge_home / "state" / "generation_plan.json").read_text())
        after_plan = ledger_totals(forge_home).usd_spent
        billed_after_plan = sim.stats(0)["billed_usd"]
        run = dg.materialize([gen], partition_key="0000", instance=instance, resources=resources, raise_on_error=False)
        failure = next((e for e in run.all_events if e.is_step_failure), None)
        text = "" if failure is None else failure.step_failure_data.error.message
        totals = ledger_totals(forge_home, "P2")
        if choice == "wait":  # refused before anything was bought
            assert not run.success and "does not fit and says wait" in text and "on_overrun: scale_down" in text
            assert ledger_totals(forge_home).usd_spent == after_plan and sim.stats(0)["billed_usd"] == billed_after_plan
        elif choice == "scale_down":  # stops at the proposed target, within the money
            target = doc["targets"]["P2"]
            assert target < 10**9 and target == doc["proposals"]["proportional"]["P2"]
            assert run.success, text
            assert totals.tokens_spent <= target * 1.01 + 128
            assert ledger_totals(forge_home).usd_spent <= 0.02
        else:  # proceed: until the money runs out, as before plans existed
            assert not run.success and "budget exhausted" in text
            assert ledger_totals(forge_home).usd_spent <= 0.02
