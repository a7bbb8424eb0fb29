"""The online feature stream on its own: the trainer's order, a bounded lead, errors and the gate before step 1."""

import threading
import time

import pytest
import torch

from eagle_assets.draft.data import SyntheticDataset
from eagle_assets.draft.model import Eagle3Draft
from eagle_assets.draft.online_stream import OnlineFeatureStream, next_position, positions_from
from eagle_assets.draft.run_config import TrainConfig
from eagle_assets.draft.train import Trainer
from eagle_assets.draft.vocab import vocab_from_samples
from tests.draft.helpers import small_config

H = 32


def dataset():
    return SyntheticDataset(12, hidden_size=H, vocab_size=128, length=(8, 14), seed=1)


class StoredFeatures:
    """A per-batch function returning each row's features as a store would hold them, counting its calls."""

    def __init__(self, data, fail_at: int | None = None):
        self.data, self.fail_at, self.calls, self.produced = data, fail_at, 0, []
        self.lock = threading.Lock()

    def __call__(self, rows, indices):
        with self.lock:
            self.calls += 1
            if self.fail_at is not None and self.calls >= self.fail_at:
                raise RuntimeError("the target went away")
            self.produced.append(list(indices))
        return [{"aux": self.data[i]["aux"], "last": self.data[i]["last"]} for i in indices]


def trainer(data, stream, **cfg):
    torch.manual_seed(0)
    draft = Eagle3Draft(small_config(), data.embed_weight)
    draft.set_vocab(vocab_from_samples(data, 128, 64))
    config = TrainConfig(lr=1e-3, batch_size=2, epochs=2, ttt_steps=2, **cfg)
    return Trainer(draft, data, data.target_head(), config, stream=stream, device="cpu")


def test_the_order_helpers_walk_epochs():
    assert next_position((0, 5), 6) == (1, 0) and next_position((1, 2), 6) == (1, 3)
    assert list(positions_from((0, 4), 4, 6)) == [(0, 4), (0, 5), (1, 0), (1, 1)]


def test_online_stream_trains_the_offline_numbers_with_a_bounded_lead():
    data = dataset()
    offline = trainer(data, None).train()
    fn = StoredFeatures(data)
    lead: list[int] = []
    stream = OnlineFeatureStream(data, fn, depth=2)
    tr = trainer(data, stream)
    tr.callback = lambda m: lead.append(len(fn.produced) - m.step)
    online = tr.train()
    assert [m.loss for m in online] == [m.loss for m in offline]  # the same rows, the same features, same order
    assert max(lead) <= 2 + 1  # depth queued + one in the producer's hands
    assert len(fn.produced) == tr.total_steps  # nothing computed twice, nothing beyond the run's end
    assert stream.stats.tokens == sum(m.tokens for m in online) and stream.stats.batches == tr.total_steps


def test_an_error_of_the_target_reaches_the_trainer():
    data = dataset()
    tr = trainer(data, OnlineFeatureStream(data, StoredFeatures(data, fail_at=4), depth=2))
    with pytest.raises(RuntimeError, match="the target went away"):
        tr.train()
    assert tr.global_step == 3


def test_the_gate_sees_the_first_rows_before_any_step():
    data = dataset()
    seen = []

    def gate(first):
        seen.append(sum(len(r) for item in first for r in item.rows))
        raise ValueError("aux_layers FAILED")

    tr = trainer(data, OnlineFeatureStream(data, StoredFeatures(data), gate=gate, gate_rows=3))
    with pytest.raises(ValueError, match="aux_layers FAILED"):
        tr.train()
    assert seen == [4] and tr.global_step == 0 and not tr.optimizer.state  # two batches of 2 rows: >= 3 rows


def test_a_slow_consumer_does_not_grow_the_queue():
    data = dataset()
    fn = StoredFeatures(data)
    stream = OnlineFeatureStream(data, fn, depth=1)
    tr = trainer(data, stream)
    stream.take(tr.micro_batch_rows, (0, 0), tr.total_steps, tr.steps_per_epoch)
    time.sleep(0.3)  # the producer has had time to run far ahead: it may not
    assert len(fn.produced) == 1 + 1 + 1  # the batch taken, one queued, one in the producer's hands
    stream.close()
    assert stream._thread is None
