"""What one generation partition asks: the dataset's source read, checked and cut down to the shard.

Before anything is spent: the source resolved (a Hub split pinned to its commit), its format detected, the whole
set scanned once (cached) and refused when too many rows are unusable, then the shard's rows read in the shuffled
asking order. A shard that yields nothing is an error naming why, never a partition that "succeeds" with 0 rows.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle_assets.datasets.config import DatasetSpec
from eagle_assets.datasets.dataset_scan import ScanSummary, check_quality, load_or_scan
from eagle_assets.datasets.formats import RowFormat, detect_format
from eagle_assets.datasets.prompts import Prompt
from eagle_assets.datasets.shard_reader import ShardContents, read_shard
from eagle_assets.datasets.sources import ResolvedSource
from eagle_assets.errors import DataError
from eagle_assets.generation.turn_chains import TurnChains

MAX_EXAMPLES_IN_ERROR = 5


class EmptyPartitionError(DataError, ValueError):
    """The shard holds no prompt that can be asked, though the source has rows."""


@dataclass
class PartitionInputs:
    source: ResolvedSource
    format: RowFormat
    scan: ScanSummary
    scan_was_cached: bool
    shard: ShardContents
    mode: str
    prompts: list[Prompt]
    chains: TurnChains | None

    @property
    def requests(self) -> int:
        return len(self.prompts) if self.chains is None else self.chains.total

    def turns_per_row(self) -> dict[int, int]:
        if self.chains is not None:
            return self.chains.turns_per_row()
        return {1: len(self.prompts)} if self.prompts else {}


def scanned_source(
    spec: DatasetSpec, cache_dir: Path, progress: Callable[[str], None] | None = None
) -> tuple[ResolvedSource, RowFormat, ScanSummary, bool]:
    """The source resolved, its format detected and the whole set scanned (cached); refuses a set too broken to use."""
    source = spec.resolve()
    columns, sample = source.columns()
    fmt = detect_format(columns, sample, spec.format, dict(spec.columns))
    scan, cached = load_or_scan(cache_dir, spec.name, source, fmt, spec.regenerate, spec.max_turns, progress)
    check_quality(scan, spec.max_bad_fraction, spec.name)
    return source, fmt, scan, cached


def partition_inputs(
    spec: DatasetSpec, shard_key: str, cache_dir: Path, progress: Callable[[str], None] | None = None
) -> PartitionInputs:
    """Scan (refusing a bad set) and read the shard; raises with the reason on every refusal."""
    source, fmt, scan, cached = scanned_source(spec, cache_dir, progress)
    shard = int(shard_key)
    if shard * spec.shard_size >= scan.rows:
        raise EmptyPartitionError(
            f"{spec.name}/{shard_key}: past the end of {source.description} ({scan.rows:,} rows,"
            f" {spec.shard_size:,} per shard): the source shrank since the partitions were listed; reload the"
            " definitions"
        )
    contents = read_shard(
        source,
        fmt,
        spec.row_order(scan.rows),
        shard,
        spec.shard_size,
        spec.regenerate,
        spec.max_turns,
        frozenset(scan.duplicates),
    )
    if not contents.conversations:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(contents.rejected().items())) or "none readable"
        first = "; ".join(str(p) for p in contents.problems[:MAX_EXAMPLES_IN_ERROR])
        raise EmptyPartitionError(
            f"{spec.name}/{shard_key}: none of the shard's {contents.rows} rows can be asked under"
            f" regenerate={spec.regenerate} (format {fmt.describe()}): {reasons}. First: {first}"
        )
    if spec.regenerate == "every_turn":
        return PartitionInputs(
            source, fmt, scan, cached, contents, spec.regenerate, [], TurnChains(contents.conversations)
        )
    prompts = [c.prompt() for c in contents.conversations]
    return PartitionInputs(source, fmt, scan, cached, contents, spec.regenerate, prompts, None)
