"""Read prompt files row by row without holding them: JSONL (plain, ``.gz``, ``.zst``), JSON arrays, Parquet.

A real prompt set is hundreds of thousands of conversations; reading one whole into memory to cut a
shard of a thousand would make peak memory grow with the file. So every reader here streams: JSONL
line by line through the decompressor, Parquet one row group at a time, and only the rows asked for
are parsed (``wanted``). Rows are numbered by their ordinal among the file's non-blank rows, the
number shards are cut on, so a bad or blank row never shifts the shards after it.

A UTF-8 byte-order mark at the start of a JSONL file is dropped: editors on Windows write one, and it
must not turn the first row into "invalid JSON".

A file holding one JSON array (ShareGPT's original ``*.json`` files are one array of conversations) is
read element by element with the standard library's ``raw_decode``, from a buffer of about a chunk,
so it streams too; its rows are numbered like JSON Lines rows and located by the line each element
starts on. Unlike JSON Lines it cannot skip unwanted rows unparsed, and one broken element makes the
rest of the file unreadable, which fails the file as a whole (naming the line), not a row.
"""

import codecs
import gzip
import io
import json
import re
from collections.abc import Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from eagle_assets.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# ``.json`` files on the Hub are JSON Lines (``train.json`` holding one object per line) or one JSON array
# (ShareGPT's originals); both are read.
LOOSE_JSONL_SUFFIXES = (".json",)
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + LOOSE_JSONL_SUFFIXES + PARQUET_SUFFIXES
# ``.json`` files that describe a dataset rather than hold its rows (``datasets``' own metadata): a folder
# or a Hub split never reads them as data.
METADATA_JSON_NAMES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})
UTF8_BOM = b"\xef\xbb\xbf"
_ARRAY_CHUNK_CHARS = 1 << 20
# Past this much unparsed text after an element's start, the element is broken (or absurd), not incomplete.
_ARRAY_MAX_ELEMENT_CHARS = 64 << 20
# A first line longer than this cannot be one JSON Lines row starting with "[": it is an array document.
_ARRAY_PEEK_BYTES = 1 << 20
_NOT_WHITESPACE = re.compile(r"[^ \t\n\r]")


class PromptFileError(DataError, ValueError):
    """The prompt file (or folder) is missing or unreadable as a whole."""


@dataclass(frozen=True, slots=True)
class RawRow:
    """One row as stored: ``value`` is the decoded object, or the exception that made it unreadable.

    ``line`` is the 1-based line in a JSONL file, or the 1-based row in a Parquet file; ``index`` the
    ordinal across the whole source (all its files in order)."""

    file: str
    line: int
    index: int
    value: Any

    @property
    def unit(self) -> str:
        return "row" if self.file.endswith(PARQUET_SUFFIXES) else "line"


