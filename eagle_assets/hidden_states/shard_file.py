"""One shard file of a store: its byte layout, its streaming writer, and the structural check of a file on disk.

Every sample's length is known before its features are, so the header (every row's byte offset) is written first
and features are ``pwrite``-n into place as batches finish, in any order: a shard never has to fit in RAM (at 56
KiB/token, a 2,000-sample Kimi K2.5 shard is ~200 GB). A shard is written to a temporary, fsync-ed and renamed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import struct
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch

from eagle_assets.durable_files import durable_replace, host_tag
from eagle_assets.hidden_states.samples import HiddenStateSample
from eagle_assets.hidden_states.store_format import GiB, InsufficientDiskError, StoreError, StoreMeta

_ST_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.uint8: "U8",
}


@dataclass(frozen=True)
class _TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


class ShardLayout:
    """Byte layout of a shard file, computable before any feature exists."""

    def __init__(self, meta: StoreMeta, group: Sequence[str], lengths: Sequence[int], metadata: Mapping[str, str]):
        self.group = tuple(group)
        self.lengths = [int(n) for n in lengths]
        self.n_tokens = sum(self.lengths)
        self.sample_offsets = list(accumulate(self.lengths, initial=0))
        t = self.n_tokens
        # Widest element first keeps every tensor naturally aligned in the data buffer.
        specs = [
            _TensorSpec("sample_offsets", torch.int64, (len(self.lengths) + 1,)),
            _TensorSpec("input_ids", torch.int32, (t,)),
        ]
        specs += [_TensorSpec(f, meta.dtype, (t, meta.width(f))) for f in self.group]
        specs.append(_TensorSpec("loss_mask", torch.uint8, (t,)))
        self.specs = {s.name: s for s in specs}
        header: dict[str, Any] = {"__metadata__": dict(metadata)}
        pos = 0
        self.data_offsets: dict[str, int] = {}
        for s in specs:
            header[s.name] = {
                "dtype": _ST_DTYPES[s.dtype],
                "shape": list(s.shape),
                "data_offsets": [pos, pos + s.nbytes],
            }
            self.data_offsets[s.name] = pos
            pos += s.nbytes
        self.data_bytes = pos
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.header = struct.pack("<Q", len(raw)) + raw
        self.file_bytes = len(self.header) + self.data_bytes

    def row_offset(self, feature: str, token: int) -> int:
        spec = self.specs[feature]
        row_bytes = spec.nbytes // max(spec.shape[0], 1)
        return len(self.header) + self.data_offsets[feature] + token * row_bytes


def swept_tmp_name(name: str) -> str:
    """A temporary named by host and pid, so that ``store_writer.remove_stale_temporaries`` sweeps a dead one's."""
    return f"{name}.tmp-{host_tag()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).numpy().data.cast("B") if t.numel() else memoryview(b"")  # .data: its buffer


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


class ShardWriter:
    """Streams one shard file into place: header first, feature rows as they arrive, then rename."""

    def __init__(
        self,
        directory: Path,
        file_name: str,
        meta: StoreMeta,
        group: Sequence[str],
        samples: Sequence[HiddenStateSample],
        metadata: Mapping[str, str],
    ):
        self.meta = meta
        self.final = directory / file_name
        self.tmp = directory / swept_tmp_name(file_name)
        self.layout = ShardLayout(meta, group, [len(s) for s in samples], metadata)
        self._pending = {f: set(range(len(samples))) for f in self.layout.group}
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._reserve(self.layout.file_bytes)
            _pwrite_all(self._fd, memoryview(self.layout.header), 0)
            base = len(self.layout.header)
            ids = torch.tensor([i for s in samples for i in s.input_ids], dtype=torch.int64)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) > 2**31 - 1):
                raise ValueError("token ids must fit in int32")
            mask = torch.tensor([int(m) for s in samples for m in s.loss_mask], dtype=torch.uint8)
            for name, tensor in (
                ("sample_offsets", torch.tensor(self.layout.sample_offsets, dtype=torch.int64)),
                ("input_ids", ids.to(torch.int32)),
                ("loss_mask", mask),
            ):
                _pwrite_all(self._fd, _tensor_bytes(tensor), base + self.layout.data_offsets[name])
        except BaseException:
            self.abort()
            raise

    def _reserve(self, nbytes: int) -> None:
        # Reserving the whole file up front turns "disk full" into an immediate, clear error instead
        # of a failure hours into the shard.
        try:
            os.posix_fallocate(self._fd, 0, nbytes)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                self.abort()
                free = shutil.disk_usage(self.final.parent).free
                raise InsufficientDiskError(
                    f"not enough disk for shard {self.final.name}: need {nbytes / GiB:.2f} GiB, "
                    f"{free / GiB:.2f} GiB free"
                ) from exc
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            os.ftruncate(self._fd, nbytes)  # filesystems without fallocate support

    def write(self, index: int, features: Mapping[str, torch.Tensor]) -> None:
        """Write sample ``index``'s rows; ``features`` maps each feature of the group to [len, width]."""
        length = self.layout.lengths[index]
        start = self.layout.sample_offsets[index]
        for name in self.layout.group:
            t = features[name]
            width = self.meta.width(name)
            if tuple(t.shape) != (length, width):
                raise ValueError(f"{name} of sample {index}: shape {tuple(t.shape)}, expected {(length, width)}")
            _pwrite_all(self._fd, _tensor_bytes(t.to(self.meta.dtype)), self.layout.row_offset(name, start))
            self._pending[name].discard(index)

    @property
    def missing(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def commit(self) -> int:
        """fsync + rename into place; returns the file size."""
        if self.missing:
            raise StoreError(f"{self.final.name}: {self.missing} sample feature blocks were never written")
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        durable_replace(self.tmp, self.final)
        return self.layout.file_bytes

    def abort(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


def read_shard_header(path: Path) -> dict[str, Any] | None:
    """The parsed header if ``path`` is a whole safetensors file (header parses, tensors tile the data exactly, the
    size is what the header says: a truncated or partially copied file is not), else ``None``."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100 * 1024 * 1024):
                return None
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    ends = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            return None
        ends.append((begin, end))
    ends.sort()
    pos = 0
    for begin, end in ends:
        if begin != pos or end < begin:
            return None
        pos = end
    if size != 8 + n + pos:
        return None
    return header
