"""``TargetHead.top_and_columns`` skips the head's all-zero rows and still gives ``forward``'s argmax and columns."""

import torch

from eagle_assets.draft.target import TargetHead
from eagle_assets.draft.ttt import target_distribution


def head_with_zero_rows(vocab: int = 400, hidden: int = 16, live: int = 60, seed: int = 0) -> TargetHead:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.zeros(vocab, hidden)
    rows = torch.randperm(vocab, generator=gen)[:live]
    weight[rows] = torch.randn(live, hidden, generator=gen)
    return TargetHead(weight)


def test_the_live_rows_give_the_full_heads_argmax_and_columns():
    head = head_with_zero_rows()
    gen = torch.Generator().manual_seed(1)
    last = torch.randn(50, 16, generator=gen)
    columns = torch.randperm(400, generator=gen)[:90]
    top, cols = head.top_and_columns(last, columns)
    full = head(last)
    assert torch.equal(top, full.argmax(-1))
    torch.testing.assert_close(cols, full[:, columns])
    assert head._live_rows() is not None  # 85% zero rows: skipped


def test_a_zero_row_wins_when_every_live_logit_is_negative_and_ties_go_to_the_lower_id():
    weight = torch.zeros(8, 2)
    weight[5] = torch.tensor([1.0, 0.0])  # logit = x[0]
    weight[6] = torch.tensor([-1.0, 0.0])  # logit = -x[0]
    weight[7] = torch.tensor([0.0, 1.0])  # logit = x[1]
    head = TargetHead(weight)
    last = torch.tensor([[2.0, -3.0], [0.0, -1.0], [0.0, 0.0]])
    top, cols = head.top_and_columns(last, torch.arange(8))
    assert torch.equal(top, head(last).argmax(-1))
    assert top.tolist() == [5, 0, 0]  # a live row; the first zero row (live best < 0); all zero: the first id
    torch.testing.assert_close(cols, head(last))


def test_a_dense_head_is_computed_as_forward_and_the_loss_inputs_agree():
    gen = torch.Generator().manual_seed(2)
    dense = TargetHead(torch.randn(300, 16, generator=gen))
    assert dense._live_rows() is None
    sparse = head_with_zero_rows(vocab=300)
    last = torch.randn(2, 9, 16, generator=gen)
    used = torch.arange(0, 300, 3)
    for head in (dense, sparse):
        p, top = target_distribution(last, head, used, chunk_tokens=7)
        p_ref, top_ref = target_distribution(last, head.forward, used, chunk_tokens=7)  # a plain callable
        assert torch.equal(top, top_ref)
        torch.testing.assert_close(p, p_ref)
