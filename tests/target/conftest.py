"""One tiny Kimi K2.5 target per session (built once, about 2 s)."""

import pytest
import torch

from eagle_assets.target.loader import load_target
from eagle_assets.target.tiny_kimi import build_tiny_kimi_target


@pytest.fixture(scope="session")
def kimi_dir(tmp_path_factory):
    return build_tiny_kimi_target(tmp_path_factory.mktemp("target") / "tiny-kimi-k25", seed=0)


@pytest.fixture(scope="session")
def kimi_model(kimi_dir):
    return load_target(kimi_dir, "cpu", torch.float32)
