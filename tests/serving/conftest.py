import json
import sys
from pathlib import Path

import pytest
import torch

from eagle_assets.draft.data import SyntheticDataset
from eagle_assets.draft.export import export_draft
from eagle_assets.draft.model import Eagle3Draft
from eagle_assets.draft.vocab import vocab_from_samples
from tests.draft.helpers import small_config
from tests.serving.fake_engines import ENV

FAKE_LAUNCHER = {
    "sglang": [sys.executable, "-m", "tests.serving.fake_engines", "sglang"],
    "vllm": [sys.executable, "-m", "tests.serving.fake_engines", "vllm"],
}
TARGET_LAYERS = 61


def write_draft(folder: Path) -> Path:
    """A small real export (the loaders check names and shapes, not sizes) for a 61-layer target."""
    data = SyntheticDataset(4, hidden_size=32, vocab_size=128, seed=1)
    torch.manual_seed(0)
    m = Eagle3Draft(small_config(aux_layer_ids=(2, 30, 58), target_num_layers=TARGET_LAYERS), data.embed_weight)
    m.set_vocab(vocab_from_samples(data, 128, 64))
    return export_draft(m, folder)


@pytest.fixture(scope="session")
def draft_export(tmp_path_factory) -> Path:
    return write_draft(tmp_path_factory.mktemp("draft") / "export")


@pytest.fixture(scope="session")
def target_model(tmp_path_factory) -> Path:
    """What the engines read of the target here: its config (the fakes run no model)."""
    folder = tmp_path_factory.mktemp("target")
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": TARGET_LAYERS, "vocab_size": 128}))
    return folder


@pytest.fixture
def fake_behaviour(monkeypatch):
    """Set the fakes' behaviour for servers started in this test (they inherit the environment)."""

    def set_(**kw) -> None:
        monkeypatch.setenv(ENV, json.dumps(kw))

    set_()
    return set_
