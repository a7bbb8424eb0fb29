"""Cutting text into ordinary pieces and special ids exactly where the serving tokenizer cuts it.

A rendered chat is encoded as a list of segments: ``str`` pieces (BPE-encoded on their own with
``encode_ordinary``) and ``int`` special ids. tiktoken pre-tokenizes each special-free stretch on
its own, so ids come out right only when the cut points are the real tokenizer's.

vLLM and SGLang tokenize the rendered prompt through transformers (``tokenizer(text)`` or
``apply_chat_template(tokenize=True)``), which runs the release's ``tokenization_kimi.py`` like this:

1. transformers splits the text at its *added tokens* (the 23 named ones of ``added_tokens_decoder``:
   ``<|im_end|>``, ``<think>``, ``[EOS]``, ...), each becoming its id;
2. every piece in between goes to the Kimi ``encode``, which cuts it into 400,000-character chunks
   and cuts each chunk wherever a run of whitespace, or of non-whitespace, reaches 25,000
   characters (upstream's guard against a tiktoken stack overflow);
3. each of those parts is encoded by tiktoken with every special allowed, so the unnamed
   ``<|reserved_token_N|>`` strings become ids as well.

Text under 25,000 characters only goes through step 3, and then the result is exactly
``encode(text, allowed_special="all")``; the cuts of step 2 change BPE merges at the cut points,
so long prompts (a pasted log, a base64 blob) need all three steps to come out the same.
"""

import bisect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from eagle_assets.tokenization.kimi_tokenizer import KimiTokenizer

MAX_CHUNK_CHARS = 400_000
MAX_RUN_CHARS = 25_000
_RESERVED_NAME = re.compile(r"<\|reserved_token_\d+\|>")
_RUNS = re.compile(r"\s+|\S+")

Segment = str | int
"""A piece of an encoded text: ``str`` is ordinary text (encode with ``encode_ordinary``), ``int`` a special id."""


@dataclass(frozen=True)
class _Specials:
    pattern: re.Pattern[str]  # every special (tiktoken's cut points)
    added: re.Pattern[str]  # the named ones only (transformers' added tokens)
    ids: dict[str, int]
    edge_chars: re.Pattern[str]  # first and last characters of any special


def _trie_pattern(words: Sequence[str]) -> str:
    """One regex for a set of literals, factored by common prefix.

    A flat 256-way alternation makes Python's ``re`` try every branch at each ``<``; the trie form
    fails on the first differing character (about 13x faster on prompts). No Kimi special is a
    prefix of another, so at any position at most one can match: the same cut points as tiktoken.
    """
    trie: dict[str, dict] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = "(?:" + "|".join(alts) + ")" if len(alts) > 1 else alts[0]
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


_SPECIALS_CACHE: dict[int, tuple[KimiTokenizer, _Specials]] = {}


def specials_of(tokenizer: KimiTokenizer) -> _Specials:
    """Compiled special-token patterns, once per tokenizer."""
    cached = _SPECIALS_CACHE.get(id(tokenizer))
    if cached is not None and cached[0] is tokenizer:
        return cached[1]
    names = list(tokenizer.special_tokens)
    edges = sorted({n[0] for n in names} | {n[-1] for n in names})
    value = _Specials(
        pattern=re.compile(_trie_pattern(names)),
        added=re.compile(_trie_pattern([n for n in names if not _RESERVED_NAME.fullmatch(n)])),
        ids=dict(tokenizer.special_tokens),
        edge_chars=re.compile("[" + "".join(map(re.escape, edges)) + "]"),
    )
    _SPECIALS_CACHE[id(tokenizer)] = (tokenizer, value)
    return value


def split_at_specials(tokenizer: KimiTokenizer, text: str, data_spans: Sequence[tuple[int, int]] = ()) -> list[Segment]:
    """Cut ``text`` where ``encode(allowed_special="all")`` would, except at matches overlapping ``data_spans``."""
    sp = specials_of(tokenizer)
    starts = [s for s, _ in data_spans]
    out: list[Segment] = []
    pos = 0
    for m in sp.pattern.finditer(text):
        a, b = m.span()
        i = bisect.bisect_left(starts, b) - 1
        if i >= 0 and data_spans[i][1] > a:
            continue  # this special-looking text is (partly) data: it stays ordinary
        if a > pos:
            out.append(text[pos:a])
        out.append(sp.ids[m.group()])
        pos = b
    if pos < len(text):
        out.append(text[pos:])
    return out


def encode_segments(tokenizer: KimiTokenizer, segments: Sequence[Segment]) -> list[int]:
    ids: list[int] = []
    for seg in segments:
        if isinstance(seg, int):
            ids.append(seg)
        else:
            ids.extend(tokenizer.encode_ordinary(seg))
    return ids


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS) -> list[str]:
    """``text`` cut where a whitespace or non-whitespace run reaches ``max_run`` characters, as Kimi's
    ``_split_whitespaces_or_nonwhitespaces`` does (``\\s`` and ``str.isspace`` agree on every character)."""
    if len(text) <= max_run:
        return [text]
    out: list[str] = []
    start = 0
    for run in _RUNS.finditer(text):
        a, b = run.span()
        for cut in range(a + max_run, b, max_run):
            out.append(text[start:cut])
            start = cut
    out.append(text[start:])
    return out


def kimi_encode_parts(text: str) -> list[str]:
    """The parts the Kimi ``encode`` hands to tiktoken one by one (step 2 of the module docstring)."""
    if len(text) <= MAX_RUN_CHARS:
        return [text]
    out: list[str] = []
    for i in range(0, len(text), MAX_CHUNK_CHARS):
        out.extend(split_long_runs(text[i : i + MAX_CHUNK_CHARS]))
    return out


def _piece_segments(tokenizer: KimiTokenizer, piece: str) -> Iterator[Segment]:
    for part in kimi_encode_parts(piece):
        if part:
            yield from split_at_specials(tokenizer, part)


def serving_segments(tokenizer: KimiTokenizer, text: str) -> list[Segment]:
    """``text`` as the serving stack encodes a rendered prompt: every special-token string is its id."""
    if len(text) <= MAX_RUN_CHARS:
        return split_at_specials(tokenizer, text)
    sp = specials_of(tokenizer)
    out: list[Segment] = []
    pos = 0
    for m in sp.added.finditer(text):
        out.extend(_piece_segments(tokenizer, text[pos : m.start()]))
        out.append(sp.ids[m.group()])
        pos = m.end()
    out.extend(_piece_segments(tokenizer, text[pos:]))
    return out


def chunk_ordinary(segments: Sequence[Segment]) -> list[Segment]:
    """Ordinary pieces cut as the Kimi ``encode`` cuts them (step 2); special ids untouched."""
    out: list[Segment] = []
    for seg in segments:
        if isinstance(seg, str) and len(seg) > MAX_RUN_CHARS:
            out.extend(p for p in kimi_encode_parts(seg) if p)
        else:
            out.append(seg)
    return out
