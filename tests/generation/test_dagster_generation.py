"""Generation as Dagster assets on a real instance: metadata, budget failure then resume, and the credits
sensor backfilling after a top-up. (SIGKILLs of a running materialization: test_soak.py.)"""

from pathlib import Path

import dagster as dg
import orjson
import polars as pl
import pytest

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.ledger import BudgetLedger
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from sensors.credits_sensor import build_credits_sensor
from tests.simulator.harness import run_simulator_in_thread


def write_prompts(path: Path, n: int, tag: str = "k") -> Path:
    rows = [
        {"id": f"{tag}{i:05d}", "messages": [{"role": "user", "content": f"Prompt {tag} {i}: say something."}]}
        for i in range(n)
    ]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.fixture
def forge_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def resource_for(base_url: str, **kw) -> OpenRouterResource:
    kw.setdefault("budget_usd", 100.0)
    kw.setdefault("max_tokens", 128)
    return OpenRouterResource(
        base_url=base_url,
        max_in_flight=32,
        request_timeout_s=5.0,
        retry_base_delay_s=0.01,
        retry_max_delay_s=0.1,
        progress_interval_s=0.5,
        key_poll_interval_s=0.2,
        api_key_file="",
        tokenizer_path=str(resolve_tokenizer_dir()),
        **kw,
    )


def test_materialize_partitions_with_metadata_and_budget_resume(tmp_path, forge_home):
    spec = DatasetSpec("K1", write_prompts(tmp_path / "k1.jsonl", 120), 10**9, 60)
    asset = build_generated_asset(spec)
    assert asset.partitions_def.get_partition_keys() == ["0000", "0001"]
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=50, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        # A budget that runs out part-way: the step fails with a clear, resumable message.
        poor = resource_for(sim.base_url, budget_usd=0.01)
        result = dg.materialize(
            [asset],
            partition_key="0000",
            instance=instance,
            resources={"openrouter": poor, "duckdb": DuckDBResource()},
            raise_on_error=False,
        )
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        text = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
        assert "budget exhausted" in text and "of 60 prompts done, resumable" in text
        done_before = len(read_records(forge_home / "journal" / "K1" / "0000.journal"))
        assert 0 < done_before < 60
        assert sim.stats(0)["billed_usd"] <= 0.01
        status = instance.get_status_by_partition(asset.key, ["0000", "0001"], asset.partitions_def)
        assert status["0000"] == dg.AssetPartitionStatus.FAILED
        # After raising the budget the same partition continues where it stopped.
        rich = resource_for(sim.base_url, budget_usd=10.0)
        result = dg.materialize(
            [asset], partition_key="0000", instance=instance, resources={"openrouter": rich, "duckdb": DuckDBResource()}
        )
        assert result.success
        mat = result.asset_materializations_for_node(asset.node_def.name)[0]
        md = mat.metadata
        assert md["prompts_done"].value == 60 and md["rows"].value == 60
        assert md["new_this_run"].value == 60 - done_before
        assert "Chutes" in md["providers"].value or "Moonshot" in md["providers"].value
        frame = pl.read_parquet(forge_home / "generated" / "K1" / "0000.parquet")
        assert frame.height == 60 and frame["prompt_id"].n_unique() == 60
        assert set(frame.columns) >= {
            "prompt_id",
            "messages",
            "reasoning",
            "content",
            "tool_calls",
            "finish_reason",
            "provider",
            "model",
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "cost",
            "generation_id",
            "latency_s",
            "attempts",
        }
        assert sim.stats(0)["hashes_billed_more_than_once"] == []


def test_credits_sensor_backfills_exactly_the_missing_partitions(tmp_path, forge_home):
    spec = DatasetSpec("K2", write_prompts(tmp_path / "k2.jsonl", 90, tag="s"), 10**9, 30)
    asset = build_generated_asset(spec)
    sensor = build_credits_sensor([asset], min_increase_usd=0.001, min_remaining_usd=0.001)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005),
        mean_completion_tokens=50,
        credits=0.008,
        tokenizer_dir=resolve_tokenizer_dir(),
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = resource_for(sim.base_url)
        defs = dg.Definitions(
            assets=[asset], sensors=[sensor], resources={"openrouter": res, "duckdb": DuckDBResource()}
        )
        ctx = dg.build_sensor_context(instance=instance, resources={"openrouter": res, "duckdb": DuckDBResource()})
        first = sensor(ctx)
        assert "first look" in first.skip_reason.skip_message
        (seen,) = first.asset_events  # every evaluation observes the account
        assert seen.asset_key == dg.AssetKey("openrouter_account")
        assert seen.metadata["remaining_credit_usd"].value == pytest.approx(0.008)
        outcomes = [
            dg.materialize(
                [asset],
                partition_key=k,
                instance=instance,
                resources={"openrouter": res, "duckdb": DuckDBResource()},
                raise_on_error=False,
            ).success
            for k in ("0000", "0001", "0002")
        ]
        assert not all(outcomes), "the simulated credits should run out"
        ctx2 = dg.build_sensor_context(
            instance=instance, resources={"openrouter": res, "duckdb": DuckDBResource()}, cursor=ctx.cursor
        )
        spent_down = sensor(ctx2)
        assert spent_down.skip_reason is not None and not spent_down.run_requests  # spent down, no top-up yet
        led = BudgetLedger(forge_home / "state" / "ledger.sqlite")
        spent = led.totals().usd_spent
        led.close()
        assert spent_down.asset_events[0].metadata["spent_usd"].value == pytest.approx(spent, abs=1e-6)
        sim.topup(5.0)
        ctx3 = dg.build_sensor_context(
            instance=instance, resources={"openrouter": res, "duckdb": DuckDBResource()}, cursor=ctx2.cursor
        )
        requests = sensor(ctx3).run_requests
        pending = [k for k, ok in zip(("0000", "0001", "0002"), outcomes, strict=True) if not ok]
        assert sorted(r.partition_key for r in requests) == pending
        assert len({r.run_key for r in requests}) == len(requests)
        job = defs.resolve_implicit_global_asset_job_def()
        for r in requests:
            assert job.execute_in_process(instance=instance, partition_key=r.partition_key).success
        status = instance.get_status_by_partition(asset.key, ["0000", "0001", "0002"], asset.partitions_def)
        assert all(s == dg.AssetPartitionStatus.MATERIALIZED for s in status.values())
        ctx4 = dg.build_sensor_context(
            instance=instance, resources={"openrouter": res, "duckdb": DuckDBResource()}, cursor=ctx3.cursor
        )
        assert sensor(ctx4).skip_reason is not None


