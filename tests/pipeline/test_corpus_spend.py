"""The corpus reports each dataset's spend from the ledger the OpenRouter resource names, not the environment's."""

import dagster as dg

from eagle_assets.assets.corpus import build_corpus_asset
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.assets.tokens import build_tokenized_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.generation.test_dagster_generation import resource_for, write_prompts
from tests.simulator.harness import run_simulator_in_thread


def test_corpus_spend_comes_from_the_resources_database(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(home))
    monkeypatch.delenv("EAGLE_FORGE_DATABASE_URL", raising=False)
    elsewhere = tmp_path / "elsewhere" / "ledger.sqlite"  # the resource's database_url, not the home's file
    spec = DatasetSpec("S1", write_prompts(tmp_path / "s1.jsonl", 8, tag="s"), 10**9, 8)
    gen = build_generated_asset(spec)
    tok = build_tokenized_asset(spec, gen.partitions_def)
    corpus = build_corpus_asset([spec])
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.002), mean_completion_tokens=30, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = {
            "openrouter": resource_for(sim.base_url, max_tokens=32, database_url=str(elsewhere)),
            "duckdb": DuckDBResource(),
        }
        assert dg.materialize([gen, tok], partition_key="0000", instance=instance, resources=res).success
        run_config = {"ops": {"corpus": {"config": {"eval_fraction": 0.25}}}}
        r = dg.materialize([corpus], instance=instance, resources=res, run_config=run_config)
        md = r.asset_materializations_for_node("corpus")[0].metadata
    assert not (home / "state" / "ledger.sqlite").exists()
    led = BudgetLedger(elsewhere)
    try:
        spent = led.totals("S1").usd_spent
    finally:
        led.close()
    assert spent > 0
    assert "| S1 |" in md["datasets"].value and f"{spent:.4f}" in md["datasets"].value
    assert "dollars_per_dataset" in md
