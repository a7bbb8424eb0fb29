import json
import os
import shutil
from dataclasses import replace

import pytest
import torch

from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.pipeline import plan_batches, run_extraction
from eagle_assets.hidden_states.shard_file import read_shard_header
from eagle_assets.hidden_states.store import HiddenStateStore
from eagle_assets.hidden_states.store_format import GiB, InsufficientDiskError, StoreMeta, StoreMismatchError
from eagle_assets.hidden_states.store_space import check_disk, estimate_store_bytes
from tests.hidden_states.conftest import make_corpus

H = 8


class FakeFeatures:
    """A deterministic stand-in backend: features are a function of (token id, position)."""

    def __init__(self, n_aux: int = 3):
        self.n_aux = n_aux
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        out = []
        for s in batch:
            ids = torch.tensor(list(s.input_ids), dtype=torch.float32)[:, None]
            pos = torch.arange(len(s), dtype=torch.float32)[:, None]
            base = (ids % 97) + pos / 10
            out.append(
                {
                    "aux": base + torch.arange(self.n_aux * H, dtype=torch.float32),
                    "last": -base + torch.arange(H, dtype=torch.float32),
                }
            )
        return out


def meta(**kw):
    return StoreMeta(model_id="fake", hidden_size=H, layers=AuxLayers.default(7), dtype=torch.float32, **kw)


def test_estimate_matches_the_format_and_the_doc():
    # The doc: (3 + 1) × H × 2 bytes per token in bf16, 56 KiB/token for Kimi K2.5, ~3.4 TB for 60M tokens.
    assert estimate_store_bytes(1, 7168) - 5 == 56 * 1024
    assert estimate_store_bytes(1, 4096) - 5 == 32 * 1024
    assert 3.4e12 < estimate_store_bytes(60_000_000, 7168) < 3.5e12
    assert estimate_store_bytes(10, 64, with_last=False, dtype_bytes=4) == 10 * (3 * 64 * 4 + 5)


def test_file_sizes_equal_the_estimate_plus_header(tmp_path):
    corpus = make_corpus(n_shards=2)
    run_extraction(corpus, tmp_path, meta(), FakeFeatures(), max_tokens_per_batch=64)
    for k, shard in enumerate(corpus):
        f = tmp_path / f"shard-{k:05d}.safetensors"
        n_tok = sum(len(s) for s in shard)
        est = estimate_store_bytes(n_tok, H, dtype_bytes=4)
        header = read_shard_header(f)
        header_bytes = 8 + int.from_bytes(f.read_bytes()[:8], "little")
        assert header is not None
        assert f.stat().st_size == est + header_bytes + 8 * (len(shard) + 1)


