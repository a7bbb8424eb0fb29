"""Merge the tokenized partitions of B1–B8 into one deduplicated, shuffled, sharded training corpus.

Layout of the output directory::

    index.json                  counts, tokens, config, seed, plan key, sources with fingerprints, shards
    train/shard-00000.parquet   rows of the tokenized schema, in shuffled order
    eval/shard-00000.parquet

Why it works the way it does:

- **Bounded memory.** The token lists never sit in memory together (60M tokens is ~300 MB of ids
  and masks, and the corpus grows). A first pass reads only ``prompt_id``, ``n_tokens`` and
  ``completion_len`` (and, for ``dedup_input_ids``, each batch's ids, to hash them) and plans which row
  goes to which output shard at which position. A second pass is an external shuffle: each source is
  streamed once and every row appended to its shard's spill file (Arrow IPC, at most
  ``max_open_buckets`` open at once); each spill is then memory-mapped and written out in shuffled
  order, one row group at a time. Peak memory is the per-sample plan, one source batch and one row
  group; the spill pages sit in the reclaimable page cache (figures: docs/benchmarks.md, bench_corpus).
- **Deterministic.** The shuffle key of a sample is a hash of ``(seed, prompt_id)``, so the order
  depends neither on the order sources are listed in nor on batch sizes; eval takes the first
  samples in that order. Duplicates keep their first copy in (dataset, shard, row) order. Output
  files depend only on their rows and the config, so a rerun gives byte-identical shards.
- **Resumable.** Every shard is written atomically and carries its plan key (a hash of the config
  and the sources' content fingerprints) and name in its Parquet metadata. A rerun whose plan key
  matches the index does nothing; after a crash, shards already written for the same plan are kept
  and only the missing ones are built. Shards no longer in the plan are removed; ``index.json`` is
  written last, so it only ever describes a complete corpus.
"""

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eagle_assets.corpus.io import (
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_ROW_GROUP_TOKENS,
    file_fingerprint,
    row_group_bounds,
    with_metadata,
    write_row_groups_atomic,
)
from eagle_assets.corpus.tokenized_schema import ARROW_SCHEMA, COLUMNS
from eagle_assets.durable_files import atomic_write_bytes
from eagle_assets.generation.folder_lease import exclusive

CORPUS_FORMAT = "eagle-forge-corpus"
CORPUS_FORMAT_VERSION = 1
DEFAULT_DATASETS: tuple[str, ...] = tuple(f"B{i}" for i in range(1, 9))
INDEX_NAME = "index.json"
SPLITS: tuple[str, ...] = ("train", "eval")
PLAN_KEY_META = "eagle_forge.plan_key"
SHARD_META = "eagle_forge.shard"
_POS = "__corpus_pos"
_LOCK_NAME = ".merge.lock"
# A merge takes minutes: a second one waits this long for the first (then finds the corpus current).
MERGE_LEASE_WAIT_S = 3600.0


