"""How many bytes a store will take, and whether the disk holding it has them."""

from __future__ import annotations

import shutil
from pathlib import Path

from eagle_assets.hidden_states.store_format import GiB, InsufficientDiskError


def estimate_store_bytes(
    n_tokens: int, hidden: int, n_aux: int = 3, with_last: bool = True, dtype_bytes: int = 2
) -> int:
    """Bytes the shard files will take for ``n_tokens`` tokens: exact for the tensor data (offsets, 8 B a sample,
    and a header of a few KiB a shard not included). Kimi K2.5 (H = 7168, bf16): 57,349 B/token, 3.44 TB for 60M."""
    per_token = (n_aux + int(with_last)) * hidden * dtype_bytes + 4 + 1
    return int(n_tokens) * per_token


def check_disk(path: str | Path, bytes_needed: int, *, reserve_bytes: int = 0) -> int:
    """Raise ``InsufficientDiskError`` unless the filesystem holding ``path`` (or its nearest existing ancestor) has
    room, with ``reserve_bytes`` still free after the write (logs, checkpoints, other jobs); return free bytes."""
    p = Path(path).expanduser().absolute()
    where = next(q for q in (p, *p.parents) if q.exists())
    free = shutil.disk_usage(where).free
    if bytes_needed + reserve_bytes > free:
        raise InsufficientDiskError(
            f"not enough disk for hidden states at {path}: need {bytes_needed / GiB:.2f} GiB"
            + (f" + {reserve_bytes / GiB:.2f} GiB reserve" if reserve_bytes else "")
            + f", only {free / GiB:.2f} GiB free on the filesystem of {where}. "
            "Free space, point the store elsewhere, shrink the corpus, or use online features."
        )
    return free
