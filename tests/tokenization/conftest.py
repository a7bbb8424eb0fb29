import pytest

from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer


@pytest.fixture(scope="session")
def tok() -> KimiTokenizer:
    """The real Kimi K2.5 tokenizer, as the package bundles it."""
    return load_kimi_tokenizer("bundled")
