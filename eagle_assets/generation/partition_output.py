"""Journal → Parquet for a finished partition, replaced atomically so readers never see half a file."""

from pathlib import Path

from eagle_assets.durable_files import atomic_file
from eagle_assets.generation.journal import read_records
from eagle_assets.generation.records import records_to_frame


def write_partition_parquet(journal_path: Path, out_path: Path) -> int:
    frame = records_to_frame(read_records(journal_path))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out_path, "wb") as f:
        frame.write_parquet(f, compression="zstd")
    return frame.height
