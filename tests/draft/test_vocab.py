import pytest
import torch

from eagle_assets.draft.vocab import DraftVocab, build_draft_vocab, count_tokens, vocab_from_samples

KIMI_VOCAB = 163_840


def test_top_n_sorted_and_maps_invert():
    counts = torch.zeros(20, dtype=torch.int64)
    counts[[3, 17, 5, 11, 0]] = torch.tensor([10, 9, 8, 7, 1])
    v = build_draft_vocab(counts, 4)
    assert v.used.tolist() == [3, 5, 11, 17]
    assert v.d2t.dtype == torch.int64 and v.t2d.dtype == torch.bool
    assert (torch.arange(4) + v.d2t).tolist() == [3, 5, 11, 17]
    assert int(v.t2d.sum()) == 4 and v.t2d.nonzero().flatten().tolist() == [3, 5, 11, 17]


def test_counts_only_loss_masked_tokens():
    rows = [
        {"input_ids": [1, 2, 2, 3], "loss_mask": [0, 1, 1, 0]},
        {"input_ids": torch.tensor([3, 4]), "loss_mask": torch.tensor([True, True])},
    ]
    c = count_tokens(rows, 8)
    assert c.tolist() == [0, 0, 2, 1, 1, 0, 0, 0]


def test_fewer_distinct_tokens_pad_with_lowest_unseen_ids():
    rows = [{"input_ids": [9, 9, 7], "loss_mask": [1, 1, 1]}]
    v = vocab_from_samples(rows, 12, 5)
    # seen ids first (9, 7), then the lowest unseen ids 0, 1, 2; sorted ascending
    assert v.used.tolist() == [0, 1, 2, 7, 9]
    assert int(v.t2d.sum()) == 5


def test_ties_break_by_lowest_id_and_forced_ids_are_kept():
    counts = torch.tensor([5, 5, 5, 0, 1, 0])
    assert build_draft_vocab(counts, 2).used.tolist() == [0, 1]
    assert build_draft_vocab(counts, 2, force_ids=[5]).used.tolist() == [0, 5]


def test_kimi_sized_map_invariants():
    gen = torch.Generator().manual_seed(0)
    ids = (torch.randn(50_000, generator=gen).abs() * 20_000).long().clamp_max(KIMI_VOCAB - 1)
    v = vocab_from_samples([{"input_ids": ids, "loss_mask": torch.ones_like(ids)}], KIMI_VOCAB, 32_000)
    assert v.t2d.shape == (KIMI_VOCAB,) and int(v.t2d.sum()) == 32_000
    target = torch.arange(32_000) + v.d2t
    assert torch.equal(target, v.used) and bool(v.t2d[target].all())
    assert bool((target[1:] > target[:-1]).all())
    assert torch.equal(DraftVocab.from_d2t(v.d2t, KIMI_VOCAB).used, v.used)


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        build_draft_vocab(torch.zeros(4, dtype=torch.int64), 5)
    with pytest.raises(ValueError):
        count_tokens([{"input_ids": [1, 9], "loss_mask": [1, 1]}], 8)
    with pytest.raises(ValueError):
        DraftVocab(torch.tensor([2, 1]), 4)
