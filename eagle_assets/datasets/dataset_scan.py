"""One pass over a whole dataset before anything is bought: its format, usable rows, bad rows by reason.

A set whose rows are mostly unreadable (the wrong format named, a broken export) must fail before a
dollar is spent, with counts by reason and the first examples, instead of buying the few rows that
happen to parse. The pass streams (memory does not grow with the set, apart from 16 bytes per row
for the duplicate-id check) and its result is kept on disk by the source's fingerprint, so the
partitions of a 1M-row set pay for it once.

Duplicate ids are found without holding the ids: each row's id is hashed to 64 bits, and after the
pass the (hash, row) pairs are sorted; every later row sharing a hash with an earlier one is a
duplicate (kept: the first). Two different ids colliding in 64 bits has odds of about n²/2⁶⁵
(3·10⁻⁸ for 1M rows).
"""

import hashlib
import json
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle_assets.datasets.formats import RowError, RowFormat
from eagle_assets.datasets.prompts import RowProblem, conversation_of
from eagle_assets.datasets.sources import ResolvedSource
from eagle_assets.durable_files import atomic_write_text
from eagle_assets.errors import DataError

MAX_EXAMPLES = 20
SCAN_VERSION = 1
PROGRESS_EVERY_S = 10.0


class DatasetQualityError(DataError, ValueError):
    """Too many unusable rows (or none usable): the dataset fails before anything is spent."""


@dataclass
class ScanSummary:
    source: str
    format: str
    rows: int = 0
    usable: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason → rows
    examples: list[str] = field(default_factory=list)  # the first problems, with file and line
    duplicates: list[int] = field(default_factory=list)  # row indices dropped as repeated ids (the first kept)
    turns: dict[int, int] = field(default_factory=dict)  # turns asked per usable row → rows
    seconds: float = 0.0

    @property
    def bad(self) -> int:
        return self.rows - self.usable

    @property
    def requests(self) -> int:
        return sum(k * v for k, v in self.turns.items())

    def rejected_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items(), key=lambda kv: -kv[1])) or "none"


def _id_hash(conversation_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(conversation_id.encode(), digest_size=8).digest(), "little")


def scan_dataset(
    source: ResolvedSource,
    fmt: RowFormat,
    mode: str,
    max_turns: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> ScanSummary:
    """Read every row once; count what is usable under ``mode`` and why the rest is not."""
    started = time.monotonic()
    summary = ScanSummary(source.description, fmt.describe())
    rejected: Counter[str] = Counter()
    turns: Counter[int] = Counter()
    hashes, indices = array("Q"), array("q")
    last_note = started
    for row in source.iter_rows():
        summary.rows += 1
        try:
            conv = conversation_of(row, fmt, mode, max_turns)
        except RowError as exc:
            rejected[exc.reason] += 1
            if len(summary.examples) < MAX_EXAMPLES:
                summary.examples.append(str(RowProblem(row.file, row.line, str(exc), exc.reason, source.where(row))))
            continue
        summary.usable += 1
        turns[conv.turn_count] += 1
        hashes.append(_id_hash(conv.conversation_id))
        indices.append(row.index)
        if progress is not None and time.monotonic() - last_note > PROGRESS_EVERY_S:
            last_note = time.monotonic()
            progress(f"scanning {source.description}: {summary.rows:,} rows read, {summary.bad:,} unusable so far")
    duplicates = _later_duplicates(hashes, indices)
    if duplicates:
        rejected["duplicate_id"] += len(duplicates)
        summary.usable -= len(duplicates)
        summary.duplicates = duplicates
        if len(summary.examples) < MAX_EXAMPLES:
            summary.examples.append(f"{len(duplicates)} rows repeat an earlier row's id (first at row {duplicates[0]})")
    summary.rejected = dict(rejected)
    summary.turns = dict(sorted(turns.items()))
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _later_duplicates(hashes: array, indices: array) -> list[int]:
    import numpy as np

    if len(hashes) < 2:
        return []
    h = np.frombuffer(hashes, dtype=np.uint64)
    i = np.frombuffer(indices, dtype=np.int64)
    order = np.lexsort((i, h))  # by hash, then by row: the first row of each run is the one kept
    hs = h[order]
    repeat = np.zeros(len(hs), dtype=bool)
    repeat[1:] = hs[1:] == hs[:-1]
    return sorted(int(x) for x in i[order][repeat])


def check_quality(summary: ScanSummary, max_bad_fraction: float, dataset: str) -> None:
    """Raise when the set is empty, wholly unusable, or has more bad rows than ``max_bad_fraction``."""
    if summary.rows == 0:
        raise DatasetQualityError(f"{dataset}: {summary.source} holds no rows")
    share = summary.bad / summary.rows
    if summary.usable == 0 or share > max_bad_fraction:
        examples = "\n  ".join(summary.examples[:10])
        raise DatasetQualityError(
            f"{dataset}: {summary.bad:,} of {summary.rows:,} rows ({share:.1%}) cannot be used, more than"
            f" max_bad_fraction {max_bad_fraction:.0%}; nothing was sent. Format {summary.format}. By reason:"
            f" {summary.rejected_text()}. First examples:\n  {examples}"
        )


def scan_cache_path(
    cache_dir: Path, dataset: str, source: ResolvedSource, fmt: RowFormat, mode: str, turns: int | None
) -> Path:
    key = hashlib.sha256(
        json.dumps([SCAN_VERSION, source.fingerprint(), fmt.name, sorted(fmt.columns.items()), mode, turns]).encode()
    ).hexdigest()[:20]
    return cache_dir / f"scan-{dataset}-{key}.json"


def load_or_scan(
    cache_dir: Path,
    dataset: str,
    source: ResolvedSource,
    fmt: RowFormat,
    mode: str,
    max_turns: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[ScanSummary, bool]:
    """The scan of this exact source and reading (from disk when done before); True when it was cached."""
    path = scan_cache_path(cache_dir, dataset, source, fmt, mode, max_turns)
    try:
        raw = json.loads(path.read_text())
        raw["turns"] = {int(k): v for k, v in raw["turns"].items()}
        return ScanSummary(**raw), True
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    summary = scan_dataset(source, fmt, mode, max_turns, progress)
    cache_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(summary)))
    return summary, False
