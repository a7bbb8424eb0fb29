"""One pass over a whole dataset before anything is bought: its format, usable rows, bad rows by reason.

A set whose rows are mostly unreadable (the wrong format named, a broken export) must fail before a
dollar is spent, with counts by reason and the first examples, instead of buying the few rows that
happen to parse. The pass streams (memory does not grow with the set, apart from the duplicate-id
check: 20 bytes per usable row while reading, about 37 at its peak when they are sorted, i.e. ~37 MB
at 1M rows; see benchmarks/bench_datasets.py) and its result is kept on disk by the source's
fingerprint, so the partitions of a 1M-row set pay for it once.

Duplicate ids are found without holding the ids: each row's id is hashed to 64 bits, and after the
pass the (hash, row) pairs are sorted; every later row sharing a hash with an earlier one is a
duplicate (kept: the first). Repeats are counted apart from the unusable rows: they do not count
toward ``max_bad_fraction``, and their turns are not requests. Two different ids colliding in 64 bits
has odds of about n²/2⁶⁵ (3·10⁻⁸ for 1M rows).
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
SCAN_VERSION = 2  # 2: repeated ids counted apart from the bad rows
PROGRESS_EVERY_S = 10.0


class DatasetQualityError(DataError, ValueError):
    """Too many unusable rows (or none usable): the dataset fails before anything is spent."""


@dataclass
class ScanSummary:
    source: str
    format: str
    rows: int = 0
    usable: int = 0  # rows asked for: readable, and the first of their id
    rejected: dict[str, int] = field(default_factory=dict)  # reason → unreadable rows (repeated ids not among them)
    examples: list[str] = field(default_factory=list)  # the first problems, with file and line
    duplicates: list[int] = field(default_factory=list)  # row indices dropped as repeated ids (the first kept)
    duplicate_example: str = ""  # the first repeated row, where it is and which id it repeats
    turns: dict[int, int] = field(default_factory=dict)  # turns asked per usable row → rows
    seconds: float = 0.0

    @property
    def bad(self) -> int:
        """Rows that cannot be used. A repeated id is not one: its conversation is asked once, under its
        first row, so a set that repeats itself is smaller, not broken."""
        return self.rows - self.usable - len(self.duplicates)

    @property
    def requests(self) -> int:
        return sum(k * v for k, v in self.turns.items())

    def rejected_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items(), key=lambda kv: -kv[1])) or "none"

    def duplicates_text(self) -> str:
        if not self.duplicates:
            return "no repeated ids"
        return f"{len(self.duplicates):,} rows repeat an earlier row's id, asked once (first: {self.duplicate_example})"


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
    hashes, indices, turn_counts = array("Q"), array("q"), array("I")
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
        turn_counts.append(conv.turn_count)
        if progress is not None and time.monotonic() - last_note > PROGRESS_EVERY_S:
            last_note = time.monotonic()
            progress(f"scanning {source.description}: {summary.rows:,} rows read, {summary.bad:,} unusable so far")
    repeats = _later_duplicates(hashes, indices)
    if repeats:
        summary.usable -= len(repeats)
        summary.duplicates = sorted(indices[p] for p in repeats)
        for p in repeats:  # a repeat is asked once, so its turns are not requests
            turns[turn_counts[p]] -= 1
        turns = +turns
        summary.duplicate_example = _describe_repeat(source, fmt, mode, max_turns, summary.duplicates[0])
    summary.rejected = dict(rejected)
    summary.turns = dict(sorted(turns.items()))
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _describe_repeat(source: ResolvedSource, fmt: RowFormat, mode: str, max_turns: int | None, index: int) -> str:
    """Where row ``index`` is and the id it repeats, read again (reading stops at that row) because the
    scan keeps hashes, not ids."""
    for row in source.iter_rows(wanted={index}):
        return f"{source.where(row)}, id {conversation_of(row, fmt, mode, max_turns).conversation_id!r}"
    return f"row {index}"


def _later_duplicates(hashes: array, indices: array) -> list[int]:
    """Positions (in the arrays) of the rows whose id hash an earlier row already had."""
    import numpy as np

    if len(hashes) < 2:
        return []
    h = np.frombuffer(hashes, dtype=np.uint64)
    i = np.frombuffer(indices, dtype=np.int64)
    order = np.lexsort((i, h))  # by hash, then by row: the first row of each run is the one kept
    hs = h[order]
    repeat = np.zeros(len(hs), dtype=bool)
    repeat[1:] = hs[1:] == hs[:-1]
    return [int(x) for x in order[repeat]]


def check_quality(summary: ScanSummary, max_bad_fraction: float, dataset: str) -> None:
    """Raise when the set is empty, wholly unusable, or has more bad rows than ``max_bad_fraction``.

    Repeated ids do not count as bad: they are reported (``duplicates_text``) and asked once."""
    if summary.rows == 0:
        raise DatasetQualityError(f"{dataset}: {summary.source} holds no rows")
    share = summary.bad / summary.rows
    if summary.usable == 0 or share > max_bad_fraction:
        examples = "\n  ".join(summary.examples[:10])
        raise DatasetQualityError(
            f"{dataset}: {summary.bad:,} of {summary.rows:,} rows ({share:.1%}) cannot be used, more than"
            f" max_bad_fraction {max_bad_fraction:.0%}; nothing was sent. Format {summary.format}. By reason:"
            f" {summary.rejected_text()}; besides, {summary.duplicates_text()}. First examples:\n  {examples}"
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
