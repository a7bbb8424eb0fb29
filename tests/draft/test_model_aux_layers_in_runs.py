"""A hand-written model's aux layer ids are checked against the target the run names (train_cli._model_config)."""

import pytest

from eagle_assets.draft.run_config import DraftRunConfig
from eagle_assets.draft.train_cli import _model_config
from eagle_assets.target.tiny import build_tiny_target

MODEL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 4,
    "num_kv_heads": 4,
    "head_dim": 16,
    "target_vocab_size": 163_840,
    "draft_vocab_size": 64,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_target(tmp_path_factory.mktemp("t") / "tiny", seed=0)  # 7 layers


def run(tiny_dir, **model):
    data = {"kind": "tokens", "path": "unused.jsonl"}
    return DraftRunConfig.model_validate({"model": {**MODEL, **model}, "data": data, "target": {"path": str(tiny_dir)}})


@pytest.mark.parametrize(("ids", "first_bad"), [((2, 3, 9999), 9999), ((2, 30, 9999), 30), ((2, 3, 7), 7)])
def test_ids_beyond_the_targets_layers_are_refused(tiny_dir, ids, first_bad):
    with pytest.raises(ValueError, match=rf"aux layer index {first_bad} outside 1\.\.6 of a 7-layer target"):
        _model_config(run(tiny_dir, aux_layer_ids=list(ids)))


def test_the_targets_layer_count_is_recorded_and_must_agree(tiny_dir):
    assert _model_config(run(tiny_dir, aux_layer_ids=[2, 3, 4])).target_num_layers == 7
    with pytest.raises(ValueError, match=r"model.target_num_layers is 61, the target at .* has 7 layers"):
        _model_config(run(tiny_dir, aux_layer_ids=[2, 30, 58], target_num_layers=61))