@dataclass(frozen=True, slots=True)
class MergeConfig:
    """What the corpus is (everything before ``batch_rows``) and how it is built (the rest).

    ``eval_count``, when given, wins over ``eval_fraction``. A shard holds at most
    ``max_samples_per_shard`` samples and ``max_tokens_per_shard`` tokens (a longer sample stands alone).
    """

    seed: int = 0
    eval_fraction: float = 0.01
    eval_count: int | None = None
    max_samples_per_shard: int = 50_000
    max_tokens_per_shard: int = 16_000_000
    dedup_input_ids: bool = False
    row_group_tokens: int = DEFAULT_ROW_GROUP_TOKENS
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    compression: str = "zstd"
    # Tuning: never changes a byte of the output.
    batch_rows: int = 1024
    max_open_buckets: int = 64

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.eval_count is not None and self.eval_count < 0:
            raise ValueError(f"eval_count must be >= 0, got {self.eval_count}")
        for name in ("max_samples_per_shard", "max_tokens_per_shard", "batch_rows", "max_open_buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    def identity(self) -> dict[str, Any]:
        tuning = {"batch_rows", "max_open_buckets"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in tuning}


@dataclass(frozen=True, slots=True)
class SourcePartition:
    path: Path
    dataset: str
    shard: str
    rows: int
    bytes: int
    fingerprint: str


@dataclass(frozen=True, slots=True)
class MergeResult:
    out_dir: Path
    index: dict[str, Any]
    skipped: bool
    written: list[str] = field(default_factory=list)

    def shards(self, split: str) -> list[Path]:
        return [self.out_dir / s["file"] for s in self.index["splits"][split]["shards"]]


@dataclass(slots=True)
class _Samples:
    """The per-sample plan, in (source, row) order: a few numbers per sample, never tokens."""

    src: np.ndarray
    row: np.ndarray
    n_tokens: np.ndarray
    completion_len: np.ndarray
    key: np.ndarray
    input_rows: int
    duplicate_prompt_id: int
    duplicate_input_ids: int


@dataclass(frozen=True, slots=True)
class _Shard:
    split: str
    name: str  # relative to the output directory
    samples: np.ndarray  # indices into _Samples, in output order


def find_partitions(tokenized_root: Path, datasets: Sequence[str] = DEFAULT_DATASETS) -> list[Path]:
    """``<root>/<dataset>/<shard>.parquet`` for the given datasets (temporaries, dot-files, skipped)."""
    root = Path(tokenized_root)
    return [p for ds in datasets for p in sorted((root / ds).glob("*.parquet")) if not p.name.startswith(".")]


def describe_sources(paths: Sequence[Path]) -> list[SourcePartition]:
    """Sources in canonical (dataset, shard, path) order, with row counts and content fingerprints."""
    out = []
    for p in paths:
        path = Path(p)
        out.append(
            SourcePartition(
                path=path,
                dataset=path.parent.name,
                shard=path.stem,
                rows=pq.read_metadata(path).num_rows,
                bytes=path.stat().st_size,
                fingerprint=file_fingerprint(path),
            )
        )
    return sorted(out, key=lambda s: (s.dataset, s.shard, str(s.path)))


def plan_key(sources: Sequence[SourcePartition], config: MergeConfig) -> str:
    """Names the corpus by what it is made of: content of the sources (not their paths) and the config."""
    doc = {
        "format": CORPUS_FORMAT,
        "version": CORPUS_FORMAT_VERSION,
        "config": config.identity(),
        "sources": [[s.dataset, s.shard, s.rows, s.fingerprint] for s in sources],
    }
    return hashlib.blake2b(json.dumps(doc, sort_keys=True).encode(), digest_size=16).hexdigest()


def read_index(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(out_dir) / INDEX_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _shuffle_key(seed_bytes: bytes, prompt_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(seed_bytes + prompt_id.encode(), digest_size=8).digest(), "little")


def _scan(sources: Sequence[SourcePartition], config: MergeConfig) -> _Samples:
    seed_bytes = config.seed.to_bytes(16, "little", signed=True)
    columns = ["prompt_id", "n_tokens", "completion_len"] + (["input_ids"] if config.dedup_input_ids else [])
    seen_ids: set[str] = set()
    seen_hashes: set[bytes] = set()
    parts: dict[str, list[np.ndarray]] = {"src": [], "row": [], "n_tokens": [], "completion_len": [], "key": []}
    dup_id = dup_ids = input_rows = 0
    for s, source in enumerate(sources):
        pf = pq.ParquetFile(source.path)
        start = 0
        for batch in pf.iter_batches(batch_size=config.batch_rows, columns=columns):
            ids = batch.column("prompt_id").to_pylist()
            if None in ids:
                raise ValueError(f"{source.path}: null prompt_id (run the tokenized checks first)")
            keep = np.ones(len(ids), dtype=bool)
            for i, pid in enumerate(ids):
                if pid in seen_ids:
                    keep[i] = False
                    dup_id += 1
                else:
                    seen_ids.add(pid)  # a repeat within this batch is a duplicate too
            if config.dedup_input_ids:
                arr = batch.column("input_ids").cast(pa.list_(pa.int32()))
                offsets = arr.offsets.to_numpy()
                values = arr.values.to_numpy(zero_copy_only=False)
                for i in np.nonzero(keep)[0].tolist():
                    digest = hashlib.blake2b(values[offsets[i] : offsets[i + 1]].tobytes(), digest_size=16).digest()
                    if digest in seen_hashes:
                        keep[i] = False
                        dup_ids += 1
                    else:
                        seen_hashes.add(digest)
            kept = np.nonzero(keep)[0]
            parts["src"].append(np.full(len(kept), s, dtype=np.int32))
            parts["row"].append(kept.astype(np.int64) + start)
            parts["n_tokens"].append(batch.column("n_tokens").to_numpy(zero_copy_only=False)[kept].astype(np.int64))
            comp = batch.column("completion_len").to_numpy(zero_copy_only=False)
            parts["completion_len"].append(comp[kept].astype(np.int64))
            keys = [_shuffle_key(seed_bytes, ids[i]) for i in kept.tolist()]
            parts["key"].append(np.asarray(keys, dtype=np.uint64))
            start += batch.num_rows
            input_rows += batch.num_rows
    dtypes = {"src": np.int32, "row": np.int64, "n_tokens": np.int64, "completion_len": np.int64, "key": np.uint64}
    arrays = {k: np.concatenate(v) if v else np.zeros(0, dtype=dtypes[k]) for k, v in parts.items()}
    return _Samples(
        **arrays,
        input_rows=input_rows,
        duplicate_prompt_id=dup_id,
        duplicate_input_ids=dup_ids,
    )


def _plan_shards(samples: _Samples, config: MergeConfig) -> list[_Shard]:
    # Ties of the 64-bit key (vanishingly rare) fall back to (source, row): still deterministic.
    order = np.lexsort((samples.row, samples.src, samples.key))
    n = len(order)
    n_eval = config.eval_count if config.eval_count is not None else round(config.eval_fraction * n)
    n_eval = min(n_eval, n)
    shards: list[_Shard] = []
    for split, idx in (("train", order[n_eval:]), ("eval", order[:n_eval])):
        if len(idx) == 0:
            continue
        bounds = row_group_bounds(samples.n_tokens[idx], config.max_tokens_per_shard, config.max_samples_per_shard)
        for i, (a, b) in enumerate(bounds):
            shards.append(_Shard(split, f"{split}/shard-{i:05d}.parquet", idx[a:b]))
    return shards


def _shard_is_current(path: Path, key: str, shard: _Shard) -> bool:
    try:
        meta = pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return False
    kv = meta.metadata or {}
    return (
        kv.get(PLAN_KEY_META.encode()) == key.encode()
        and kv.get(SHARD_META.encode()) == shard.name.encode()
        and meta.num_rows == len(shard.samples)
    )


def _conform(batch: pa.RecordBatch) -> pa.Table:
    """Any writer's tokenized rows (polars writes large lists and strings) as exactly ``ARROW_SCHEMA``."""
    return pa.Table.from_batches([batch]).select(list(COLUMNS)).cast(ARROW_SCHEMA)


def _spill(
    sources: Sequence[SourcePartition],
    samples: _Samples,
    shards: Sequence[_Shard],
    group: Sequence[int],
    spill_dir: Path,
    config: MergeConfig,
) -> None:
    """Stream every source once, appending each row of a shard in ``group`` to that shard's spill file."""
    n_sources = len(sources)
    dest = [np.full(s.rows, -1, dtype=np.int32) for s in sources]
    pos = [np.zeros(s.rows, dtype=np.int32) for s in sources]
    for b in group:
        idx = shards[b].samples
        for s in np.unique(samples.src[idx]).tolist():
            mine = idx[samples.src[idx] == s]
            rows = samples.row[mine]
            dest[s][rows] = b
            pos[s][rows] = np.nonzero(samples.src[idx] == s)[0]
    writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
    sinks: list[pa.NativeFile] = []
    schema = ARROW_SCHEMA.append(pa.field(_POS, pa.int32(), nullable=False))
    try:
        for s in range(n_sources):
            if not (dest[s] >= 0).any():
                continue
            pf = pq.ParquetFile(sources[s].path)
            rg_start = 0
            for rg in range(pf.num_row_groups):
                rg_rows = pf.metadata.row_group(rg).num_rows
                if not (dest[s][rg_start : rg_start + rg_rows] >= 0).any():
                    rg_start += rg_rows  # nothing of this group here: not even decompressed
                    continue
                start = rg_start
                for batch in pf.iter_batches(batch_size=config.batch_rows, row_groups=[rg], columns=list(COLUMNS)):
                    d = dest[s][start : start + batch.num_rows]
                    wanted = np.nonzero(d >= 0)[0]
                    if len(wanted):
                        table = _conform(batch)
                        for b in np.unique(d[wanted]).tolist():
                            take = wanted[d[wanted] == b]
                            part = table.take(pa.array(take)).append_column(
                                schema.field(_POS), pa.array(pos[s][start + take], pa.int32())
                            )
                            if b not in writers:
                                sink = pa.OSFile(str(spill_dir / f"bucket-{b:06d}.arrow"), "wb")
                                sinks.append(sink)
                                # Uncompressed: read back zero-copy from the page cache, not into memory.
                                writers[b] = pa.ipc.new_stream(sink, schema)
                            writers[b].write_table(part)
                    start += batch.num_rows
                rg_start += rg_rows
    finally:
        for w in writers.values():
            w.close()
        for sink in sinks:
            sink.close()


def _gather(batches: Sequence[pa.RecordBatch], starts: np.ndarray, rows: np.ndarray) -> pa.Table:
    """Rows of a many-chunk spill in the given order, copying only those rows.

    Not ``Table.take``: over a chunked list column it first concatenates every chunk, a copy of the
    whole shard; zero-copy one-row slices, combined once, copy just the row group.
    """
    which = np.searchsorted(starts, rows, side="right") - 1
    offsets = rows - starts[which]
    return pa.Table.from_batches(
        [batches[b].slice(o, 1) for b, o in zip(which.tolist(), offsets.tolist(), strict=True)]
    ).combine_chunks()


def _finish_shard(out_dir: Path, spill_dir: Path, b: int, shard: _Shard, key: str, config: MergeConfig) -> None:
    """Order one shard's spill and write it, a row group at a time, from the memory-mapped spill file."""
    spill = spill_dir / f"bucket-{b:06d}.arrow"
    with pa.memory_map(str(spill)) as f:
        # Uncompressed spills are read zero-copy: the shard's bytes stay in the (evictable) page cache.
        batches = list(pa.ipc.open_stream(f))
        sizes = np.array([batch.num_rows for batch in batches], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        positions = np.concatenate([batch.column(_POS).to_numpy() for batch in batches])
        order = np.argsort(positions, kind="stable")
        if not np.array_equal(positions[order], np.arange(len(shard.samples))):
            raise RuntimeError(f"{shard.name}: spill holds {len(positions)} rows, plan has {len(shard.samples)}")
        batches = [batch.drop_columns([_POS]) for batch in batches]
        n_tokens = np.concatenate([batch.column("n_tokens").to_numpy() for batch in batches])[order]
        bounds = row_group_bounds(n_tokens, config.row_group_tokens, config.row_group_rows)
        schema = with_metadata(ARROW_SCHEMA, {PLAN_KEY_META: key, SHARD_META: shard.name})
        write_row_groups_atomic(
            out_dir / shard.name,
            schema,
            (_gather(batches, starts, order[a:z]).replace_schema_metadata(schema.metadata) for a, z in bounds),
            compression=config.compression,
        )
        del batches
    spill.unlink()


def _index(
    key: str,
    config: MergeConfig,
    sources: Sequence[SourcePartition],
    samples: _Samples,
    shards: Sequence[_Shard],
    out_dir: Path,
) -> dict[str, Any]:
    kept = np.bincount(samples.src, minlength=len(sources))
    splits: dict[str, Any] = {}
    for split in SPLITS:
        mine = [s for s in shards if s.split == split]
        entries = [
            {
                "file": s.name,
                "samples": len(s.samples),
                "tokens": int(samples.n_tokens[s.samples].sum()),
                "loss_tokens": int(samples.completion_len[s.samples].sum()),
                "bytes": (out_dir / s.name).stat().st_size,
                "fingerprint": file_fingerprint(out_dir / s.name),
            }
            for s in mine
        ]
        splits[split] = {
            "samples": sum(e["samples"] for e in entries),
            "tokens": sum(e["tokens"] for e in entries),
            "loss_tokens": sum(e["loss_tokens"] for e in entries),
            "shards": entries,
        }
    return {
        "format": CORPUS_FORMAT,
        "version": CORPUS_FORMAT_VERSION,
        "plan_key": key,
        "seed": config.seed,
        "config": config.identity(),
        "counts": {
            "input_samples": samples.input_rows,
            "duplicate_prompt_id": samples.duplicate_prompt_id,
            "duplicate_input_ids": samples.duplicate_input_ids,
            "samples": len(samples.key),
            "tokens": int(samples.n_tokens.sum()),
            "loss_tokens": int(samples.completion_len.sum()),
        },
        "splits": splits,
        "sources": [
            {**{k: v for k, v in asdict(s).items() if k != "path"}, "path": str(s.path), "kept": int(kept[i])}
            for i, s in enumerate(sources)
        ],
    }


def _index_is_complete(index: dict[str, Any], key: str, out_dir: Path) -> bool:
    """Cheap (sizes and footers, no content hash): the index is written only after every shard it lists."""
    if index.get("plan_key") != key:
        return False
    for split in SPLITS:
        for entry in index["splits"][split]["shards"]:
            path = out_dir / entry["file"]
            if not path.is_file() or path.stat().st_size != entry["bytes"]:
                return False
            try:
                kv = pq.read_metadata(path).metadata or {}
            except (OSError, pa.ArrowException):
                return False
            if kv.get(PLAN_KEY_META.encode()) != key.encode():
                return False
    return True


def _remove_stale(out_dir: Path, shards: Sequence[_Shard]) -> None:
    wanted = {s.name for s in shards}
    for split in SPLITS:
        d = out_dir / split
        if not d.is_dir():
            continue
        for p in d.iterdir():
            rel = f"{split}/{p.name}"
            if p.is_file() and rel not in wanted and (p.name.startswith("shard-") or p.name.startswith(".shard-")):
                p.unlink()


def merge_corpus(
    sources: Sequence[Path],
    out_dir: Path,
    config: MergeConfig | None = None,
    *,
    lease_location: str | Path | None = None,
    lease_wait_s: float = MERGE_LEASE_WAIT_S,
) -> MergeResult:
    """Build (or bring up to date) the corpus in ``out_dir`` from the tokenized partition files ``sources``.

    Two merges into one folder would delete each other's shards, so a merge is the folder's only writer on
    every host: its ``flock``, and a lease in the ledger's database (``lease_location``, default the configured
    ledger) that a merge on another host waits for (``lease_wait_s``), checked before each destructive step.
    """
    config = config or MergeConfig()
    out_dir = Path(out_dir)
    if not sources:
        raise ValueError("no tokenized partitions to merge")
    described = describe_sources(sources)
    key = plan_key(described, config)
    what = f"the corpus merge into {out_dir}"
    with exclusive(out_dir, _LOCK_NAME, what=what, location=lease_location, wait_s=lease_wait_s) as lease:
        index = read_index(out_dir)
        if index is not None:
            if _index_is_complete(index, key, out_dir):
                return MergeResult(out_dir, index, skipped=True)
            # From here on the shards change: an index describing the old ones must not survive a crash.
            lease.check()
            (out_dir / INDEX_NAME).unlink()
        samples = _scan(described, config)
        shards = _plan_shards(samples, config)
        pending = [b for b, s in enumerate(shards) if not _shard_is_current(out_dir / s.name, key, s)]
        for stale in out_dir.glob(".spill-*"):
            shutil.rmtree(stale, ignore_errors=True)  # a crashed run's; we hold the lock
        spill_dir = out_dir / f".spill-{key[:12]}"
        spill_dir.mkdir(parents=True, exist_ok=True)
        try:
            for g in range(0, len(pending), config.max_open_buckets):
                group = pending[g : g + config.max_open_buckets]
                lease.check()
                _spill(described, samples, shards, group, spill_dir, config)
                for b in group:
                    _finish_shard(out_dir, spill_dir, b, shards[b], key, config)
        finally:
            shutil.rmtree(spill_dir, ignore_errors=True)
        lease.check()
        _remove_stale(out_dir, shards)
        index = _index(key, config, described, samples, shards, out_dir)
        lease.check()
        atomic_write_bytes(out_dir / INDEX_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    return MergeResult(out_dir, index, skipped=False, written=[shards[b].name for b in pending])