def is_data_file(name: str) -> bool:
    """Whether a file in a folder or a Hub split holds rows: a supported suffix, and no dataset metadata."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(SUPPORTED_SUFFIXES) and base not in METADATA_JSON_NAMES


def file_kind(path: Path | str) -> str:
    """``jsonl`` or ``parquet``; anything else is refused with the suffixes that are understood."""
    name = str(path).lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(SUPPORTED_SUFFIXES):
        return "jsonl"
    raise PromptFileError(
        f"{path}: unsupported file type (expected one of {', '.join(SUPPORTED_SUFFIXES)}, or a folder of them)"
    )


def _open_jsonl(path: Path) -> BinaryIO | gzip.GzipFile:
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        raw = path.open("rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True), 1 << 20)
    return path.open("rb", buffering=1 << 20)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turns the ways a file fails to read (missing, unreadable, badly compressed) into a named error."""
    try:
        yield
    except PromptFileError:
        raise
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise PromptFileError(f"prompt file not found: {path}") from None
        raise PromptFileError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # zstandard.ZstdError and friends: a damaged compressed file
        raise PromptFileError(f"{path}: cannot be decompressed ({type(exc).__name__}: {exc})") from exc


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every non-blank line, the byte-order mark of the first line removed."""
    with _reading(path), _open_jsonl(path) as f:
        first = True
        for lineno, line in enumerate(f, start=1):
            if first:
                first = False
                line = line.removeprefix(UTF8_BOM)
            if line.strip():
                yield lineno, line


def is_array_document(path: Path) -> bool:
    """Whether the file is one JSON array rather than JSON Lines.

    Both may start with ``[``: a JSON Lines file whose first row is an array has a first line that parses
    on its own and more rows after it (each then rejected as not an object); an array document has a
    first line that is only part of the array, or is the whole file."""
    with _reading(path), _open_jsonl(path) as f:
        head = f.readline(_ARRAY_PEEK_BYTES).removeprefix(UTF8_BOM)
        while head and not head.strip():
            head = f.readline(_ARRAY_PEEK_BYTES)
        if not head.lstrip().startswith(b"["):
            return False
        if len(head) >= _ARRAY_PEEK_BYTES and not head.endswith(b"\n"):
            return True
        try:
            orjson.loads(head)
        except orjson.JSONDecodeError:
            return True
        return not any(line.strip() for line in f)


class _ArrayReader:
    """The elements of one JSON array read from a text stream, holding about a chunk of it at a time."""

    def __init__(self, path: Path, raw: Any) -> None:
        self.path = path
        self.raw = raw
        self.text = codecs.getincrementaldecoder("utf-8-sig")()
        self.decoder = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.line = 1  # the line of ``pos``
        self.eof = False

    def fail(self, what: str) -> PromptFileError:
        return PromptFileError(f"{self.path}: the JSON array is broken at line {self.line}: {what}")

    def fill(self) -> bool:
        """Read more text (at least as much as is held, so a large element costs few re-parses)."""
        if self.eof:
            return False
        data = self.raw.read(max(_ARRAY_CHUNK_CHARS, len(self.buf) - self.pos))
        self.buf = self.buf[self.pos :] + self.text.decode(data, final=not data)
        self.pos = 0
        self.eof = not data
        return True

    def advance(self, to: int) -> None:
        self.line += self.buf.count("\n", self.pos, to)
        self.pos = to

    def next_char(self) -> str:
        """The next character that is not whitespace ("" at the end), without consuming it."""
        while True:
            found = _NOT_WHITESPACE.search(self.buf, self.pos)
            if found is not None:
                self.advance(found.start())
                return self.buf[self.pos]
            self.advance(len(self.buf))
            if not self.fill():
                return ""

    def element(self) -> Any:
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if len(self.buf) - self.pos > _ARRAY_MAX_ELEMENT_CHARS or not self.fill():
                    raise self.fail(exc.msg) from None
                continue
            if end == len(self.buf) and self.fill():
                continue  # a number or literal cut at the chunk's end may go on
            self.advance(end)
            return value

    def items(self) -> Iterator[tuple[int, Any]]:
        if self.next_char() != "[":
            raise self.fail("it does not start with '['")
        self.advance(self.pos + 1)
        if self.next_char() == "]":
            self.advance(self.pos + 1)
        else:
            while True:
                self.next_char()  # to the element's first character, so its line is the one reported
                line = self.line
                yield line, self.element()
                c = self.next_char()
                self.advance(self.pos + 1)
                if c == "]":
                    break
                if c != ",":
                    raise self.fail(f"expected ',' or ']' after the element starting at line {line}, got {c!r}")
        if self.next_char():
            raise self.fail("text follows the array's closing ']'")


def _array_items(path: Path) -> Iterator[tuple[int, Any]]:
    """(line where the element starts, element) for every element of a file holding one JSON array."""
    with _reading(path), _open_jsonl(path) as f:
        yield from _ArrayReader(path, f).items()


def _decode_json_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return ValueError(f"invalid JSON: {exc}")


def count_file_rows(path: Path) -> int:
    """Rows without parsing them: the Parquet footer, or the non-blank lines of a JSONL file."""
    if file_kind(path) == "parquet":
        return _parquet_file(path).metadata.num_rows
    if is_array_document(path):
        return sum(1 for _ in _array_items(path))
    return sum(1 for _ in _jsonl_lines(path))


def _parquet_file(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise PromptFileError(f"prompt file not found: {path}") from None
    except Exception as exc:
        raise PromptFileError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc


def parquet_columns(path: Path) -> list[str]:
    return list(_parquet_file(path).schema_arrow.names)


def iter_file_rows(
    path: Path,
    first_index: int = 0,
    wanted: Container[int] | None = None,
    columns: list[str] | None = None,
    seen: list[int] | None = None,
) -> Iterator[RawRow]:
    """The rows of one file, numbered from ``first_index``; only rows whose index is in ``wanted`` (all when
    None) are decoded and yielded. ``columns`` limits what a Parquet file reads (JSONL rows are whole).
    Once the file is read to its end, its row count is appended to ``seen``."""
    if file_kind(path) == "parquet":
        yield from _iter_parquet(path, first_index, wanted, columns)
        if seen is not None:
            seen.append(_parquet_file(path).metadata.num_rows)
        return
    label = str(path)
    ordinal = 0
    if is_array_document(path):
        for ordinal, (lineno, value) in enumerate(_array_items(path), start=1):
            index = first_index + ordinal - 1
            if wanted is None or index in wanted:
                yield RawRow(label, lineno, index, value)
    else:
        for ordinal, (lineno, line) in enumerate(_jsonl_lines(path), start=1):
            index = first_index + ordinal - 1
            if wanted is None or index in wanted:
                yield RawRow(label, lineno, index, _decode_json_line(line))
    if seen is not None:
        seen.append(ordinal)


def _iter_parquet(
    path: Path, first_index: int, wanted: Container[int] | None, columns: list[str] | None
) -> Iterator[RawRow]:
    pf = _parquet_file(path)
    label = str(path)
    names = set(pf.schema_arrow.names)
    cols = [c for c in columns if c in names] if columns is not None else None
    start = first_index
    for group in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(group).num_rows
        picked = list(range(n)) if wanted is None else [i for i in range(n) if start + i in wanted]
        if picked:
            table = pf.read_row_group(group, columns=cols)
            if len(picked) < n:
                table = table.take(picked)
            for offset, record in zip(picked, table.to_pylist(), strict=True):
                yield RawRow(label, offset + 1 + start - first_index, start + offset, record)
            del table
        start += n
