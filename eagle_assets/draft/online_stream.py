"""Online features: the target computes each batch's aux and last states while the draft trains, nothing stored.

What the mode is for and guarantees: docs/draft-and-benchmark.md, "Offline or online features". The stream decides
only which rows are computed (the trainer's own order, ``Trainer.micro_batch_rows``, from wherever it stands), how
far ahead (one thread, a queue of ``depth`` that blocks when the trainer is that far behind), and what runs before
the first optimizer step (``gate`` sees enough first rows for the calibration; a gate that raises stops the run).
The per-batch function (``RowFeatures``) is bound to a backend outside this package
(``eagle_assets.hidden_states.online_features``); features are cast to float32 as ``StoreDataset`` casts a store's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eagle_assets.draft.data import Row, RowDataset, collate

Position = tuple[int, int]  # (epoch, batch index)
RowFeatures = Callable[[Sequence[Row], Sequence[int]], Sequence[Mapping[str, torch.Tensor]]]
Plan = Callable[[int, int], list[list[int]]]  # (epoch, batch index) -> dataset rows of each micro-batch


@dataclass
class Prefetched:
    """One global batch's share of this rank: its rows, the collated micro-batches with features, the cost."""

    position: Position
    rows: list[list[int]]
    batches: list[Row]
    tokens: int
    seconds: float  # the per-batch function's wall time (the target's)


@dataclass
class StreamStats:
    tokens: int = 0  # tokens the target computed features for
    seconds: float = 0.0  # wall time inside the per-batch function
    batches: int = 0
    waited_s: float = 0.0  # time the trainer waited for features (the target was the bottleneck)
    gate_batches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # what the gate reports (figures of its checks)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class OnlineFeatureStream:
    """Features of the trainer's batches, produced ahead by one thread (``depth`` batches at most)."""

    def __init__(
        self,
        dataset: RowDataset,
        compute: RowFeatures,
        *,
        depth: int = 2,
        gate: Callable[[Sequence[Prefetched]], dict[str, Any] | None] | None = None,
        gate_rows: int = 4,
    ):
        if depth < 1:
            raise ValueError("depth must be at least 1 (one batch ahead)")
        self.dataset, self.compute, self.depth, self.gate, self.gate_rows = dataset, compute, depth, gate, gate_rows
        self.stats = StreamStats()
        self._queue: queue.Queue[Prefetched | BaseException] = queue.Queue(maxsize=depth)
        self._ready: list[Prefetched] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next: Position | None = None  # the position the next take must ask for
        self._gated = False
        self.last: Prefetched | None = None  # what the trainer took last (its rows, for a record of consumption)
        self.row: Callable[[int], Row] = lambda i: dict(dataset[i])  # the Trainer sets its own (truncation)

    # ------------------------------------------------------------------ producing

    def produce(self, plan: Plan, position: Position) -> Prefetched:
        """One position's features through the per-batch function (any thread)."""
        rows = plan(*position)
        started = time.perf_counter()
        batches, tokens = [], 0
        for indices in rows:
            samples = [self.row(i) for i in indices]
            feats = self.compute(samples, indices)
            if len(feats) != len(samples):
                raise RuntimeError(f"the per-batch function returned {len(feats)} feature sets for {len(samples)} rows")
            with_features = []
            for sample, f in zip(samples, feats, strict=True):
                n = int(sample["input_ids"].numel())
                for key in ("aux", "last"):
                    if f[key].shape[0] != n:
                        raise RuntimeError(f"{key} has {f[key].shape[0]} rows for a row of {n} tokens")
                with_features.append({**sample, "aux": f["aux"].float(), "last": f["last"].float()})
                tokens += n
            batches.append(collate(with_features))
        seconds = time.perf_counter() - started
        return Prefetched(position, rows, batches, tokens, seconds)

    def _count(self, item: Prefetched) -> None:
        self.stats.tokens += item.tokens
        self.stats.seconds += item.seconds
        self.stats.batches += 1

    def _run(self, plan: Plan, positions: Iterator[Position]) -> None:
        try:
            for position in positions:
                if self._stop.is_set():
                    return
                if not self._put(self.produce(plan, position)):
                    return
        except BaseException as exc:  # the trainer re-raises it at its next take
            self._put(exc)

    def _put(self, item: Prefetched | BaseException) -> bool:
        """Queue ``item`` once there is room; False when the stream was closed while waiting (nobody will take it)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    # ------------------------------------------------------------------ consuming

    def start(self, plan: Plan, first: Position, remaining: int, steps_per_epoch: int) -> None:
        """(Re)start at ``first``: the gate's positions are computed here and checked, the rest by the thread."""
        self.close()
        positions = positions_from(first, remaining, steps_per_epoch)
        if self.gate is not None and not self._gated:
            rows = 0
            while rows < self.gate_rows:
                position = next(positions, None)
                if position is None:
                    break
                item = self.produce(plan, position)
                self._ready.append(item)
                rows += sum(len(r) for r in item.rows)
            report = self.gate(self._ready)  # raises: the run stops before its first optimizer step
            self._gated = True
            self.stats.gate_batches = len(self._ready)
            self.stats.extra.update(report or {})
            for item in self._ready:
                self._count(item)
        self._stop.clear()
        self._queue = queue.Queue(maxsize=self.depth)
        self._next = first
        self._thread = threading.Thread(target=self._run, args=(plan, positions), name="online-features", daemon=True)
        self._thread.start()

    def take(self, plan: Plan, first: Position, remaining: int, steps_per_epoch: int) -> Prefetched:
        """The features of the trainer's position ``first`` (``remaining`` steps left), waiting for them if needed."""
        if remaining < 1:
            raise ValueError("no position left to train")
        if self._next != first:  # the first take, or the trainer moved (a resume): start there
            self.start(plan, first, remaining, steps_per_epoch)
        if self._ready:
            item = self._ready.pop(0)
        else:
            t0 = time.perf_counter()
            got = self._queue.get()
            self.stats.waited_s += time.perf_counter() - t0
            if isinstance(got, BaseException):
                self.close()
                raise got
            item = got
            self._count(item)
        if item.position != first:
            raise RuntimeError(f"online stream out of step: features of {item.position}, the trainer is at {first}")
        self._next = next_position(first, steps_per_epoch)
        self.last = item
        return item

    def close(self) -> None:
        """Stop the producer (it finishes the batch in hand) and drop what it had queued."""
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None
        self._next = None
        self._ready = []


def next_position(position: Position, steps_per_epoch: int) -> Position:
    epoch, index = position
    return (epoch + 1, 0) if index + 1 >= steps_per_epoch else (epoch, index + 1)


def positions_from(first: Position, count: int, steps_per_epoch: int) -> Iterator[Position]:
    """``count`` positions from ``first`` in the trainer's order (lazily: a long run has millions)."""
    position = first
    for _ in range(count):
        yield position
        position = next_position(position, steps_per_epoch)
