"""Offline loader for the Kimi K2 / K2.5 tiktoken tokenizer.

The Hugging Face release ships ``tokenization_kimi.py`` as remote code; we never execute remote
code, so the encoder is rebuilt here from the two data files (``tiktoken.model`` and
``tokenizer_config.json``). Token ids must be exactly the target's, so the construction follows
the published facts: 163,584 BPE ranks, then 256 special/reserved ids. Which files are read is
decided by :mod:`eagle_assets.tokenization.tokenizer_source` (bundled copy, a folder, or the Hub).
"""

import base64
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import tiktoken

from eagle_assets.tokenization.tokenizer_source import (
    TokenizerFilesError,
    require_files,
    resolve_tokenizer_dir,
    verify_checksums,
)

__all__ = ["KimiTokenizer", "TokenizerFilesError", "load_kimi_tokenizer"]

# The Kimi pre-tokenizer pattern (tiktoken ``pat_str``), verbatim from the model's tokenizer.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

NUM_RESERVED_SPECIAL = 256


def _read_ranks(path: Path) -> dict[bytes, int]:
    # Parsed directly instead of via tiktoken.load so that no download cache is ever consulted.
    ranks: dict[bytes, int] = {}
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


@dataclass(frozen=True)
class KimiTokenizer:
    """A tiktoken encoding plus the special-token table of the Kimi chat format."""

    encoding: tiktoken.Encoding
    special_tokens: dict[str, int]
    chat_template: str | None
    directory: Path
    id_to_special: dict[int, str] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode text the model produced: special-looking strings stay ordinary tokens."""
        return self.encoding.encode_ordinary(text)

    def encode_with_special(self, text: str) -> list[int]:
        """Encode template-rendered text, where special strings are markers, not content."""
        return self.encoding.encode(text, allowed_special="all")

    def special_id(self, token: str) -> int:
        try:
            return self.special_tokens[token]
        except KeyError as exc:
            raise KeyError(f"{token!r} is not a Kimi special token") from exc

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    @property
    def eos_id(self) -> int:
        return self.special_tokens["<|im_end|>"]


def load_kimi_tokenizer(source: str | Path | None = None) -> KimiTokenizer:
    """Load the tokenizer from ``source`` (a folder, a Hub repo id, ``bundled``; default: see
    ``resolve_tokenizer_dir``); cached per resolved folder."""
    return _load_cached(str(resolve_tokenizer_dir(source)))


@lru_cache(maxsize=4)
def _load_cached(directory: str) -> KimiTokenizer:
    root = Path(directory)
    require_files(root)
    verify_checksums(root)
    model_file = root / "tiktoken.model"
    config_file = root / "tokenizer_config.json"
    ranks = _read_ranks(model_file)
    config = json.loads(config_file.read_text(encoding="utf-8"))
    n_ranks = len(ranks)
    named = {int(k): v["content"] for k, v in config.get("added_tokens_decoder", {}).items()}
    special_tokens: dict[str, int] = {}
    for token_id in range(n_ranks, n_ranks + NUM_RESERVED_SPECIAL):
        special_tokens[named.get(token_id, f"<|reserved_token_{token_id}|>")] = token_id
    encoding = tiktoken.Encoding(
        name=f"kimi:{root.name}",
        pat_str=KIMI_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens=special_tokens,
    )
    template = config.get("chat_template")
    template_file = root / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")
    return KimiTokenizer(
        encoding=encoding,
        special_tokens=special_tokens,
        chat_template=template,
        directory=root,
        id_to_special={v: k for k, v in special_tokens.items()},
    )
