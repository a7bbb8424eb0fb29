"""Token ids whose text survives decode → re-encode unchanged, in any sequence.

Tokens that are one space plus ASCII letters and encode back to themselves: each is a complete
pre-tokenizer piece (the pattern splits before every space that precedes a letter), and tiktoken maps
a piece that is itself a token to that token, so any concatenation of them encodes back to the same
ids. The tiny target only ever emits these (its other output rows are zero), which is what makes the
text the simulator returns rebuild into exactly the ids the model produced.
"""

import re
import threading

from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer

_SAFE_TOKEN = re.compile(rb" [A-Za-z]+")
_CACHE: dict[int, tuple[KimiTokenizer, tuple[int, ...]]] = {}
_LOCK = threading.Lock()


def safe_token_ids(tokenizer: KimiTokenizer) -> tuple[int, ...]:
    """Ordinary ids whose text is a space plus ASCII letters and whose encoding is that one id (sorted)."""
    with _LOCK:
        cached = _CACHE.get(id(tokenizer))
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        enc = tokenizer.encoding
        out = []
        for i in range(enc.n_vocab - len(tokenizer.special_tokens)):
            raw = enc.decode_single_token_bytes(i)
            if _SAFE_TOKEN.fullmatch(raw) and enc.encode_ordinary(raw.decode("ascii")) == [i]:
                out.append(i)
        allowed = tuple(out)
        _CACHE[id(tokenizer)] = (tokenizer, allowed)
        return allowed
