"""Real prompt sets as generation assets on a real Dagster instance: a ShareGPT file and a Hub dataset (through
the loopback fake Hub) materialize with their source, format, rejects, mode and turns in the metadata; a set
that is mostly bad, or a shard with nothing usable, fails before anything is sent."""

import io

import dagster as dg
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import load_datasets
from eagle_assets.tokenization.tokenizer_source import resolve_tokenizer_dir
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource
from resources.simulator.config import LatencyConfig, SimulatorConfig
from tests.dagster_failures import failure_text
from tests.datasets.fake_dataset_hub import FakeDatasetRepo, serve_datasets
from tests.simulator.harness import run_simulator_in_thread


def sharegpt_line(i: int, turns: int = 2) -> bytes:
    conv = []
    for k in range(turns):
        conv += [{"from": "human", "value": f"Row {i} asks question {k + 1}."}, {"from": "gpt", "value": "old"}]
    return orjson.dumps({"id": f"sg{i:02d}", "conversations": conv})


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = SimulatorConfig(
        latency=LatencyConfig.fixed(0.005), mean_completion_tokens=30, tokenizer_dir=resolve_tokenizer_dir()
    )
    with run_simulator_in_thread(cfg) as sim, dg.instance_for_test() as instance:
        yield tmp_path, sim, instance


def materialize(spec, sim, instance, partition="0000"):
    resource = OpenRouterResource(
        base_url=sim.base_url,
        max_in_flight=16,
        max_tokens=2048,
        request_timeout_s=5.0,
        retry_base_delay_s=0.01,
        api_key_file="",
        tokenizer_path=str(resolve_tokenizer_dir()),
    )
    asset = build_generated_asset(spec)
    return asset, dg.materialize(
        [asset],
        partition_key=partition,
        instance=instance,
        resources={"openrouter": resource, "duckdb": DuckDBResource()},
        raise_on_error=False,
    )


def test_a_sharegpt_file_and_a_hub_set_materialize_with_their_data_described(env, monkeypatch):
    tmp, sim, instance = env
    lines = [sharegpt_line(i) for i in range(12)]
    lines.insert(5, b'{"id": "bad", "conversations": [{"from": "alien", "value": "?"}]}')
    (tmp / "sharegpt.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    buf = io.BytesIO()
    rows = [{"prompt_id": f"u{i}", "data": [f"question {i}", "old answer"]} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), buf)
    repo = FakeDatasetRepo("acme/chat")
    commit = repo.commit({"data/train_sft-00000-of-00001.parquet": buf.getvalue()})
    (tmp / "datasets.yaml").write_text(
        "datasets:\n"
        "  SG: {path: sharegpt.jsonl, regenerate: every_turn, shard_size: 20, max_bad_fraction: 0.1}\n"
        "  HUB: {path: 'hf:acme/chat', split: train_sft, shard_size: 4}\n"
    )
    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        specs = load_datasets(tmp / "datasets.yaml")
        asset, result = materialize(specs["SG"], sim, instance)
        assert result.success
        md = result.asset_materializations_for_node(asset.node_def.name)[0].metadata
        assert md["rows"].value == 24 and md["requests_in_shard"].value == 24  # 12 conversations x 2 turns
        assert md["format"].value == "sharegpt (detected)" and md["regenerate"].value == "every_turn"
        assert md["rows_in_source"].value == 13 and md["usable_rows_in_source"].value == 12
        assert "unknown_role" in md["rows_rejected_in_source"].value and md["rows_rejected_in_shard"].value == 1
        assert f"{tmp / 'sharegpt.jsonl'}:6" in md["first_rejected_rows"].value
        assert "| 2 | 12 |" in md["turns_per_row"].value
        assert md["source"].value == str(tmp / "sharegpt.jsonl")

        hub = specs["HUB"]
        assert hub.shard_keys() == ["0000", "0001"]
        asset, result = materialize(hub, sim, instance, "0001")
        assert result.success
        md = result.asset_materializations_for_node(asset.node_def.name)[0].metadata
        assert md["source_commit"].value == commit and md["source_split"].value == "train_sft"
        assert md["source"].value == f"acme/chat@{commit} (split train_sft)"
        assert md["format"].value == "ultrachat (detected, id from prompt_id)" and md["rows"].value == 2
    frame = pl.read_parquet(tmp / "home" / "generated" / "HUB" / "0001.parquet")
    shard0 = pl.read_parquet(tmp / "home" / "generated" / "SG" / "0000.parquet")
    assert shard0["prompt_id"].str.contains("#t2").sum() == 12
    # The HUB shard 0001 holds 2 of the 6 rows, picked by the shuffled order; last_user cut the old answer.
    assert frame.height == 2 and all(orjson.loads(m)[-1]["role"] == "user" for m in frame["messages"])


def test_a_mostly_bad_set_and_an_empty_shard_fail_before_anything_is_sent(env):
    tmp, sim, instance = env
    (tmp / "bad.jsonl").write_bytes(b"\n".join([sharegpt_line(0), b"{oops", b"[1]", sharegpt_line(1)]) + b"\n")
    (tmp / "cols.jsonl").write_bytes(b'{"question": "a"}\n{"question": "b"}\n')
    (tmp / "datasets.yaml").write_text(
        "datasets:\n  BAD: {path: bad.jsonl, shard_size: 10}\n  COLS: {path: cols.jsonl}\n"
        "  THIN: {path: bad.jsonl, shard_size: 1, max_bad_fraction: 0.6, order: file}\n"
    )
    specs = load_datasets(tmp / "datasets.yaml")
    _, result = materialize(specs["BAD"], sim, instance)
    text = failure_text(result)
    assert not result.success and "2 of 4 rows (50.0%) cannot be used" in text and "nothing was sent" in text
    assert "invalid_json 1" in text and "not_an_object 1" in text and f"{tmp / 'bad.jsonl'}:2" in text
    _, result = materialize(specs["COLS"], sim, instance)
    assert "unknown format: the data has columns ['question']" in failure_text(result)
    _, result = materialize(specs["THIN"], sim, instance, "0001")  # row 2 alone: invalid JSON
    text = failure_text(result)
    assert "none of the shard's 1 rows can be asked" in text and "invalid_json 1" in text
    assert sim.stats(0)["requests_received"] == 0


def test_a_source_that_grew_under_a_started_partition_stops_it(env):
    tmp, sim, instance = env
    data = tmp / "grow.jsonl"
    data.write_bytes(b"\n".join(sharegpt_line(i, turns=1) for i in range(6)) + b"\n")
    (tmp / "datasets.yaml").write_text("datasets:\n  GROW: {path: grow.jsonl, shard_size: 3}\n")
    _, result = materialize(load_datasets(tmp / "datasets.yaml")["GROW"], sim, instance)
    assert result.success
    sent = sim.stats(0)["requests_received"]
    with data.open("ab") as f:
        f.write(sharegpt_line(6, turns=1) + b"\n")
    _, result = materialize(load_datasets(tmp / "datasets.yaml")["GROW"], sim, instance)
    text = failure_text(result)
    assert not result.success and "was started on" in text and "with 6 rows" in text and "has 7" in text
    assert sim.stats(0)["requests_received"] == sent
