"""Several hidden-state stores read as one: one store per corpus shard, concatenated in shard order.

Each hidden-state partition writes a store of its own, so partitions never share an index file
(they may run on different hosts or at the same time) and a re-merged corpus cannot leave stale
shards inside a store that training would pick up: training names exactly the partitions it wants.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eagle_assets.hidden_states.store import HiddenStateStore, locate, starts_of
from eagle_assets.hidden_states.store_format import StoreError


class StoreSet:
    """``len``/``[i]`` over the samples of ``root/<partition>`` stores, in the order given."""

    def __init__(self, root: str | Path, *, partitions: Sequence[str], dtype: torch.dtype | None = None):
        if not partitions:
            raise StoreError(f"no partitions named under {root}")
        self.root = Path(root)
        self.partitions = list(partitions)
        self.stores = [HiddenStateStore(self.root / p, dtype=dtype) for p in self.partitions]
        first = self.stores[0].meta
        for p, s in zip(self.partitions, self.stores, strict=True):
            m = s.meta
            if (m.model_id, m.layers, m.hidden_size) != (first.model_id, first.layers, first.hidden_size):
                raise StoreError(
                    f"store {p} was extracted from {m.model_id} layers {m.layers.hf_indices}, "
                    f"{self.partitions[0]} from {first.model_id} layers {first.layers.hf_indices}: re-extract one"
                )
            if len(s) == 0:
                raise StoreError(f"store {self.root / p} has no complete shard")
        self.meta = first
        self._starts, self._len = starts_of([len(s) for s in self.stores])

    def __len__(self) -> int:
        return self._len

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.stores)

    def fingerprints(self) -> dict[str, str]:
        """What each partition's store was computed from (its corpus shard's exact inputs)."""
        return {
            p: ",".join(e["input_fingerprint"] for e in s.shard_entries)
            for p, s in zip(self.partitions, self.stores, strict=True)
        }

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, j = locate(self._starts, self._len, int(i))
        return self.stores[k][j]
