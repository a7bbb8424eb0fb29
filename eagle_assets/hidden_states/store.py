"""The reader of a hidden-state store (``HiddenStateStore``); what a store is: ``store_format.py``."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

from eagle_assets.hidden_states.layers import AuxLayers
from eagle_assets.hidden_states.store_format import INDEX_NAME, StoreError, StoreMeta


def starts_of(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Where each of consecutive parts of ``sizes`` starts, and their total."""
    return list(accumulate(sizes, initial=0))[:-1], sum(sizes)


def locate(starts: Sequence[int], total: int, i: int) -> tuple[int, int]:
    """(part, index within it) of item ``i`` (negative: from the end) of the parts starting at ``starts``."""
    if i < 0:
        i += total
    if not 0 <= i < total:
        raise IndexError(f"sample {i} out of range for {total} samples")
    k = bisect_right(starts, i) - 1
    return k, i - starts[k]


class HiddenStateStore:
    """Random access to a store's samples, in corpus order: ``store[i]`` is ``{"input_ids", "loss_mask", "aux",
    "last"}`` read from memory-mapped shard files (a multi-TB store costs what is read), in the store dtype or
    ``dtype``. Only complete shards (every feature present) are visible."""

    def __init__(self, directory: str | Path, *, dtype: torch.dtype | None = None):
        self.directory = Path(directory).expanduser().absolute()
        p = self.directory / INDEX_NAME
        if not p.exists():
            raise StoreError(f"no {INDEX_NAME} in {self.directory}: not a hidden-state store (or nothing written yet)")
        self.index: dict[str, Any] = json.loads(p.read_text())
        self.meta = StoreMeta.from_index(self.index)
        self.dtype = dtype
        self._shards: list[dict[str, Any]] = [e for _, e in sorted(self.index["shards"].items()) if e.get("complete")]
        self._starts, self._len = starts_of([e["n_samples"] for e in self._shards])
        self._handles: dict[str, Any] = {}

    @property
    def layers(self) -> AuxLayers:
        return self.meta.layers

    @property
    def hidden_size(self) -> int:
        return self.meta.hidden_size

    @property
    def n_tokens(self) -> int:
        return sum(e["n_tokens"] for e in self._shards)

    @property
    def shard_entries(self) -> list[dict[str, Any]]:
        return list(self._shards)

    def __len__(self) -> int:
        return self._len

    def _handle(self, name: str) -> Any:
        h = self._handles.get(name)
        if h is None:
            from safetensors import safe_open

            h = safe_open(str(self.directory / name), framework="pt")
            self._handles[name] = h
        return h

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        k, j = locate(self._starts, self._len, int(i))
        entry = self._shards[k]
        start = entry["offsets"][j]
        end = start + entry["lengths"][j]
        out: dict[str, torch.Tensor] = {}
        for name, info in entry["files"].items():
            h = self._handle(name)
            if "input_ids" not in out:
                out["input_ids"] = h.get_slice("input_ids")[start:end].to(torch.int64)
                out["loss_mask"] = h.get_slice("loss_mask")[start:end].to(torch.bool)
            for feature in info["features"]:
                t = h.get_slice(feature)[start:end]
                # Always a fresh, aligned copy: a slice of the memory map can start at any byte, and
                # BLAS kernels pick different (differently rounded) code paths for unaligned inputs,
                # which would make recomputed logits differ from the target's in the last bits.
                out[feature] = t.to(self.dtype or t.dtype, copy=True)
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(self._len):
            yield self[i]

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> HiddenStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