def test_check_disk_refuses_with_numbers(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert check_disk(tmp_path, 1024) == pytest.approx(free, rel=0.01)
    with pytest.raises(InsufficientDiskError) as err:
        check_disk(tmp_path / "not" / "yet", free + 10 * GiB)
    msg = str(err.value)
    assert "need" in msg and "GiB" in msg and "free" in msg
    assert f"{(free + 10 * GiB) / GiB:.2f} GiB" in msg
    with pytest.raises(InsufficientDiskError, match="reserve"):
        check_disk(tmp_path, 1, reserve_bytes=free + 10 * GiB)


def test_extraction_refuses_before_computing_when_disk_is_short(tmp_path):
    backend = FakeFeatures()
    # 10 GiB beyond what is free now: other xdist workers share /tmp and free space between this read and the check
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(InsufficientDiskError):
        run_extraction(make_corpus(), tmp_path, meta(), backend, reserve_bytes=free + 10 * GiB)
    assert backend.calls == 0
    assert not list(tmp_path.glob("shard-*"))


def test_reader_order_and_contents(tmp_path):
    corpus = make_corpus(n_shards=3)
    run_extraction(corpus, tmp_path, meta(), FakeFeatures(), max_tokens_per_batch=50)
    flat = [s for shard in corpus for s in shard]
    ref = FakeFeatures()(flat)
    with HiddenStateStore(tmp_path) as store:
        assert len(store) == len(flat)
        assert [i for e in store.shard_entries for i in e["sample_ids"]] == [s.sample_id for s in flat]
        assert store.n_tokens == sum(len(s) for s in flat)
        for i, (s, item) in enumerate(zip(flat, store, strict=True)):
            assert item["input_ids"].dtype == torch.int64 and item["input_ids"].tolist() == list(s.input_ids)
            assert item["loss_mask"].dtype == torch.bool and item["loss_mask"].tolist() == [
                bool(m) for m in s.loss_mask
            ]
            assert torch.equal(item["aux"], ref[i]["aux"]) and torch.equal(item["last"], ref[i]["last"])
        assert torch.equal(store[-1]["aux"], ref[-1]["aux"])
        with pytest.raises(IndexError):
            store[len(flat)]
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["layers"]["hf_indices"] == [2, 3, 4] and index["hidden_size"] == H and index["dtype"] == "float32"
    assert index["shards"]["shard-00001"]["lengths"] == [len(s) for s in corpus[1]]


def test_torn_and_stale_shards_are_redone(tmp_path):
    corpus = make_corpus(n_shards=4)
    run_extraction(corpus, tmp_path, meta(), FakeFeatures())
    reference = [dict(x) for x in HiddenStateStore(tmp_path)]
    # Shard 1 torn (a partial copy at the final name), shard 2 deleted, shard 3 garbage header,
    # plus a temporary left by a crashed (dead) writer.
    f1 = tmp_path / "shard-00001.safetensors"
    with open(f1, "r+b") as f:
        f.truncate(f1.stat().st_size - 7)
    (tmp_path / "shard-00002.safetensors").unlink()
    (tmp_path / "shard-00003.safetensors").write_bytes(b"\xff" * 64)
    dead = tmp_path / f"shard-00000.safetensors.tmp-{_host()}-999999-abc"
    dead.write_bytes(b"partial")
    backend = FakeFeatures()
    report = run_extraction(corpus, tmp_path, meta(), backend)
    assert (report.shards_skipped, report.shards_computed) == (1, 3)
    assert not dead.exists()
    assert [x["aux"].tolist() for x in HiddenStateStore(tmp_path)] == [x["aux"].tolist() for x in reference]


def test_changed_corpus_shard_is_recomputed_not_reused(tmp_path):
    corpus = make_corpus(n_shards=2)
    run_extraction(corpus, tmp_path, meta(), FakeFeatures())
    changed = [corpus[0], make_corpus(seed=9, n_shards=1)[0]]
    report = run_extraction(changed, tmp_path, meta(), FakeFeatures())
    assert (report.shards_skipped, report.shards_computed) == (1, 1)
    assert HiddenStateStore(tmp_path).shard_entries[-1]["sample_ids"] == [s.sample_id for s in changed[1]]


def test_crash_between_rename_and_index_update_is_recovered(tmp_path):
    corpus = make_corpus(n_shards=3)
    run_extraction(corpus, tmp_path, meta(), FakeFeatures())
    index = json.loads((tmp_path / "index.json").read_text())
    del index["shards"]["shard-00002"]  # the file is there, the index never heard of it
    (tmp_path / "index.json").write_text(json.dumps(index))
    backend = FakeFeatures()
    report = run_extraction(corpus, tmp_path, meta(), backend)
    assert backend.calls == 0 and report.shards_skipped == 3
    assert len(HiddenStateStore(tmp_path)) == sum(len(s) for s in corpus)


def test_other_settings_never_mix_into_a_store(tmp_path):
    run_extraction(make_corpus(n_shards=1), tmp_path, meta(), FakeFeatures())
    other = StoreMeta(model_id="fake", hidden_size=H, layers=AuxLayers((1, 3, 4), 7), dtype=torch.float32)
    with pytest.raises(StoreMismatchError, match="layers"):
        run_extraction(make_corpus(n_shards=1), tmp_path, other, FakeFeatures())
    with pytest.raises(StoreMismatchError, match="dtype"):
        run_extraction(make_corpus(n_shards=1), tmp_path, replace(meta(), dtype=torch.bfloat16), FakeFeatures())


def test_bf16_is_the_default_and_halves_the_bytes(tmp_path):
    corpus = make_corpus(n_shards=1)
    m16 = StoreMeta(model_id="fake", hidden_size=H, layers=AuxLayers.default(7))
    assert m16.dtype == torch.bfloat16
    run_extraction(corpus, tmp_path / "a", m16, FakeFeatures())
    run_extraction(corpus, tmp_path / "b", meta(), FakeFeatures())
    item = HiddenStateStore(tmp_path / "a")[0]
    assert item["aux"].dtype == torch.bfloat16
    ref = HiddenStateStore(tmp_path / "b")[0]["aux"]
    assert torch.equal(item["aux"], ref.to(torch.bfloat16))
    assert HiddenStateStore(tmp_path / "a", dtype=torch.float32)[0]["aux"].dtype == torch.float32


def test_plan_batches_respects_the_token_budget():
    lengths = [5, 40, 12, 12, 90, 3, 33]
    batches = plan_batches(lengths, 64)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 64
    assert batches[0] == [4]  # longest first, alone because it exceeds the budget
    assert [lengths[i] for i in batches[1]] == [40]
    assert plan_batches(lengths, 1000, sort_by_length=False) == [list(range(len(lengths)))]


def _host():
    from eagle_assets.durable_files import host_tag

    return host_tag()


def test_no_temporaries_after_a_failed_batch(tmp_path):
    class Boom(FakeFeatures):
        def __call__(self, batch):
            if self.calls == 2:
                raise RuntimeError("GPU fell off the bus")
            return super().__call__(batch)

    with pytest.raises(RuntimeError, match="bus"):
        run_extraction(make_corpus(n_shards=3), tmp_path, meta(), Boom(), max_tokens_per_batch=40)
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers == []
    assert os.path.exists(tmp_path / "index.json")
