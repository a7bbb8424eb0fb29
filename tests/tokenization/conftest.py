from pathlib import Path

import pytest

from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer, load_kimi_tokenizer

TOKENIZER_DIR = Path(__file__).parents[2].parent / "shared/tokenizers/kimi-k2.5"


@pytest.fixture(scope="session")
def tok() -> KimiTokenizer:
    if not (TOKENIZER_DIR / "tiktoken.model").is_file():
        pytest.skip(f"Kimi tokenizer files not found at {TOKENIZER_DIR}")
    return load_kimi_tokenizer(TOKENIZER_DIR)
