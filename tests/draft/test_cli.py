"""The config-driven entry point in one process: online (tokens + target) and store-backed runs."""

import json

import pytest
import torch

from eagle_assets.draft.data import StoreDataset
from eagle_assets.draft.export import load_draft
from eagle_assets.draft.target import load_target_embeddings, load_target_head
from eagle_assets.draft.train import TrainConfig, Trainer
from eagle_assets.draft.train_cli import load_config, run
from tests.draft.helpers import TINY_AUX, HFTargetFeatures, draft_for, tiny_llama


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target") / "tiny"
    tiny_llama().save_pretrained(path)
    return path


def _rows(n=8, length=12):
    gen = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 512, (length,), generator=gen).tolist(),
            "loss_mask": [0] * 4 + [1] * (length - 4),
        }
        for _ in range(n)
    ]


class RowsFileReader:
    """A store reader resolved by name from the config (stands in for HiddenStateStore)."""

    def __init__(self, path):
        self.rows = torch.load(path, weights_only=True)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def _base(tmp_path, target_dir, data):
    return {
        "seed": 0,
        "target": {"path": str(target_dir), "dtype": "float32"},
        "draft_vocab_size": 128,
        "aux_layer_ids": list(TINY_AUX),
        "data": data,
        "train": {"lr": 1e-3, "batch_size": 2, "epochs": 1, "ttt_steps": 2},
        "output_dir": str(tmp_path / "run"),
        "export": {"dtype": "float32"},
        "log_every": 0,
    }


def test_online_run_exports_a_loadable_draft(tmp_path, target_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in _rows()))
    cfg = _base(tmp_path, target_dir, {"kind": "tokens", "path": str(rows)})
    (tmp_path / "run.yaml").write_text(json.dumps(cfg))  # JSON is valid YAML: exercises the YAML path
    trainer = run(load_config(tmp_path / "run.yaml"), device=torch.device("cpu"))
    assert trainer.global_step == 4
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 4
    draft = load_draft(tmp_path / "run" / "export", embed_weight=load_target_embeddings(target_dir))
    assert torch.equal(draft.lm_head.weight, trainer.model.lm_head.weight)
    assert torch.equal(draft.d2t, trainer.model.d2t)
    # resuming a finished run is a no-op that keeps the weights
    again = run(cfg, device=torch.device("cpu"))
    assert again.global_step == 4 and torch.equal(again.model.fc.weight, trainer.model.fc.weight)


def test_store_run_with_named_reader(tmp_path, target_dir):
    model = tiny_llama()
    feats = HFTargetFeatures(model, TINY_AUX)
    stored = []
    for r in _rows():
        ids = torch.tensor(r["input_ids"])
        aux, last = feats(ids[None])
        stored.append(
            {
                "input_ids": ids,
                "loss_mask": torch.tensor(r["loss_mask"], dtype=torch.bool),
                "aux": aux[0],
                "last": last[0],
            }
        )
    torch.save(stored, tmp_path / "rows.pt")
    data = {"kind": "store", "path": str(tmp_path / "rows.pt"), "reader": f"{__name__}:RowsFileReader"}
    trainer = run(_base(tmp_path, target_dir, data), device=torch.device("cpu"))
    assert trainer.global_step == 4
    # the head loaded from the checkpoint reproduces the model's logits from the stored last state
    head = load_target_head(target_dir)
    torch.testing.assert_close(head(stored[0]["last"]), model(stored[0]["input_ids"][None]).logits[0])


def test_real_hidden_state_store_feeds_the_trainer(tmp_path):
    """Integration with the hidden-state developer's store (skipped while it is absent)."""
    extract = pytest.importorskip("eagle_assets.hidden_states.extract_hf")
    store_mod = pytest.importorskip("eagle_assets.hidden_states.store")
    model = tiny_llama()
    rows = [{"sample_id": f"s{i}", **r} for i, r in enumerate(_rows(6))]
    extract.extract_hf(
        model, [rows[:3], rows[3:]], tmp_path / "hs", layers=TINY_AUX, dtype=torch.float32, check_space=False
    )
    store = store_mod.HiddenStateStore(tmp_path / "hs")
    data = StoreDataset(store)
    assert len(data) == 6 and data[0]["aux"].shape == (12, 3 * 64) and data[0]["loss_mask"].dtype == torch.bool
    hist = Trainer(draft_for(model, 128), data, model.lm_head, TrainConfig(batch_size=2, ttt_steps=2)).train()
    assert len(hist) == 3 and all(torch.isfinite(torch.tensor(m.loss)) for m in hist)
