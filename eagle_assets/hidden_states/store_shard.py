"""One shard of a store as the fidelity checks read it: its files, whether they are whole, rows on demand."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle_assets.hidden_states.shard_file import read_shard_header
from eagle_assets.hidden_states.store_format import INDEX_NAME, StoreMeta


def describe_damage(path: Path) -> str | None:
    """None for a whole safetensors file, else what is wrong with it, with its bytes."""
    if not path.is_file():
        return f"{path.name} is missing"
    if read_shard_header(path) is not None:
        return None
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return f"{path.name} is damaged: its safetensors header cannot be read ({size:,} bytes on disk)"
    return f"{path.name} is truncated: {size:,} bytes on disk, its header describes {8 + n + end:,}"


@dataclass
class StoreShard:
    """One shard entry of a store's ``index.json``: its files, offsets, ids and mask, rows read on demand."""

    directory: Path
    name: str
    entry: dict[str, Any]
    meta: StoreMeta
    files: dict[str, Path] = field(default_factory=dict)  # feature → file
    _handles: dict[Path, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for fname, info in self.entry.get("files", {}).items():
            for feature in info["features"]:
                self.files[feature] = self.directory / fname

    def damage(self) -> list[str]:
        missing = [f for f in self.meta.features if f not in self.files]
        out = [f"no file holds feature {f!r} (index lists {sorted(self.files)})" for f in missing]
        for path in sorted(set(self.files.values())):
            why = describe_damage(path)
            if why:
                out.append(why)
        return out

    def _handle(self, path: Path) -> Any:
        if path not in self._handles:
            from safetensors import safe_open

            self._handles[path] = safe_open(str(path), framework="pt")
        return self._handles[path]

    def header(self, feature: str) -> dict[str, Any]:
        header = read_shard_header(self.files[feature])
        assert header is not None
        return header

    def tensor(self, name: str) -> torch.Tensor:
        """A small tensor of the first file (input_ids, loss_mask, sample_offsets)."""
        return self._handle(self.files["aux"]).get_tensor(name)

    def rows(self, feature: str, rows: Sequence[int]) -> torch.Tensor:
        """The given rows of a feature, in the given order, as float32 (one read per contiguous run)."""
        if not len(rows):
            return torch.empty(0, self.meta.width(feature))
        sl = self._handle(self.files[feature]).get_slice(feature)
        order = np.argsort(np.asarray(rows), kind="stable")
        sorted_rows = np.asarray(rows)[order]
        parts, start = [], 0
        for k in range(1, len(sorted_rows) + 1):
            if k == len(sorted_rows) or sorted_rows[k] != sorted_rows[k - 1] + 1:
                lo, hi = int(sorted_rows[start]), int(sorted_rows[k - 1]) + 1
                parts.append(sl[lo:hi].to(torch.float32))
                start = k
        out = torch.empty(len(rows), parts[0].shape[1])
        out[torch.as_tensor(order)] = torch.cat(parts)
        return out

    def close(self) -> None:
        self._handles.clear()


def open_store_shards(store_dir: str | Path) -> tuple[StoreMeta, list[StoreShard]]:
    directory = Path(store_dir)
    doc = json.loads((directory / INDEX_NAME).read_text())
    meta = StoreMeta.from_index(doc)
    shards = [StoreShard(directory, name, entry, meta) for name, entry in sorted(doc.get("shards", {}).items())]
    return meta, shards


def rows_at(shard: StoreShard, offsets: Sequence[int], positions: Sequence[tuple[int, int]], shift: int = 0):
    return [offsets[i] + t + shift for i, t in positions]
