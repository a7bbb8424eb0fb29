import json
import math

import pytest
import torch

from eagle_assets.draft.data import StoreDataset, SyntheticDataset, TokenDataset, global_batch_indices
from eagle_assets.draft.model import Eagle3Draft
from eagle_assets.draft.train import LATEST, TrainConfig, Trainer, latest_checkpoint, lr_lambda
from eagle_assets.draft.vocab import vocab_from_samples
from tests.draft.helpers import TINY_AUX, HFTargetFeatures, draft_for, hf_target_head, small_config, tiny_llama


def _data(n: int = 24) -> SyntheticDataset:
    return SyntheticDataset(n, hidden_size=32, vocab_size=128, length=(8, 14), seed=3)


def _model(data: SyntheticDataset, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    m = Eagle3Draft(small_config(), data.embed_weight)
    m.set_vocab(vocab_from_samples(data, 128, 64))
    return m


def _trainer(data, tmp=None, **kw) -> Trainer:
    cfg = dict(lr=3e-3, batch_size=4, epochs=2, ttt_steps=3, warmup_ratio=0.1)
    if tmp is not None:
        cfg.update(checkpoint_dir=str(tmp), checkpoint_every=3)
    cfg.update(kw)
    return Trainer(_model(data), data, data.target_head(), TrainConfig(**cfg))


def test_loss_decreases():
    data = _data(32)
    tr = _trainer(data, epochs=8, batch_size=8)
    before = tr.evaluate(data)
    hist = tr.train()
    after = tr.evaluate(data)  # on a fixed set: per-batch losses are too noisy to compare
    assert len(hist) == 32
    assert after.loss < 0.9 * before.loss
    assert after.acc[0] > before.acc[0] + 0.1 and after.sim_tau > before.sim_tau
    m = hist[-1]
    assert len(m.acc) == 3 and m.sim_tau == pytest.approx(1 + m.sim_accept) and m.tokens_per_s > 0


def test_resume_equals_uninterrupted(tmp_path):
    data = _data()
    full = _trainer(data)
    full_hist = full.train()  # 12 steps over 2 epochs

    interrupted = _trainer(data, tmp_path)
    interrupted.train(stop_after=8)  # checkpoints at 3 and 6; "crash" after step 8
    assert json.loads((tmp_path / LATEST).read_text())["step"] == 6
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-00000003.pt", "step-00000006.pt"]

    resumed = _trainer(data, tmp_path)
    assert resumed.resume()
    assert (resumed.global_step, resumed.epoch, resumed.batch_index) == (6, 1, 0)
    rest = resumed.train()
    assert [m.step for m in rest] == list(range(7, 13))
    for a, b in zip(full_hist[6:], rest, strict=True):
        assert a.loss == b.loss and a.acc == b.acc and a.lr == b.lr
    for (name, p), q in zip(full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    sa, sb = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])
    assert latest_checkpoint(tmp_path).name == "step-00000012.pt"  # final state written at the end


def test_resume_refuses_another_run(tmp_path):
    data = _data()
    _trainer(data, tmp_path).train(stop_after=3)
    other = _trainer(data, tmp_path, seed=1)
    with pytest.raises(ValueError, match="shuffle_seed"):
        other.resume()


def test_grad_accumulation_matches_big_batch():
    data = _data()
    a = _trainer(data, batch_size=4, grad_accum=2, epochs=1)
    b = _trainer(data, batch_size=8, epochs=1)
    ha, hb = a.train(), b.train()
    assert len(ha) == len(hb) == 3
    for x, y in zip(ha, hb, strict=True):
        assert x.loss == pytest.approx(y.loss, rel=1e-5)
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


def test_schedule_warmup_then_cosine():
    f = lr_lambda(200, 0.015)  # warmup = 3 steps
    assert [round(f(s), 4) for s in range(4)] == [0.3333, 0.6667, 1.0, 1.0]
    assert f(101) == pytest.approx(0.5 * (1 + math.cos(math.pi * 98 / 197)))
    assert f(199) < 1e-3


def test_data_order_is_a_function_of_seed_and_epoch():
    a = global_batch_indices(20, 8, seed=0, epoch=1, index=1)
    assert a == global_batch_indices(20, 8, seed=0, epoch=1, index=1)
    assert a != global_batch_indices(20, 8, seed=0, epoch=2, index=1)
    assert len(set(global_batch_indices(20, 8, 0, 0, 0) + global_batch_indices(20, 8, 0, 0, 1))) == 16


class _FakeStore:
    """Duck type of HiddenStateStore: __len__/__getitem__ with input_ids, loss_mask (bool), aux, last."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def test_online_features_equal_store_features():
    target = tiny_llama()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in (10, 13, 9, 12):
        ids = torch.randint(0, 512, (n,), generator=gen)
        rows.append({"input_ids": ids, "loss_mask": torch.arange(n) >= 3})
    feats = HFTargetFeatures(target, TINY_AUX)
    store_rows = []
    for r in rows:
        aux, last = feats(r["input_ids"][None])
        store_rows.append({**r, "aux": aux[0].to(torch.bfloat16), "last": last[0].to(torch.bfloat16)})
    cfg = TrainConfig(lr=1e-3, batch_size=2, epochs=1, ttt_steps=2)
    online = Trainer(draft_for(target), TokenDataset(rows), hf_target_head(target), cfg, features=feats)
    offline = Trainer(draft_for(target), StoreDataset(_FakeStore(store_rows), dtype=None), hf_target_head(target), cfg)
    ho, hf = online.train(), offline.train()
    for a, b in zip(ho, hf, strict=True):  # the store keeps bf16 features: close, not equal
        assert a.loss == pytest.approx(b.loss, rel=2e-2)
    with pytest.raises(ValueError):
        StoreDataset(_FakeStore([{**store_rows[0], "aux": store_rows[0]["aux"][:3]}]))[0]


def test_checkpoint_restores_rng_states(tmp_path):
    import random

    import numpy as np

    data = _data()
    tr = _trainer(data, tmp_path)
    tr.train(stop_after=3)  # checkpoint at step 3 records the RNG states after the step
    ref = (torch.rand(3), np.random.rand(), random.random())
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    _trainer(data, tmp_path).resume()
    assert torch.equal(torch.rand(3), ref[0]) and np.random.rand() == ref[1] and random.random() == ref[2]
