"""The tokenized partition format: derived columns, strict schema, atomic writes, token-bounded row groups."""

import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle_assets import durable_files
from eagle_assets.corpus.tokenized_schema import (
    ARROW_SCHEMA,
    EOT_ID,
    TOKENIZED_SCHEMA,
    to_arrow,
    write_tokenized,
)
from tests.corpus.synthetic import synthetic_tokenized_table

from .helpers import Recon, read_tokenized, tok_row


def test_derived_columns() -> None:
    row = tok_row("a", "stop", recon=Recon(10, 20, ended=True), api_completion_tokens=21)
    assert row["input_ids"][6] == EOT_ID  # a history turn's end, in the prompt
    assert (row["n_tokens"], row["prompt_len"], row["completion_len"]) == (30, 10, 20)
    assert (row["ends_with_eot"], row["eot_count"], row["token_diff"]) == (True, 1, -1)
    cut = tok_row("b", "length", recon=Recon(10, 20, ended=False))
    assert (cut["ends_with_eot"], cut["eot_count"]) == (False, 0)


def test_rows_frames_and_tables_write_the_same_bytes(tmp_path: Path) -> None:
    rows = [tok_row(f"p{i}") for i in range(5)]
    write_tokenized(tmp_path / "rows.parquet", rows)
    frame = read_tokenized(tmp_path / "rows.parquet")
    assert dict(frame.schema) == TOKENIZED_SCHEMA
    write_tokenized(tmp_path / "frame.parquet", frame)
    write_tokenized(tmp_path / "table.parquet", pa.Table.from_pylist(rows))
    data = {(tmp_path / f"{n}.parquet").read_bytes() for n in ("rows", "frame", "table")}
    assert len(data) == 1
    assert pq.read_schema(tmp_path / "rows.parquet").remove_metadata() == ARROW_SCHEMA
    assert frame["loss_mask"].dtype == pl.List(pl.UInt8)


def test_schema_is_strict() -> None:
    row = tok_row("a")
    with pytest.raises(ValueError, match="missing columns \\['eot_count'\\]"):
        to_arrow([{k: v for k, v in row.items() if k != "eot_count"}])
    with pytest.raises(ValueError, match="unexpected columns \\['extra'\\]"):
        to_arrow(pa.Table.from_pylist([{**row, "extra": 1}]))
    with pytest.raises(ValueError, match="nulls in required columns \\['prompt_id'\\]"):
        to_arrow([{**row, "prompt_id": None}])
    with pytest.raises(ValueError, match="input_ids' with null"):  # pyarrow's own refusal, on a cast
        to_arrow(pa.Table.from_pylist([{**row, "input_ids": None}]))


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "B1" / "00000.parquet"
    write_tokenized(path, [tok_row("old")])
    before = path.read_bytes()

    def no_space(fd: int) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(durable_files.os, "fsync", no_space)  # the corpus writes through durable_files
    with pytest.raises(OSError, match="no space"):
        write_tokenized(path, [tok_row("new")])
    assert path.read_bytes() == before  # the old partition is intact, and no temporary is left
    assert os.listdir(path.parent) == ["00000.parquet"]


def test_row_groups_are_bounded_by_tokens(tmp_path: Path) -> None:
    lengths = np.array([300, 300, 300, 1200, 100, 100, 100, 100, 100, 100])
    table = synthetic_tokenized_table(np.random.default_rng(0), len(lengths), lengths=lengths)
    write_tokenized(tmp_path / "t.parquet", table, row_group_tokens=700, row_group_rows=4)
    meta = pq.read_metadata(tmp_path / "t.parquet")
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [2, 1, 1, 4, 2]
    assert pq.read_table(tmp_path / "t.parquet").equals(table)


def test_synthetic_table_is_realistic() -> None:
    table = synthetic_tokenized_table(np.random.default_rng(0), 400)
    n = np.array(table["n_tokens"].to_pylist())
    assert n.min() >= 200 and n.max() <= 8000 and 800 < np.median(n) < 1800
    reasons = set(table["finish_reason"].to_pylist())
    assert reasons == {"stop", "tool_calls", "length"}
    assert sum(table["token_diff"].to_pylist()) == 0 and any(table["token_diff"].to_pylist())
