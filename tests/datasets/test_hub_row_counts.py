"""Loading the definitions lists a Hub dataset's shards from its Parquet footers, never from a download of the split:
measured by the bytes the loopback fake Hub served. The counts are cached per commit (a second load offline lists
the same shards), and a Hub that cannot be reached leaves the code location loadable, the partition failing with
the source and the cause named."""

import io
import logging
import os
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets.assets.generation import build_generated_asset
from eagle_assets.datasets.config import load_datasets
from eagle_assets.datasets.sampling import shard_count
from eagle_assets.datasets.sources import resolve_source
from resources.duckdb.resource import DuckDBResource
from resources.openrouter.resource import OpenRouterResource
from tests.dagster_failures import failure_text
from tests.datasets.fake_dataset_hub import FakeDatasetRepo, serve_datasets

SHARD = 100
DEAD_HUB = "http://127.0.0.1:9"  # nothing listens there: the Hub is down


def big_parquet(n: int, tag: str) -> bytes:
    """~6 kB of incompressible text per row, so a file is megabytes and its footer a few kB."""
    rows = [{"prompt_id": f"{tag}{i}", "prompt": os.urandom(3000).hex()} for i in range(n)]
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf, row_group_size=50)
    return buf.getvalue()


@pytest.fixture
def repo() -> FakeDatasetRepo:
    repo = FakeDatasetRepo("acme/big-chat")
    repo.commit(
        {
            "README.md": b"# a large chat set\n",
            "data/train-00000-of-00002.parquet": big_parquet(260, "a"),
            "data/train-00001-of-00002.parquet": big_parquet(190, "b"),
            "data/test-00000-of-00001.parquet": big_parquet(20, "t"),
        }
    )
    return repo


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EAGLE_FORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path


def write_config(tmp: Path, entries: str) -> Path:
    path = tmp / "datasets.yaml"
    path.write_text(f"datasets:\n{entries}")
    return path


def data_bytes(repo: FakeDatasetRepo, split: str) -> tuple[int, int]:
    """(bytes served, bytes held) over the data files of ``split`` at the head commit."""
    files = {p: b for p, b in repo.commits[repo.branches["main"]].items() if f"/{split}-" in p}
    return sum(repo.served[p] for p in files), sum(len(b) for b in files.values())


def test_loading_the_definitions_reads_only_parquet_footers_and_lists_the_full_reads_shards(repo, home, monkeypatch):
    cfg = write_config(home, f"  B1:\n    path: hf:acme/big-chat\n    shard_size: {SHARD}\n")
    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        asset = build_generated_asset(load_datasets(cfg)["B1"])
        assert asset.partitions_def is not None
        keys = asset.partitions_def.get_partition_keys()
        served, held = data_bytes(repo, "train")
        assert 0 < served < held / 10, (served, held)
        assert repo.served["data/test-00000-of-00001.parquet"] == 0  # another split: not even its footer

    # Later loads with the Hub gone, as an outage and with HF_HUB_OFFLINE=1, list the same shards from the cache.
    monkeypatch.setenv("HF_ENDPOINT", DEAD_HUB)
    assert load_datasets(cfg)["B1"].shard_keys() == keys
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_datasets(cfg)["B1"].shard_keys() == keys

    # The shards are those of the whole split read row by row (downloaded, as a partition does).
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        spec = load_datasets(cfg)["B1"]
        full = spec.resolve()
        rows = sum(1 for _ in full.iter_rows())
    assert rows == 450 and full.count_rows() == 450
    assert keys == [f"{i:04d}" for i in range(shard_count(rows, SHARD))]
    served, held = data_bytes(repo, "train")
    assert served >= held  # the partition's read did download the split


