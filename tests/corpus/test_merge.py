"""The merged corpus: every sample once, deduplicated, deterministic, within shard limits, resumable."""

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle_assets.corpus import validation as v
from eagle_assets.corpus.merge import INDEX_NAME, MergeConfig, MergeResult, find_partitions, merge_corpus
from eagle_assets.corpus.tokenized_schema import ARROW_SCHEMA, write_tokenized
from tests.corpus.synthetic import synthetic_tokenized_table

from .helpers import ALLOWED, tokenized_dataset

CFG = MergeConfig(seed=7, eval_count=25, max_samples_per_shard=30, max_tokens_per_shard=10_000_000, batch_rows=8)


@pytest.fixture
def sources(tmp_path: Path) -> list[Path]:
    return tokenized_dataset(tmp_path, datasets=("B1", "B2", "B3"), shards=2, n=40)  # 240 samples


def _ids(result: MergeResult, split: str) -> list[str]:
    return [
        pid for p in result.shards(split) for pid in pq.read_table(p, columns=["prompt_id"])["prompt_id"].to_pylist()
    ]


def _rows(paths: list[Path]) -> dict[str, dict]:
    return {r["prompt_id"]: r for p in paths for r in pq.read_table(p).to_pylist()}


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.parquet"))}


def _mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.rglob("*.parquet"))}


def test_every_sample_exactly_once_unchanged(tmp_path: Path, sources: list[Path]) -> None:
    result = merge_corpus(sources, tmp_path / "corpus", CFG)
    train, evals = _ids(result, "train"), _ids(result, "eval")
    assert len(evals) == 25 and len(train) == 215
    assert sorted(train + evals) == sorted(_rows(sources))
    assert _rows(result.shards("train") + result.shards("eval")) == _rows(sources)
    assert pq.read_schema(result.shards("train")[0]).remove_metadata() == ARROW_SCHEMA
    c = result.index["counts"]
    assert (c["input_samples"], c["samples"], c["duplicate_prompt_id"]) == (240, 240, 0)
    assert c["tokens"] == sum(r["n_tokens"] for r in _rows(sources).values())
    assert c["tokens"] == result.index["splits"]["train"]["tokens"] + result.index["splits"]["eval"]["tokens"]
    assert [s["kept"] for s in result.index["sources"]] == [40] * 6
    assert not list((tmp_path / "corpus").glob(".spill-*"))


def test_corpus_passes_the_tokenized_checks(tmp_path: Path, sources: list[Path]) -> None:
    result = merge_corpus(sources, tmp_path / "corpus", CFG)
    shards = result.shards("train") + result.shards("eval")
    outcomes = v.run_tokenized_checks(shards, ALLOWED, settings=v.DuckDBSettings(threads=1, memory_limit="256MB"))
    assert all(o.passed for o in outcomes), [o.summary for o in outcomes if not o.passed]


def test_dedup_by_prompt_id_keeps_first_copy(tmp_path: Path, sources: list[Path]) -> None:
    rng = np.random.default_rng(5)
    # B4 repeats five of B1's ids (with other content) and one of its own.
    dup = synthetic_tokenized_table(rng, 6, dataset="B4", shard="00000", id_prefix="B1-00000-")
    own = synthetic_tokenized_table(rng, 3, dataset="B4", shard="00000", id_prefix="B4-")
    table = pa.concat_tables([dup.slice(0, 5), own, own.slice(0, 1)])
    extra = tmp_path / "tokenized" / "B4" / "00000.parquet"
    write_tokenized(extra, table)
    result = merge_corpus([extra, *sources], tmp_path / "corpus", CFG)  # listing order does not pick the winner
    c = result.index["counts"]
    assert (c["input_samples"], c["duplicate_prompt_id"], c["samples"]) == (249, 6, 243)
    merged = _rows(result.shards("train") + result.shards("eval"))
    assert len(merged) == 243
    originals = _rows(sources)
    for i in range(5):
        pid = f"B1-00000-{i:08d}"
        assert merged[pid] == originals[pid] and merged[pid]["dataset"] == "B1"
    assert {s["dataset"]: s["kept"] for s in result.index["sources"] if s["dataset"] == "B4"} == {"B4": 3}


def test_dedup_by_input_ids_is_optional(tmp_path: Path, sources: list[Path]) -> None:
    copy = pq.read_table(sources[0]).slice(0, 4)
    copy = copy.set_column(0, ARROW_SCHEMA.field("prompt_id"), pa.array([f"again-{i}" for i in range(4)]))
    extra = tmp_path / "tokenized" / "B8" / "00000.parquet"
    write_tokenized(extra, copy)
    kept = merge_corpus([*sources, extra], tmp_path / "a", CFG)
    assert kept.index["counts"]["samples"] == 244 and kept.index["counts"]["duplicate_input_ids"] == 0
    deduped = merge_corpus(
        [*sources, extra], tmp_path / "b", MergeConfig(**{**CFG.identity(), "dedup_input_ids": True})
    )
    assert deduped.index["counts"]["samples"] == 240 and deduped.index["counts"]["duplicate_input_ids"] == 4
    assert not any(pid.startswith("again-") for pid in _ids(deduped, "train") + _ids(deduped, "eval"))


