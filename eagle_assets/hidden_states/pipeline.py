"""The backend-independent extraction loop: plan batches, skip finished shards, stream into the store.

A backend only turns a batch of samples into per-sample features (``BatchFn``); this owns what must behave the same
whatever computes them: resume, the disk check, token-budget batches, writes overlapping compute, progress, cleanup.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from eagle_assets.hidden_states.samples import HiddenStateSample, as_sample, input_fingerprint
from eagle_assets.hidden_states.shard_file import ShardWriter
from eagle_assets.hidden_states.store_format import INDEX_NAME, StoreMeta, shard_file_name
from eagle_assets.hidden_states.store_space import check_disk, estimate_store_bytes
from eagle_assets.hidden_states.store_writer import StoreWriter


class BatchFn(Protocol):
    def __call__(self, batch: Sequence[HiddenStateSample]) -> list[dict[str, torch.Tensor]]:
        """Features of each sample (``{"aux": [L, n_aux*H], "last": [L, H]}``), in batch order."""
        ...


@dataclass(frozen=True)
class Progress:
    """What a progress callback sees; ``event`` is ``"batch"`` after every batch, ``"shard"`` after a commit."""

    event: str
    tokens_done: int
    tokens_total: int
    tokens_per_s: float
    shards_done: int
    shard_index: int

    @property
    def fraction(self) -> float:
        return self.tokens_done / self.tokens_total if self.tokens_total else 1.0


@dataclass(frozen=True)
class ExtractReport:
    shards_skipped: int
    shards_computed: int
    tokens_computed: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_computed / self.seconds if self.seconds > 0 else 0.0


ShardsInput = Sequence[Sequence[Any]] | Mapping[str, Sequence[Any]]


def normalize_shards(shards: ShardsInput) -> list[tuple[str, list[HiddenStateSample]]]:
    """Shard keys and samples; a mapping keeps its keys, a sequence is keyed by position."""
    items = shards.items() if isinstance(shards, Mapping) else ((str(i), s) for i, s in enumerate(shards))
    out = []
    for key, samples in items:
        norm = [as_sample(s) for s in samples]
        if not norm:
            raise ValueError(f"corpus shard {key!r} is empty")
        ids = [s.sample_id for s in norm]
        if len(set(ids)) != len(ids):
            raise ValueError(f"corpus shard {key!r} repeats sample ids")
        out.append((str(key), norm))
    return out


def plan_batches(lengths: Sequence[int], max_tokens_per_batch: int, *, sort_by_length: bool = True) -> list[list[int]]:
    """Sample indices in batches of at most ``max_tokens_per_batch`` padded tokens (a longer sample alone). Longest
    first: neighbours of similar length waste little padding, and a budget too large for the device fails at once."""
    if max_tokens_per_batch < 1:
        raise ValueError("max_tokens_per_batch must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)) if sort_by_length else list(range(len(lengths)))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if current and max(longest, n) * (len(current) + 1) > max_tokens_per_batch:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def padded_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> int:
    return sum(max(lengths[i] for i in b) * len(b) for b in batches)


def run_extraction(
    shards: ShardsInput,
    out_dir: str | Path,
    meta: StoreMeta,
    compute: BatchFn,
    *,
    group: Sequence[str] | None = None,
    max_tokens_per_batch: int = 16384,
    progress: Callable[[Progress], None] | None = None,
    check_space: bool = True,
    reserve_bytes: int = 0,
) -> ExtractReport:
    """Compute and store the ``group`` features (default: all of ``meta.features``) of every shard. Finished shards
    are skipped; an exception removes the shard in progress and propagates, and a rerun resumes from there."""
    group = tuple(group or meta.features)
    if any(f not in meta.features for f in group):
        raise ValueError(f"group {group} not among the store's features {meta.features}")
    items = normalize_shards(shards)
    writer = StoreWriter(out_dir, meta)
    tokens_total = sum(len(s) for _, ss in items for s in ss)
    pending = _resume(writer, items, group)
    skipped = len(items) - len(pending)
    if check_space and pending:
        _check_space(writer, group, [items[i][1] for i in pending], reserve_bytes)

    start = time.perf_counter()
    todo = set(pending)
    tokens_done = sum(len(s) for i, (_, ss) in enumerate(items) if i not in todo for s in ss)
    computed_tokens = 0
    shards_done = skipped

    def report(event: str, shard_index: int) -> None:
        if progress is not None:
            elapsed = time.perf_counter() - start
            rate = computed_tokens / elapsed if elapsed > 0 else 0.0
            progress(Progress(event, tokens_done, tokens_total, rate, shards_done, shard_index))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hs-writer") as pool:
        for idx in pending:
            key, samples = items[idx]

            def batch_done(n: int, idx: int = idx) -> None:
                nonlocal tokens_done, computed_tokens
                tokens_done += n
                computed_tokens += n
                report("batch", idx)

            shard_writer = writer.open_shard(idx, key, group, samples)
            _stream_shard(shard_writer, samples, group, compute, pool, max_tokens_per_batch, batch_done)
            writer.record(idx, key, group, samples)
            shards_done += 1
            report("shard", idx)

    return ExtractReport(skipped, len(pending), computed_tokens, time.perf_counter() - start)


def _resume(
    writer: StoreWriter, items: Sequence[tuple[str, list[HiddenStateSample]]], group: Sequence[str]
) -> list[int]:
    """Indices of the shards still to compute. A complete file is kept (and recorded, if a crash came between its
    rename and the index update); anything else of the shard is discarded."""
    features = writer.meta.features
    pending: list[int] = []
    recorded = _recorded_files(writer)
    recorded_names = {name for name, _ in recorded}
    for idx, (key, samples) in enumerate(items):
        name = shard_file_name(idx, group, features)
        if writer.is_complete(idx, key, group, samples):
            if (name, input_fingerprint(samples)) not in recorded:
                writer.record(idx, key, group, samples)
        else:
            writer.discard(idx, group, listed=name in recorded_names)
            pending.append(idx)
    return pending


def _check_space(
    writer: StoreWriter, group: Sequence[str], shards: Sequence[Sequence[HiddenStateSample]], reserve_bytes: int
) -> None:
    meta = writer.meta
    need = estimate_store_bytes(
        sum(len(s) for samples in shards for s in samples),
        meta.hidden_size,
        n_aux=meta.layers.n_aux if "aux" in group else 0,
        with_last="last" in group,
        dtype_bytes=torch.empty((), dtype=meta.dtype).element_size(),
    )
    check_disk(writer.directory, need, reserve_bytes=reserve_bytes)


def _stream_shard(
    shard_writer: ShardWriter,
    samples: Sequence[HiddenStateSample],
    group: Sequence[str],
    compute: BatchFn,
    pool: ThreadPoolExecutor,
    max_tokens_per_batch: int,
    batch_done: Callable[[int], None],
) -> None:
    """Compute one shard batch by batch and commit its file, removed on any error. ``pool``'s one thread writes
    while the next batch computes (pwrite releases the GIL), two batches at most in flight to bound host memory."""
    inflight: list[Future[None]] = []
    try:
        lengths = [len(s) for s in samples]
        for batch in plan_batches(lengths, max_tokens_per_batch):
            feats = compute([samples[i] for i in batch])
            if len(feats) != len(batch):
                raise RuntimeError(f"backend returned {len(feats)} feature sets for a batch of {len(batch)}")
            picked = [{f: fe[f] for f in group} for fe in feats]
            while len(inflight) >= 2:
                inflight.pop(0).result()
            inflight.append(pool.submit(_write_batch, shard_writer, batch, picked))
            batch_done(sum(lengths[i] for i in batch))
        for fut in inflight:
            fut.result()
        inflight.clear()
        shard_writer.commit()
    except BaseException:
        for fut in inflight:
            fut.cancel()
        for fut in inflight:
            if not fut.cancelled():
                with contextlib.suppress(Exception):  # the original error is what matters
                    fut.result()
        shard_writer.abort()
        raise


def _write_batch(shard_writer: Any, batch: Sequence[int], feats: Sequence[Mapping[str, torch.Tensor]]) -> None:
    for j, fe in zip(batch, feats, strict=True):
        shard_writer.write(j, fe)


def _recorded_files(writer: StoreWriter) -> set[tuple[str, str]]:
    """(file name, input fingerprint) pairs the index already lists, so skipping does not rewrite it."""
    doc = json.loads((writer.directory / INDEX_NAME).read_text())
    return {
        (name, entry.get("input_fingerprint", ""))
        for entry in doc.get("shards", {}).values()
        for name in entry.get("files", {})
    }