def test_tokenized_partition_matches_the_api_token_counts_exactly(tmp_path, forge_home):
    from eagle_assets.assets.tokens import build_tokenized_asset
    from eagle_assets.corpus.tokenized_schema import EOT_ID
    from eagle_assets.layout import tokenized_path
    from tests.corpus.helpers import read_tokenized

    spec = DatasetSpec("K4", write_prompts(tmp_path / "k4.jsonl", 40, tag="z"), 10**9, 40)
    gen = build_generated_asset(spec)
    tok = build_tokenized_asset(spec, gen.partitions_def)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=80, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        res = resource_for(sim.base_url, max_tokens=64)
        result = dg.materialize(
            [gen, tok],
            partition_key="0000",
            instance=instance,
            resources={"openrouter": res, "duckdb": DuckDBResource()},
        )
        assert result.success
        md = result.asset_materializations_for_node(tok.node_def.name)[0].metadata
        assert md["samples"].value == 40
        assert md["samples_with_token_diff"].value == 0  # exact on the simulator
        assert md["samples_with_prompt_token_diff"].value == 0 and md["prompt_token_relative_diff"].value == 0.0
        gmd = result.asset_materializations_for_node(gen.node_def.name)[0].metadata
        assert gmd["native_counts_fetched"].value == 32 == md["samples_with_native_count"].value  # the default sample
        diff_check = next(
            e.event_specific_data
            for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION" and e.event_specific_data.check_name == "token_diff"
        )
        assert diff_check.passed and diff_check.metadata["rows_with_native"].value == 32
        assert diff_check.metadata["native_relative_diff"].value == 0.0
        frame = read_tokenized(tokenized_path("K4", "0000"))
        natives = [r for r in frame.iter_rows(named=True) if r["native_completion_tokens"] is not None]
        assert len(natives) == 32 and all(r["native_completion_tokens"] == r["completion_len"] for r in natives)
        for row in frame.iter_rows(named=True):
            ids, mask = row["input_ids"], row["loss_mask"]
            assert len(ids) == len(mask) == row["prompt_len"] + row["completion_len"]
            assert sum(mask) == row["completion_len"] and mask[: row["prompt_len"]] == [0] * row["prompt_len"]
            if row["finish_reason"] == "length":
                assert EOT_ID not in ids[row["prompt_len"] :]
            else:
                assert ids[-1] == EOT_ID and ids[row["prompt_len"] :].count(EOT_ID) == 1
        assert set(frame["finish_reason"]) >= {"length"}  # max_tokens 64 cuts some responses


def test_a_request_wide_400_fails_the_run_and_the_partition_is_bought_once_fixed(tmp_path, forge_home):
    """The issue's case through a real Dagster instance: every chat request answered with the same 400."""
    mandatory = "Reasoning is mandatory for this endpoint and cannot be disabled."
    spec = DatasetSpec("K5", write_prompts(tmp_path / "k5.jsonl", 40, tag="w"), 10**9, 40)
    asset = build_generated_asset(spec)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=50, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        sim.set_request_wide_error(mandatory)
        resources = {"openrouter": resource_for(sim.base_url), "duckdb": DuckDBResource()}
        result = dg.materialize(
            [asset], partition_key="0000", instance=instance, resources=resources, raise_on_error=False
        )
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        text = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
        assert "request-wide error" in text and mandatory in text
        assert sim.stats(0)["requests_received"] <= 8  # the breaker's threshold, not the 40 prompts
        assert read_records(forge_home / "journal" / "K5" / "0000.journal") == []  # no skip journaled as final
        sim.set_request_wide_error(None)
        result = dg.materialize([asset], partition_key="0000", instance=instance, resources=resources)
        assert result.success
        md = result.asset_materializations_for_node(asset.node_def.name)[0].metadata
        assert md["rows"].value == 40 and md["new_this_run"].value == 40