def test_shuffle_is_deterministic_and_seeded(tmp_path: Path, sources: list[Path]) -> None:
    a = merge_corpus(sources, tmp_path / "a", CFG)
    tuned = MergeConfig(**CFG.identity(), batch_rows=3, max_open_buckets=1)
    b = merge_corpus(list(reversed(sources)), tmp_path / "b", tuned)
    assert _ids(a, "train") == _ids(b, "train") and _ids(a, "eval") == _ids(b, "eval")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")  # byte-identical shards
    assert (tmp_path / "a" / INDEX_NAME).read_bytes() == (tmp_path / "b" / INDEX_NAME).read_bytes()
    c = merge_corpus(sources, tmp_path / "c", MergeConfig(**{**CFG.identity(), "seed": 8}))
    assert _ids(c, "train") != _ids(a, "train") and set(_ids(c, "eval")) != set(_ids(a, "eval"))
    # Shuffled, not concatenated: the first shard mixes datasets and source order is gone.
    first = pq.read_table(a.shards("train")[0], columns=["dataset"])["dataset"].to_pylist()
    assert len(set(first)) == 3
    assert _ids(a, "train") != sorted(_ids(a, "train"))


@pytest.mark.parametrize(
    ("kwargs", "n_eval"),
    [({"eval_fraction": 0.1}, 24), ({"eval_count": 7}, 7), ({"eval_fraction": 0.0}, 0), ({"eval_count": 1000}, 240)],
)
def test_split_sizes(tmp_path: Path, sources: list[Path], kwargs: dict, n_eval: int) -> None:
    cfg = MergeConfig(**{**CFG.identity(), "eval_count": None, **kwargs})
    result = merge_corpus(sources, tmp_path / "corpus", cfg)
    assert len(_ids(result, "eval")) == n_eval == result.index["splits"]["eval"]["samples"]
    assert len(_ids(result, "train")) == 240 - n_eval == result.index["splits"]["train"]["samples"]
    assert len(result.shards("eval")) == -(-n_eval // 30)


def test_shard_limits(tmp_path: Path, sources: list[Path]) -> None:
    cfg = MergeConfig(seed=1, eval_count=0, max_samples_per_shard=12, max_tokens_per_shard=1500)
    result = merge_corpus(sources, tmp_path / "corpus", cfg)
    entries = result.index["splits"]["train"]["shards"]
    lengths = [pq.read_table(p, columns=["n_tokens"])["n_tokens"].to_pylist() for p in result.shards("train")]
    assert [e["file"] for e in entries] == [f"train/shard-{i:05d}.parquet" for i in range(len(entries))]
    for entry, ls, nxt in zip(entries, lengths, [*lengths[1:], None], strict=True):
        assert entry["samples"] == len(ls) <= 12 and entry["tokens"] == sum(ls) <= 1500
        if nxt:  # greedy: the next shard's first sample would not have fit
            assert len(ls) == 12 or sum(ls) + nxt[0] > 1500
    # A sample longer than the token limit gets a shard of its own.
    alone = merge_corpus(sources, tmp_path / "alone", MergeConfig(seed=1, eval_count=0, max_tokens_per_shard=150))
    for entry in alone.index["splits"]["train"]["shards"]:
        assert entry["tokens"] <= 150 or entry["samples"] == 1
    assert any(e["tokens"] > 150 for e in alone.index["splits"]["train"]["shards"])


def test_rerun_skips_and_resumes(tmp_path: Path, sources: list[Path]) -> None:
    out = tmp_path / "corpus"
    first = merge_corpus(sources, out, CFG)
    assert not first.skipped and len(first.written) == len(_files(out)) == 9
    before, stamps = _files(out), _mtimes(out)
    again = merge_corpus(sources, out, CFG)
    assert again.skipped and again.written == [] and _mtimes(out) == stamps
    assert again.index == first.index

    # A crash after some shards: missing index, one shard gone, stale temporaries about.
    (out / INDEX_NAME).unlink()
    (out / "train" / "shard-00003.parquet").unlink()
    (out / "train" / ".shard-00003.parquet.tmp999").write_bytes(b"partial")
    (out / ".spill-deadbeef").mkdir()
    resumed = merge_corpus(sources, out, CFG)
    assert not resumed.skipped and resumed.written == ["train/shard-00003.parquet"]
    assert _files(out) == before
    assert {k: t for k, t in _mtimes(out).items() if k != "train/shard-00003.parquet"} == {
        k: t for k, t in stamps.items() if k != "train/shard-00003.parquet"
    }
    assert not list(out.glob(".spill-*")) and not list((out / "train").glob(".shard-*"))
    assert json.loads((out / INDEX_NAME).read_text()) == first.index


def test_changed_config_or_source_rebuilds_and_drops_stale_shards(tmp_path: Path, sources: list[Path]) -> None:
    out = tmp_path / "corpus"
    first = merge_corpus(sources, out, CFG)
    bigger = MergeConfig(**{**CFG.identity(), "max_samples_per_shard": 100})
    second = merge_corpus(sources, out, bigger)
    assert not second.skipped and len(second.written) == 4
    assert sorted(_files(out)) == sorted(
        s["file"] for sp in ("train", "eval") for s in second.index["splits"][sp]["shards"]
    )
    assert second.index["plan_key"] != first.index["plan_key"]

    # Same names and sizes, other content: the fingerprint notices, the stored plan key does not match.
    table = pq.read_table(sources[0])
    write_tokenized(sources[0], table.set_column(5, ARROW_SCHEMA.field("n_tokens"), table["n_tokens"]).slice(1))
    third = merge_corpus(sources, out, bigger)
    assert not third.skipped and third.index["counts"]["samples"] == 239
    assert third.index["sources"][0]["fingerprint"] != second.index["sources"][0]["fingerprint"]


def test_sources_written_by_polars_are_conformed(tmp_path: Path, sources: list[Path]) -> None:
    frame = pl.read_parquet(sources[0])  # large_list / large_string when written back by polars
    polars_path = tmp_path / "pl" / "B1" / "00000.parquet"
    polars_path.parent.mkdir(parents=True)
    frame.write_parquet(polars_path)
    a = merge_corpus([polars_path, *sources[1:]], tmp_path / "a", CFG)
    b = merge_corpus(sources, tmp_path / "b", CFG)
    # Other source bytes, so another plan key in the metadata; the same rows in the same order.
    assert _ids(a, "train") == _ids(b, "train")
    assert _rows(a.shards("train") + a.shards("eval")) == _rows(sources)
    assert pq.read_schema(a.shards("train")[0]).remove_metadata() == ARROW_SCHEMA


def test_find_partitions_ignores_temporaries(tmp_path: Path, sources: list[Path]) -> None:
    (tmp_path / "tokenized" / "B1" / ".00009.parquet.tmp1").write_bytes(b"x")
    found = find_partitions(tmp_path / "tokenized")
    assert found == sorted(sources)
    assert find_partitions(tmp_path / "tokenized", ["B2"]) == [p for p in sources if p.parent.name == "B2"]


def test_bad_config_and_inputs(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        MergeConfig(eval_fraction=1.0)
    with pytest.raises(ValueError):
        MergeConfig(max_tokens_per_shard=0)
    with pytest.raises(ValueError):
        merge_corpus([], tmp_path / "corpus")


def test_merge_writes_are_atomic(tmp_path: Path, sources: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while writing a shard leaves neither a partial shard nor an index behind."""
    from eagle_assets import durable_files  # every corpus file is renamed into place there

    calls = {"n": 0}
    real_replace = os.replace

    def flaky(src: os.PathLike, dst: os.PathLike) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(durable_files.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        merge_corpus(sources, tmp_path / "corpus", CFG)
    out = tmp_path / "corpus"
    assert not (out / INDEX_NAME).exists()
    assert len(_files(out)) == 2 and not [p for p in out.rglob("*") if ".tmp" in p.name]
    monkeypatch.undo()
    done = merge_corpus(sources, out, CFG)
    assert len(done.written) == 7


def test_empty_partition_is_fine(tmp_path: Path, sources: list[Path]) -> None:
    empty = tmp_path / "tokenized" / "B5" / "00000.parquet"
    write_tokenized(empty, [])
    result = merge_corpus([*sources, empty], tmp_path / "corpus", CFG)
    assert result.index["counts"]["samples"] == 240
    assert [s["kept"] for s in result.index["sources"] if s["dataset"] == "B5"] == [0]


@pytest.fixture
def few_sources(tmp_path: Path) -> list[Path]:
    """72 samples (the 240 of ``sources`` cost 3x as much per example, 240 one-sample shards at worst)."""
    return tokenized_dataset(tmp_path, datasets=("B1", "B2", "B3"), shards=2, n=12)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    samples=st.integers(1, 40),
    tokens=st.integers(100, 3000),
    eval_count=st.integers(0, 30),
    seed=st.integers(0, 2**31),
)
def test_partition_property(few_sources: list[Path], samples: int, tokens: int, eval_count: int, seed: int) -> None:
    """Any limits and split: every sample exactly once, every shard within its limits (or a lone sample)."""
    sources = few_sources
    with tempfile.TemporaryDirectory() as d:
        cfg = MergeConfig(seed=seed, eval_count=eval_count, max_samples_per_shard=samples, max_tokens_per_shard=tokens)
        result = merge_corpus(sources, Path(d), cfg)
        train, evals = _ids(result, "train"), _ids(result, "eval")
        assert len(evals) == eval_count and sorted(train + evals) == sorted(_rows(sources))
        for split in ("train", "eval"):
            for e in result.index["splits"][split]["shards"]:
                assert e["samples"] <= samples and (e["tokens"] <= tokens or e["samples"] == 1)
