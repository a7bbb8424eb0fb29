"""The tokenized partition: one row per generated sample, with the exact ids the target sees.

Layout: ``<root>/tokenized/<dataset>/<shard>.parquet``, one file per generated partition, rows in
the generated partition's order. Besides the ids, each row carries the figures the validation
checks need, so that those checks are column scans and never re-tokenize:

- ``n_tokens = prompt_len + completion_len = len(input_ids) = len(loss_mask)``;
- ``token_diff = completion_len - api_completion_tokens`` (how far the rebuilt response is from
  what the provider billed; a large aggregate drift means the reconstruction is wrong);
- ``ends_with_eot`` (last id is ``<|im_end|>``) and ``eot_count`` (``<|im_end|>`` ids in the
  completion part): a finished turn has exactly one, at the very end; a cut-off one has none.

``loss_mask`` is ``list[uint8]`` rather than ``list[bool]``: it is read as a 0/1 weight vector
(numpy/torch take uint8 buffers zero-copy, Arrow booleans are bit-packed and must be unpacked), it
sums directly in DuckDB and Arrow, it matches ``Reconstruction.loss_mask`` (ints) and the
hidden-state store's ``loss_mask`` [T] uint8; on disk the difference vanishes, since the mask is a
few long runs that zstd compresses to almost nothing either way.
"""

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import pyarrow as pa

from eagle_assets.corpus.io import DEFAULT_ROW_GROUP_ROWS, DEFAULT_ROW_GROUP_TOKENS, write_parquet_atomic

EOT_ID = 163_586  # <|im_end|>

TOKENIZED_SCHEMA: dict[str, pl.DataType] = {
    "prompt_id": pl.String(),
    "dataset": pl.String(),
    "shard": pl.String(),
    "input_ids": pl.List(pl.Int32()),
    "loss_mask": pl.List(pl.UInt8()),
    "n_tokens": pl.Int32(),
    "prompt_len": pl.Int32(),
    "completion_len": pl.Int32(),
    "api_completion_tokens": pl.Int32(),
    "token_diff": pl.Int32(),
    "finish_reason": pl.String(),
    "provider": pl.String(),
    "ends_with_eot": pl.Boolean(),
    "eot_count": pl.Int32(),
    "native_completion_tokens": pl.Int32(),
}

# The Arrow form written to disk: 32-bit offsets and plain strings (what pyarrow, DuckDB and polars
# all read without a cast), fixed so that the bytes of a file do not depend on who built the table.
ARROW_SCHEMA = pa.schema(
    [
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("prompt_len", pa.int32(), nullable=False),
        pa.field("completion_len", pa.int32(), nullable=False),
        pa.field("api_completion_tokens", pa.int32(), nullable=False),
        pa.field("token_diff", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("provider", pa.string()),
        pa.field("ends_with_eot", pa.bool_(), nullable=False),
        pa.field("eot_count", pa.int32(), nullable=False),
        # The provider's own count from /generation, for the samples where it was fetched (else null).
        pa.field("native_completion_tokens", pa.int32()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)


class ReconstructionLike(Protocol):
    """What ``tokenization.reconstruction.Reconstruction`` provides (kept structural: no tokenizer import).

    Read-only members: a frozen dataclass (or any record) satisfies them, and nothing here writes them.
    """

    @property
    def input_ids(self) -> Sequence[int]: ...
    @property
    def loss_mask(self) -> Sequence[int]: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def completion_len(self) -> int: ...


def tokenized_row(
    recon: ReconstructionLike,
    *,
    prompt_id: str,
    dataset: str,
    shard: str,
    api_completion_tokens: int,
    finish_reason: str | None,
    provider: str | None,
    eot_id: int = EOT_ID,
    native_completion_tokens: int | None = None,
) -> dict[str, Any]:
    """One row, its derived columns computed here so that every writer derives them the same way."""
    ids = list(recon.input_ids)
    completion = ids[recon.prompt_len :]
    return {
        "prompt_id": prompt_id,
        "dataset": dataset,
        "shard": shard,
        "input_ids": ids,
        "loss_mask": list(recon.loss_mask),
        "n_tokens": len(ids),
        "prompt_len": recon.prompt_len,
        "completion_len": recon.completion_len,
        "api_completion_tokens": api_completion_tokens,
        "token_diff": recon.completion_len - api_completion_tokens,
        "finish_reason": finish_reason,
        "provider": provider,
        "ends_with_eot": bool(ids) and ids[-1] == eot_id,
        "eot_count": completion.count(eot_id),
        "native_completion_tokens": native_completion_tokens,
    }


def to_arrow(rows: Iterable[Mapping[str, Any]] | pl.DataFrame | pa.Table) -> pa.Table:
    """Rows (dicts), a polars frame or an Arrow table, as a table of exactly ``ARROW_SCHEMA``.

    Missing or extra columns are an error, not silently filled or dropped: a partition that lacks a
    column would pass a scan that never looks at it.
    """
    if isinstance(rows, pl.DataFrame):
        rows = rows.to_arrow()
    if isinstance(rows, pa.Table):
        missing = [c for c in COLUMNS if c not in rows.column_names]
        extra = [c for c in rows.column_names if c not in COLUMNS]
        if missing or extra:
            raise ValueError(f"tokenized rows: missing columns {missing}, unexpected columns {extra}")
        return _no_nulls(rows.select(list(COLUMNS)).cast(ARROW_SCHEMA))
    rows = list(rows)
    for i, row in enumerate(rows):
        if set(row) != set(COLUMNS):
            missing = sorted(set(COLUMNS) - set(row))
            extra = sorted(set(row) - set(COLUMNS))
            raise ValueError(f"tokenized row {i}: missing columns {missing}, unexpected columns {extra}")
    return _no_nulls(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA))


def _no_nulls(table: pa.Table) -> pa.Table:
    # ``from_pylist`` accepts nulls in a non-nullable field without complaint; the file must not.
    bad = [f.name for f in ARROW_SCHEMA if not f.nullable and table.column(f.name).null_count]
    if bad:
        raise ValueError(f"tokenized rows: nulls in required columns {bad}")
    return table


def write_tokenized(
    path: Path,
    rows: Iterable[Mapping[str, Any]] | pl.DataFrame | pa.Table,
    *,
    row_group_tokens: int = DEFAULT_ROW_GROUP_TOKENS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
) -> int:
    """Write one tokenized partition atomically (tmp + fsync + rename); returns the row count."""
    table = to_arrow(rows)
    write_parquet_atomic(Path(path), table, row_group_tokens=row_group_tokens, row_group_rows=row_group_rows)
    return table.num_rows
