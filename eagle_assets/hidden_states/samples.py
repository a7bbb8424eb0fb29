"""The extractor's input rows (exact target token ids and the assistant mask) and their fingerprint."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class HiddenStateSample:
    """One training row as the extractor sees it: exact target token ids and the assistant mask."""

    sample_id: str
    input_ids: Sequence[int]
    loss_mask: Sequence[int]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"sample {self.sample_id}: {len(self.input_ids)} input ids but {len(self.loss_mask)} mask entries"
            )
        if len(self.input_ids) == 0:
            raise ValueError(f"sample {self.sample_id} has no tokens")

    def __len__(self) -> int:
        return len(self.input_ids)


def as_sample(obj: HiddenStateSample | Mapping[str, Any]) -> HiddenStateSample:
    """Accept rows from the tokenization stage (``sample_id``/``id``, ``input_ids``, ``loss_mask``)."""
    if isinstance(obj, HiddenStateSample):
        return obj
    sid = obj.get("sample_id", obj.get("id"))
    if sid is None:
        raise ValueError("a sample needs a 'sample_id' (or 'id')")
    ids = obj["input_ids"]
    mask = obj["loss_mask"]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    mask = mask.tolist() if hasattr(mask, "tolist") else list(mask)
    return HiddenStateSample(str(sid), ids, mask)


def input_fingerprint(samples: Sequence[HiddenStateSample]) -> str:
    """Identifies a corpus shard's exact inputs, so a stale shard (corpus changed) is recomputed."""
    h = hashlib.blake2b(digest_size=16)
    for s in samples:
        h.update(s.sample_id.encode())
        h.update(b"\0")
        h.update(np.asarray(s.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(s.loss_mask, dtype=np.uint8).tobytes())
    return h.hexdigest()