def test_a_partly_downloaded_split_is_counted_from_its_cached_files_and_the_rest_from_footers(repo, home, monkeypatch):
    """A file a partition already fetched is read from the HF cache, the others from the Hub's footers; the counts
    agree with the full read whatever mix they come from."""
    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        from eagle_assets.datasets.sources import SourceSpec

        first = resolve_source(
            SourceSpec.parse("hf:acme/big-chat", data_files=["data/train-00000-of-00002.parquet"])
        ).count_rows()
        before = repo.served.copy()
        cfg = write_config(home, f"  B1:\n    path: hf:acme/big-chat\n    shard_size: {SHARD}\n")
        assert load_datasets(cfg)["B1"].row_count() == 450 and first == 260
        assert repo.served["data/train-00000-of-00002.parquet"] == before["data/train-00000-of-00002.parquet"]
        assert 0 < repo.served["data/train-00001-of-00002.parquet"] < 190 * 6000 / 10


def test_a_repo_without_a_dataset_card_lists_its_shards_offline_after_one_load(home, monkeypatch):
    repo = FakeDatasetRepo("acme/cardless")
    repo.commit({"train.parquet": big_parquet(120, "c")})
    cfg = write_config(home, f"  B3:\n    path: hf:acme/cardless\n    shard_size: {SHARD}\n")
    with serve_datasets(repo) as (url, _):
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert load_datasets(cfg)["B3"].shard_keys() == ["0000", "0001"]
    monkeypatch.setenv("HF_ENDPOINT", DEAD_HUB)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert load_datasets(cfg)["B3"].shard_keys() == ["0000", "0001"]


def test_json_lines_on_the_hub_are_downloaded_at_load_to_be_counted(home, monkeypatch, caplog):
    """JSON has no footer: its file is fetched whole (once, into the HF cache) and the download is logged."""
    repo = FakeDatasetRepo("acme/sg")
    body = b"".join(b'{"id": "%d", "prompt": "question %d"}\n' % (i, i) for i in range(230))
    repo.commit({"train.jsonl": body, "README.md": b"# x\n"})
    cfg = write_config(home, f"  B2:\n    path: hf:acme/sg\n    shard_size: {SHARD}\n")
    with serve_datasets(repo) as (url, _), caplog.at_level(logging.WARNING):
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert load_datasets(cfg)["B2"].shard_keys() == ["0000", "0001", "0002"]
        assert repo.served["train.jsonl"] == len(body)
        assert load_datasets(cfg)["B2"].shard_keys() == ["0000", "0001", "0002"]
        assert repo.served["train.jsonl"] == len(body)  # counted once
    assert any("train.jsonl" in r.message and "downloading" in r.message for r in caplog.records)


def test_an_unreachable_hub_leaves_the_definitions_loadable_and_the_partition_fails_naming_the_source(
    home, monkeypatch
):
    """As for a local file that is missing: one placeholder shard, and materializing it says what is wrong."""
    monkeypatch.setenv("HF_ENDPOINT", DEAD_HUB)
    cfg = write_config(
        home,
        f"  B1:\n    path: hf:acme/big-chat\n    split: train\n  B2:\n    path: {home / 'missing.jsonl'}\n",
    )
    specs = load_datasets(cfg)
    assets = [build_generated_asset(s) for s in specs.values()]
    resource = OpenRouterResource(base_url=DEAD_HUB, api_key_file="", max_in_flight=1)
    defs = dg.Definitions(assets=assets, resources={"openrouter": resource, "duckdb": DuckDBResource()})
    loaded = {a.key.to_user_string() for a in defs.resolve_all_asset_specs()}
    assert {"generated/B1", "generated/B2"} <= loaded
    for asset in assets:
        assert asset.partitions_def is not None and asset.partitions_def.get_partition_keys() == ["0000"]
    expected = {
        "B1": ["hf:acme/big-chat", "cannot be reached"],
        "B2": ["prompt file not found", str(home / "missing.jsonl")],
    }
    with dg.instance_for_test() as instance:
        for asset, (name, needles) in zip(assets, expected.items(), strict=True):
            result = dg.materialize(
                [asset],
                partition_key="0000",
                instance=instance,
                resources={"openrouter": resource, "duckdb": DuckDBResource()},
                raise_on_error=False,
            )
            assert not result.success
            message = failure_text(result)  # the step error, then what raised it
            assert all(n in message for n in needles), (name, message)
