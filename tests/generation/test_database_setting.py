"""The one setting that decides where the ledger lives, end to end through a Dagster materialization."""

import dagster as dg
import pytest

from eagle_assets import layout
from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.generation.ledger.database import DatabaseConfigError, redact_url
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.generation.test_dagster_generation import resource_for, write_prompts
from tests.simulator.harness import run_simulator_in_thread


def test_where_the_ledger_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EAGLE_FORGE_DATABASE_URL", raising=False)
    res = resource_for("http://127.0.0.1:1/api/v1")
    assert res.ledger_location() == tmp_path / "home" / "state" / "ledger.sqlite" == layout.ledger_location()
    monkeypatch.setenv("EAGLE_FORGE_DATABASE_URL", "postgresql://eagle@db.internal/forge")
    assert res.ledger_location() == "postgresql://eagle@db.internal/forge" == layout.ledger_location()
    other = resource_for("http://127.0.0.1:1/api/v1", database_url="postgresql://eagle@other/forge")
    assert other.ledger_location() == "postgresql://eagle@other/forge"  # the resource's own setting wins


def test_a_bad_database_setting_fails_clearly_and_never_shows_the_password():
    assert redact_url("postgresql://eagle:s3cret@db:5432/forge") == "postgresql://eagle:***@db:5432/forge"
    with pytest.raises(DatabaseConfigError, match="mysql"):
        BudgetLedger("mysql://eagle@db/forge")
    with pytest.raises(ConnectionError) as err:  # nothing listens on loopback port 1
        BudgetLedger("postgresql://eagle:s3cret@127.0.0.1:1/forge")
    assert "s3cret" not in str(err.value) and "127.0.0.1" in str(err.value)
    assert err.value.__suppress_context__  # libpq's own message is not chained into the traceback


def test_a_materialization_spends_through_the_postgres_ledger(tmp_path, monkeypatch, fresh_pg_database):
    home = tmp_path / "home"
    url = fresh_pg_database()
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(home))
    monkeypatch.setenv("EAGLE_FORGE_DATABASE_URL", url)
    spec = DatasetSpec("P1", write_prompts(tmp_path / "p1.jsonl", 40, "pg"), 10**9, 40)
    asset = build_generated_asset(spec)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=40, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset],
            partition_key="0000",
            instance=instance,
            resources={"openrouter": resource_for(sim.base_url), "duckdb": DuckDBResource()},
        )
        assert result.success
        billed = sim.stats(0)["billed_usd"]
    assert not (home / "state" / "ledger.sqlite").exists()  # nothing went to a local file
    led = BudgetLedger(url)
    try:
        assert led.totals().usd_spent == pytest.approx(billed) and billed > 0
        assert led.totals("P1").in_flight == 0
        # The run took the partition's lease, then the asset took it again to publish the outputs (token 2), and
        # both gave it back.
        with led.db.read() as cur:
            assert cur.execute("SELECT holder, token FROM partition_leases").fetchall() == [(None, 2)]
    finally:
        led.close()
