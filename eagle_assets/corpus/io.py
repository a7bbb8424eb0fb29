"""Atomic Parquet writes and content fingerprints shared by the tokenized partitions and the corpus.

Readers (asset checks, the merge, training loaders) may open a file at any time, and a crash may come
at any time: a file is therefore written to a temporary name in the same directory, fsync-ed and
renamed, so that a path either does not exist or holds a complete file. Row groups are cut by token
count as well as rows, because a row group is the unit a Parquet reader holds in memory.
"""

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eagle_assets.durable_files import atomic_path

DEFAULT_ROW_GROUP_TOKENS = 1_000_000
DEFAULT_ROW_GROUP_ROWS = 4096
_FINGERPRINT_CHUNK = 1 << 20


def row_group_bounds(n_tokens: np.ndarray, max_tokens: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, end) row ranges, each within both limits (a row longer than ``max_tokens`` stands alone)."""
    bounds: list[tuple[int, int]] = []
    start, tokens = 0, 0
    for i, n in enumerate(n_tokens.tolist()):
        if i > start and (tokens + n > max_tokens or i - start >= max_rows):
            bounds.append((start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(n_tokens) or not bounds:
        bounds.append((start, len(n_tokens)))
    return bounds


def with_metadata(schema: pa.Schema, metadata: Mapping[str, str] | None) -> pa.Schema:
    if not metadata:
        return schema
    merged = dict(schema.metadata or {})
    merged.update({k.encode(): v.encode() for k, v in metadata.items()})
    return schema.with_metadata(merged)


def write_row_groups_atomic(
    path: Path, schema: pa.Schema, row_groups: Iterable[pa.Table], *, compression: str = "zstd"
) -> int:
    """Write each table of ``row_groups`` as one row group, atomically; returns the file size.

    Groups are consumed one at a time, so a file is never whole in memory. Each group is made one
    contiguous chunk first: the bytes then depend only on the values (not on how they were chunked),
    which is what lets a rerun produce an identical file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Dictionary encoding only for the flat columns: for token ids it needs megabytes of encoder state per
    # column and still loses to plain + zstd (1.57 vs 1.34 bytes/token on Kimi-tokenized text).
    dictionary = [f.name for f in schema if not pa.types.is_list(f.type) and not pa.types.is_large_list(f.type)]
    # The writer closes (its footer written) before ``atomic_path`` fsyncs and renames the file.
    with (
        atomic_path(path) as tmp,
        pq.ParquetWriter(tmp, schema, compression=compression, use_dictionary=dictionary) as writer,
    ):
        for group in row_groups:
            group = group.combine_chunks()
            writer.write_table(group, row_group_size=max(group.num_rows, 1))
    return path.stat().st_size


def write_parquet_atomic(
    path: Path,
    table: pa.Table,
    *,
    row_group_tokens: int = DEFAULT_ROW_GROUP_TOKENS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> int:
    """``table`` in row groups of at most ``row_group_tokens`` tokens and ``row_group_rows`` rows."""
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
    groups = (table.slice(a, b - a) for a, b in row_group_bounds(lengths, row_group_tokens, row_group_rows))
    return write_row_groups_atomic(path, table.schema, groups)


def file_fingerprint(path: Path) -> str:
    """Content hash: a rewrite with the same bytes keeps it, any changed byte changes it (mtime does neither)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(_FINGERPRINT_CHUNK):
            h.update(chunk)
    return h.hexdigest()
