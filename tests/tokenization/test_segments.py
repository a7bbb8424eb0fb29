"""Cut points of the serving tokenizer: specials, and the Kimi ``encode`` guard on very long runs."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_assets.tokenization.segments import (
    MAX_CHUNK_CHARS,
    MAX_RUN_CHARS,
    encode_segments,
    serving_segments,
    split_long_runs,
)


def upstream_style_runs(s: str, limit: int) -> list[str]:
    """A character loop with the rules of the release's ``_split_whitespaces_or_nonwhitespaces``."""
    out = []
    run_len = 0
    in_space = s[0].isspace() if s else False
    start = 0
    for i, ch in enumerate(s):
        if ch.isspace() != in_space:
            in_space, run_len = ch.isspace(), 1
        else:
            run_len += 1
            if run_len > limit:
                out.append(s[start:i])
                start, run_len = i, 1
    out.append(s[start:])
    return out


_run_text = st.lists(
    st.one_of(
        st.text(st.sampled_from(" \t\n\u3000\x1c\x85\xa0"), min_size=1, max_size=12),
        st.text(st.sampled_from("ab<|>é你"), min_size=1, max_size=12),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_run_text, limit=st.integers(1, 6))
def test_long_run_cuts_follow_the_release(text, limit):
    assert split_long_runs(text, limit) == upstream_style_runs(text, limit)


def reference_serving_ids(tok, text: str) -> list[int]:
    """Transformers' added-token split, then the Kimi encode's chunking, then tiktoken with all specials."""
    named = [n for n in tok.special_tokens if not n.startswith("<|reserved_token_")]
    pieces = re.split("(" + "|".join(map(re.escape, named)) + ")", text)
    ids: list[int] = []
    for piece in pieces:
        if piece in tok.special_tokens:
            ids.append(tok.special_tokens[piece])
            continue
        for i in range(0, len(piece), MAX_CHUNK_CHARS):
            for part in upstream_style_runs(piece[i : i + MAX_CHUNK_CHARS], MAX_RUN_CHARS):
                ids += tok.encode_with_special(part)
    return ids


def test_long_prompt_text_is_cut_like_the_release(tok):
    blob = "QUJD" * 9_000  # 36,000 characters without whitespace: cut once, at 25,000
    text = f"<|im_user|>user<|im_middle|>{blob}<|reserved_token_163700|>{' ' * 26_000}x<|im_end|>{'é' * 30_000}"
    ids = encode_segments(tok, serving_segments(tok, text))
    assert ids == reference_serving_ids(tok, text)
    assert ids != tok.encode_with_special(text)  # the cuts change the BPE merges: they matter
    assert tok.decode(ids) == text
    assert tok.special_tokens["<|reserved_token_163700|>"] in ids


def test_short_text_is_plain_tiktoken(tok):
    text = "a<|im_end|>b <|reserved_token_163700|> [EOS]" * 100
    assert encode_segments(tok, serving_segments(tok, text)) == tok.encode_with_special(text)


def test_chunks_of_very_long_pieces(tok):
    # Over 400,000 characters: the piece is cut into chunks first, and the run counter restarts per chunk.
    text = ("words " * 70_000) + "z" * 30_000  # the 400,000th character falls inside a word
    assert len(text) > MAX_CHUNK_CHARS
    ids = encode_segments(tok, serving_segments(tok, text))
    assert ids == reference_serving_ids(tok, text) and ids != tok.encode_with_special(text)
