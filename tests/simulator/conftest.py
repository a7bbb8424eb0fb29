"""The module-scoped fixtures the simulator tests share (helpers and constants are in ``sim_helpers``)."""

import pytest

from eagle_assets.tokenization.kimi_tokenizer import load_kimi_tokenizer


@pytest.fixture(scope="module")
def tk():
    return load_kimi_tokenizer("bundled")
