import pytest
import torch

from eagle_assets.hidden_states.extract_hf import extract_hf
from eagle_assets.hidden_states.store import HiddenStateStore
from eagle_assets.hidden_states.store_format import StoreError
from eagle_assets.hidden_states.store_set import StoreSet
from tests.draft.helpers import TINY_AUX, tiny_llama


def _rows(prefix: str, n: int, length: int):
    g = torch.Generator().manual_seed(len(prefix) + n)
    return [
        {
            "sample_id": f"{prefix}{i}",
            "input_ids": torch.randint(0, 128, (length + i,), generator=g).tolist(),
            "loss_mask": [1] * (length + i),
        }
        for i in range(n)
    ]


def test_partitions_read_as_one_dataset_in_the_order_given(tmp_path):
    model = tiny_llama()
    for key, n in (("train-00000", 3), ("train-00001", 2)):
        extract_hf(
            model, {key: _rows(key, n, 6)}, tmp_path / key, layers=TINY_AUX, dtype=torch.float32, check_space=False
        )
    s = StoreSet(tmp_path, partitions=["train-00001", "train-00000"])
    assert len(s) == 5 and s.n_tokens == (6 + 7) + (6 + 7 + 8)
    assert torch.equal(s[0]["aux"], HiddenStateStore(tmp_path / "train-00001")[0]["aux"])
    assert torch.equal(s[4]["input_ids"], HiddenStateStore(tmp_path / "train-00000")[2]["input_ids"])
    assert torch.equal(s[-1]["input_ids"], s[4]["input_ids"])
    assert set(s.fingerprints()) == {"train-00000", "train-00001"}
    with pytest.raises(IndexError):
        s[5]
    with pytest.raises(StoreError, match=r"no index\.json"):
        StoreSet(tmp_path, partitions=["train-00002"])
