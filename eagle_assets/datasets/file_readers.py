"""Read prompt files row by row without holding them: JSONL (plain, ``.gz``, ``.zst``) and Parquet.

A real prompt set is hundreds of thousands of conversations; reading one whole into memory to cut a
shard of a thousand would make peak memory grow with the file. So every reader here streams: JSONL
line by line through the decompressor, Parquet one row group at a time, and only the rows asked for
are parsed (``wanted``). Rows are numbered by their ordinal among the file's non-blank rows, the
number shards are cut on, so a bad or blank row never shifts the shards after it.

A UTF-8 byte-order mark at the start of a JSONL file is dropped: editors on Windows write one, and it
must not turn the first row into "invalid JSON".
"""

import gzip
import io
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from eagle_assets.errors import DataError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES
UTF8_BOM = b"\xef\xbb\xbf"
# JSON Lines files that end in ``.json`` are common on the Hub (``train.json`` holding one object per line);
# a ``.json`` file holding one array is not streamable and is refused with that reason.
LOOSE_JSONL_SUFFIXES = (".json",)


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


def file_kind(path: Path | str) -> str:
    """``jsonl`` or ``parquet``; anything else is refused with the suffixes that are understood."""
    name = str(path).lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(JSONL_SUFFIXES + LOOSE_JSONL_SUFFIXES):
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


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every non-blank line, the byte-order mark of the first line removed."""
    try:
        with _open_jsonl(path) as f:
            first = True
            for lineno, line in enumerate(f, start=1):
                if first:
                    first = False
                    if line.startswith(UTF8_BOM):
                        line = line[len(UTF8_BOM) :]
                    if line.lstrip().startswith(b"["):
                        raise PromptFileError(
                            f"{path}: holds a JSON array, not JSON Lines (one object per line); convert it with"
                            " `jq -c '.[]'`"
                        )
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise PromptFileError(f"prompt file not found: {path}") from None
        raise PromptFileError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # zstandard.ZstdError and friends: a damaged compressed file
        if isinstance(exc, PromptFileError):
            raise
        raise PromptFileError(f"{path}: cannot be decompressed ({type(exc).__name__}: {exc})") from exc


def _decode_json_line(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return ValueError(f"invalid JSON: {exc}")


def count_file_rows(path: Path) -> int:
    """Rows without parsing them: the Parquet footer, or the non-blank lines of a JSONL file."""
    if file_kind(path) == "parquet":
        return _parquet_file(path).metadata.num_rows
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
