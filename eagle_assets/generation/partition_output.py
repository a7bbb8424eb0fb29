"""Journal → Parquet for a finished partition, written atomically so readers never see half a file."""

import os
from pathlib import Path

from eagle_assets.generation.journal import read_records
from eagle_assets.generation.records import records_to_frame


def write_partition_parquet(journal_path: Path, out_path: Path) -> int:
    records = read_records(journal_path)
    frame = records_to_frame(records)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(f".parquet.tmp{os.getpid()}")
    frame.write_parquet(tmp, compression="zstd")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(out_path)
    return frame.height
